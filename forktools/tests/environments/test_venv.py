"""The CPU test environment: exact requirements unless a base excludes some."""

import contextlib
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from forktools.queue import download
from forktools.environments import tools, venv
from forktools.queue.pins import Exclusion, ForkError

from forktools.tests.conftest import BASE, THIS_PYTHON, _environment, tool_lock

EXCLUDED = Exclusion("numpy", "a GPU kernel package in this story")


LOCKED = "six==1.17.0 --hash=sha256:" + "0" * 64


def test_environment_installs_its_lock_with_hashes_then_the_wheel(project):
    python = Path("/venv/bin/python")
    lock, wheel = venv.install_commands(project.base, python, project.wheel)
    lock_path = str(project.lock("test"))
    assert lock[-4:] == ["--require-hashes", "--no-deps", "-r", lock_path]
    assert wheel[-2:] == ["--no-deps", str(project.wheel)]


def test_lock_is_resolved_from_the_wheel_less_its_exclusions(project):
    base = replace(project.base, cpu_test_exclude=(EXCLUDED,))
    required = venv.lock_requirements(base, "test")
    assert "numpy" not in required
    assert 'six>=1.16.0; python_version > "3.11"' in required
    assert venv.lock_requirements(project.base, "test")[0] == "numpy"


def test_exclusion_the_wheel_does_not_declare_is_refused(project):
    base = replace(project.base, cpu_test_exclude=(EXCLUDED,))
    with pytest.raises(ForkError, match="cpu-test-exclude names numpy"):
        venv.requirements_without(base, ["numpy==2.0"])


def test_environment_key_follows_the_lock(project):
    before = venv._key(project.base, project.wheel)
    changed = replace(project.base, test_requirements=("pytest==8.4.2",))
    assert venv._key(changed, project.wheel) == before  # the lock says what is in it
    project.lock("test", LOCKED)
    assert venv._key(project.base, project.wheel) != before


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
    tool_lock(tools.environment_name(tools.RUFF), tools.RUFF)
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
    # This run uses the environment of the old lock until it exits, as a
    # `make verify` that started before it moved would.
    in_use = venv.ensure(project.base).parent.parent
    project.lock("test", LOCKED)
    venv.ensure(project.base)
    assert len(builds) == 2
    assert (in_use / venv.COMPLETE_MARKER).exists()
    assert f"keeping stale environment {in_use}: a run is using it" in (
        capsys.readouterr().err
    )


def test_a_long_install_shows_progress_not_pips_log(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(venv, "PROGRESS_SECONDS", 0.2)
    lock = tmp_path / "lock.txt"
    lock.write_text("# a lock\na==1 \\\n    --hash=sha256:00\nb==2 \\\n    --hash=sha256:00\n")
    pip = (
        "import time\nfor name in 'ab':\n    print('Collecting', name, flush=True)\n"
        "    time.sleep(0.5)\nprint('Installing collected packages: a, b', flush=True)\n"
    )
    log = tmp_path / "install.log"
    command = [sys.executable, "-c", pip, "-r", str(lock)]
    returncode, output = venv._install(command, "v9 test environment", log)
    assert returncode == 0 and output.startswith("Collecting a\n")
    said = capfd.readouterr()
    assert "Collecting" not in said.out + said.err
    assert "vllm-fork: v9 test environment: collected 1/2 distributions, " in said.err
    assert log.read_text() == output
