"""The test-run harness, against stand-ins for the vLLM modules it wraps."""

import sys
import types

import pytest

from forktools.verify import HARNESS

sys.path.insert(0, str(HARNESS))
import vllm_c_op_stubs  # noqa: E402
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
