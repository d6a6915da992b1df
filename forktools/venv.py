"""One cached virtual environment per base, for running its tests on CPU.

Each holds the upstream wheel (so every requirement of the release is
present) plus the base's test requirements; the fork tree shadows the
installed ``vllm`` through PYTHONPATH when tests run. A base may name
requirements to leave out here, each with its reason (``cpu-test-exclude``
in ``upstream.toml``: GPU kernel packages the CPU tests never import, which
the package index may lack); the wheel is then installed without its
dependencies, and its requirements minus those are installed beside it.
GPU nodes (``pip install -e .``) always get the exact requirements. Environments live in
the cache, keyed by base and requirements, so that fresh clones reuse them.
Each is about 10 GB, so a stale one is removed: one of the same base, made by
the same Python (clones on other Pythons keep theirs), that no run is using
(runs hold a shared lock on the environment they use until they exit).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from forktools import download, locks, wheelmeta
from forktools.pins import Base, ForkError

COMPLETE_MARKER = ".vllm-fork-complete"
_in_use: dict[Path, locks.Lock] = {}  # held until this run exits


def _key(base: Base, wheel: Path) -> str:
    excluded = [f"exclude {e.requirement}" for e in base.cpu_test_exclude]
    spec = "\n".join(
        [base.name, wheel.name, sys.version, *base.test_requirements, *excluded]
    )
    return hashlib.sha256(spec.encode()).hexdigest()[:12]


def ensure(base: Base) -> Path:
    """The base's virtual environment, built if missing, and marked in use
    until this run exits. Returns its python."""
    wheel = download.fetch(base.wheel_for_this_machine())
    path = download.cache_dir() / "venvs" / f"{base.name}-{_key(base, wheel)}"
    if path not in _in_use:
        _in_use[path] = _use(base, path, wheel)
    return path / "bin" / "python"


def _use(base: Base, path: Path, wheel: Path) -> locks.Lock:
    """The environment's lock, held shared once ``path`` is complete."""
    lock = locks.Lock(lock_file(path), f"to build {path}")
    try:
        lock.shared()
        if not (path / COMPLETE_MARKER).exists():
            lock.exclusive()
            if not (path / COMPLETE_MARKER).exists():
                _remove_stale(path.parent, base, keep=path)
                _build(base, path, wheel)
            lock.shared()
    except BaseException:
        lock.close()
        raise
    return lock


def lock_file(env: Path) -> Path:
    """Shared by the runs that use ``env``; exclusive to its builder or remover."""
    return download.lock_file(f"venv-{env.name}")


def _build(base: Base, path: Path, wheel: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    print(
        f"vllm-fork: building the {base.name} test environment in {path}",
        file=sys.stderr,
        flush=True,
    )
    make_venv(path)
    commands = install_commands(base, path / "bin" / "python", wheel)
    for install in commands:
        if subprocess.run(install).returncode != 0:
            shutil.rmtree(path, ignore_errors=True)
            raise ForkError(
                f"{base.name}: installing the test environment failed (pip output "
                "above); nothing was kept. Fix the cause and run the command again."
            )
    (path / COMPLETE_MARKER).write_text("".join(" ".join(c) + "\n" for c in commands))


def make_venv(path: Path) -> None:
    if subprocess.run([sys.executable, "-m", "venv", str(path)]).returncode != 0:
        shutil.rmtree(path, ignore_errors=True)
        raise ForkError(
            f"`{sys.executable} -m venv {path}` failed (output above). On "
            "Debian and Ubuntu install python3-venv (for this Python: "
            f"python{sys.version_info.major}.{sys.version_info.minor}-venv), "
            "then run again."
        )


def install_commands(base: Base, python: Path, wheel: Path) -> list[list[str]]:
    """The pip commands that fill the environment."""
    pip = [str(python), "-m", "pip", "install", "--progress-bar", "off"]
    if not base.cpu_test_exclude:
        return [[*pip, str(wheel), *base.test_requirements]]
    kept = requirements_without(base, wheelmeta.read(wheel).install_requires)
    return [[*pip, *kept, *base.test_requirements], [*pip, "--no-deps", str(wheel)]]


def requirements_without(base: Base, requirements: list[str]) -> list[str]:
    """``requirements`` less the base's CPU test exclusions, each of which must
    be one of them exactly (so that a new pin gets looked at again)."""
    excluded = {e.requirement for e in base.cpu_test_exclude}
    unknown = excluded.difference(requirements)
    if unknown:
        raise ForkError(
            f"{base.name}: cpu-test-exclude names {', '.join(sorted(unknown))}, "
            "which the wheel does not require (as written); update upstream.toml"
        )
    return [r for r in requirements if r not in excluded]


def _remove_stale(root: Path, base: Base, keep: Path) -> None:
    for old in sorted(root.glob(f"{base.name}-*")):
        if old == keep or not _made_by_this_python(old):
            continue
        lock = locks.Lock(lock_file(old), "")
        try:
            if lock.exclusive_if_free():
                print(f"vllm-fork: removing stale environment {old}", file=sys.stderr)
                shutil.rmtree(old, ignore_errors=True)
            else:
                print(
                    f"vllm-fork: keeping stale environment {old}: a run is using it",
                    file=sys.stderr,
                )
        finally:
            lock.close()


def _made_by_this_python(env: Path) -> bool:
    """Whether ``env`` was made by this Python (an unfinished one, with no
    pyvenv.cfg, counts as anyone's)."""
    config = env / "pyvenv.cfg"
    if not config.exists():
        return True
    settings = dict(
        (part.strip() for part in line.split("=", 1))
        for line in config.read_text().splitlines()
        if "=" in line
    )
    version = settings.get("version") or settings.get("version_info")
    home = os.path.dirname(os.path.abspath(sys._base_executable))
    return version == platform.python_version() and settings.get("home") == home
