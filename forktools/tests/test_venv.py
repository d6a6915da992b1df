"""The CPU test environment: exact requirements unless a base excludes some."""

import contextlib
import sys
import threading
from dataclasses import replace
from hashlib import sha256
from pathlib import Path

import pytest

from forktools import download, tools, venv
from forktools.pins import Exclusion, ForkError

from .conftest import BASE, THIS_PYTHON, WHEEL_FILES, _environment, _wheel

EXCLUDED = Exclusion("numpy", "a GPU kernel package in this story")


def test_plain_base_installs_the_wheel_with_its_requirements(project):
    python = Path("/venv/bin/python")
    [command] = venv.install_commands(project.base, python, project.wheel)
    assert command[-1] == str(project.wheel)
    assert "--no-deps" not in command


def test_exclusion_installs_the_rest_and_the_wheel_without_deps(project):
    base = replace(project.base, cpu_test_exclude=(EXCLUDED,))
    deps, wheel = venv.install_commands(base, Path("/venv/bin/python"), project.wheel)
    assert "numpy" not in deps
    assert 'six>=1.16.0; python_version > "3.11"' in deps
    assert wheel[-2:] == ["--no-deps", str(project.wheel)]


def test_exclusion_the_wheel_does_not_declare_is_refused(project, tmp_path):
    metadata = next(name for name in WHEEL_FILES if name.endswith("METADATA"))
    wheel = tmp_path / project.wheel.name
    _wheel(wheel, {**WHEEL_FILES, metadata: "Requires-Dist: numpy==2.0\n"})
    base = replace(project.base, cpu_test_exclude=(EXCLUDED,))
    with pytest.raises(ForkError, match="cpu-test-exclude names numpy"):
        venv.install_commands(base, Path("/venv/bin/python"), wheel)


def test_key_of_a_base_without_exclusions_is_unchanged(project):
    # The key before exclusions existed: existing environments (about 10 GB
    # each) must keep it, or they would be rebuilt.
    base = replace(project.base, test_requirements=("pytest==8.4.2",))
    spec = "\n".join([base.name, project.wheel.name, sys.version, "pytest==8.4.2"])
    assert venv._key(base, project.wheel) == sha256(spec.encode()).hexdigest()[:12]
    excluded = replace(base, cpu_test_exclude=(EXCLUDED,))
    assert venv._key(excluded, project.wheel) != venv._key(base, project.wheel)


def _twice_at_once(function):
    """``function``'s results from two threads; daemon threads, so that a
    deadlock fails the test instead of hanging the run."""
    results: list = [None, None]

    def run(index: int) -> None:
        results[index] = function()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "the two runs deadlocked"
    return results


def test_two_runs_at_once_build_one_environment(project, builds):
    pythons = _twice_at_once(lambda: venv.ensure(project.base))
    assert pythons[0] == pythons[1]
    assert len(builds) == 1
    assert (builds[0] / venv.COMPLETE_MARKER).exists()


def test_a_run_that_waited_for_a_build_goes_on_while_the_builder_runs(
    project, builds, monkeypatch
):
    # Both runs find the environment missing before either builds it. The
    # builder then holds it in use until it exits; the other run must not
    # wait for that exit (nor, as here, two threads of one run deadlock).
    both_looked = threading.Barrier(2, timeout=2)
    exists = Path.exists

    def exists_once_both_looked(path: Path) -> bool:
        if path.name == venv.COMPLETE_MARKER:
            with contextlib.suppress(threading.BrokenBarrierError):
                both_looked.wait()
        return exists(path)

    monkeypatch.setattr(Path, "exists", exists_once_both_looked)
    pythons = _twice_at_once(lambda: venv.ensure(project.base))
    assert pythons[0] == pythons[1]
    assert len(builds) == 1


def test_two_runs_at_once_install_a_tool_once(project, builds):
    executables = _twice_at_once(lambda: tools.installed(tools.RUFF))
    assert executables[0] == executables[1] and executables[0].exists()
    assert len(builds) == 1


def test_only_stale_environments_of_this_python_are_removed(project, builds):
    root = download.cache_dir() / "venvs"
    mine = _environment(root / f"{BASE}-000000000001", *THIS_PYTHON)
    other_python = _environment(root / f"{BASE}-000000000002", "3.11.0", "/opt/py")
    other_base = _environment(root / "v1.0.0-000000000003", *THIS_PYTHON)
    venv.ensure(project.base)
    assert not mine.exists()
    assert other_python.exists() and other_base.exists()


def test_stale_environment_in_use_is_kept(project, builds, capsys):
    # This run uses the environment of the old requirements until it exits,
    # as a `make verify` that started before them would.
    before = replace(project.base, test_requirements=("pytest==8.4.2",))
    in_use = venv.ensure(before).parent.parent
    venv.ensure(project.base)
    assert len(builds) == 2
    assert (in_use / venv.COMPLETE_MARKER).exists()
    assert f"keeping stale environment {in_use}: a run is using it" in (
        capsys.readouterr().err
    )
