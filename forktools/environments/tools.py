"""Command-line tools the tooling installs for itself, pinned, in the cache."""

from __future__ import annotations

import hashlib
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from forktools.environments import lockfiles, venv
from forktools.queue import download, file_locks, pins
from forktools.queue.pins import ForkError

RUFF = "ruff==0.14.0"  # our own code's, as in our .pre-commit-config.yaml
UV = "uv==0.13.9"
# Holds the layering of forktools/ (pyproject.toml, [tool.importlinter]).
IMPORT_LINTER = "import-linter==2.16"
PYYAML = "pyyaml==6.0.3"
# Spreads the tooling's tests over the CPUs; pure Python, loaded beside the
# caller's own pytest.
XDIST = ("pytest-xdist==3.8.0", "execnet==2.1.2")
# pyproject.toml's build requirements on this Python, as pinned there: the
# tooling's tests install the project from their lock.
BUILD = ("setuptools==84.2.1", "pip==26.3", "packaging==26.4")
COMPLETE = ".vllm-fork-complete"


def installed(requirement: str, with_packages: tuple[str, ...] = ()) -> Path:
    """The executable of ``requirement`` (``name==version``), installed once
    with ``with_packages`` into a private virtual environment through pip."""
    name = re.split(r"[\[=<>!~ ;]", requirement, maxsplit=1)[0]
    path = _folder(environment_name(requirement, with_packages))
    if not with_packages and (path / "bin" / name).exists():
        return path / "bin" / name  # installed before environments were marked
    return environment(requirement, with_packages) / "bin" / name


def python(requirement: str, with_packages: tuple[str, ...] = ()) -> Path:
    """The interpreter of the environment that ``installed`` makes; with an
    empty ``requirement``, of one that holds ``with_packages`` alone."""
    return environment(requirement, with_packages) / "bin" / "python"


def environment(requirement: str, with_packages: tuple[str, ...] = ()) -> Path:
    name = environment_name(requirement, with_packages)
    path = _folder(name)
    requirements = [r for r in (requirement, *with_packages) if r]
    return _once(path, requirement, lambda: _install(path, name, requirements))


def _folder(name: str) -> Path:
    """The cache folder of the tool environment ``name``: one per lock."""
    lock = lock_path(name)
    if not lock.exists():
        return download.cache_dir() / "tools" / name
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()[:10]
    return download.cache_dir() / "tools" / f"{name}@{digest}"


def _once(path: Path, what: str, install: Callable[[], None]) -> Path:
    """``path``, made by ``install`` (which marks it complete) unless a run
    before this one did; one run at a time installs it."""
    if (path / COMPLETE).exists():
        return path
    lock = download.lock_file(f"tool-{path.name}")
    with file_locks.held(lock, f"to install {what}"):
        if not (path / COMPLETE).exists():
            install()
    return path


def packages_name(requirements: tuple[str, ...]) -> str:
    """The name of the folder ``packages`` fills (and of its lock)."""
    return "+".join(environment_name(requirement) for requirement in requirements)


def environment_name(requirement: str, with_packages: tuple[str, ...] = ()) -> str:
    """The name of the environment ``environment`` makes, and of its lock."""
    name = re.sub(r"[^\w.]+", "-", requirement.replace("==", "-")) or "python"
    if not with_packages:
        return name
    digest = hashlib.sha256("\n".join(sorted(with_packages)).encode()).hexdigest()
    return f"{name}+{digest[:10]}"


def lock_path(name: str) -> Path:
    """Where ``make lock`` keeps the lock of the tool environment ``name``."""
    return pins.ROOT / "locks" / "tools" / f"{name}.txt"


def _locked(name: str, requirements: list[str] | tuple[str, ...]) -> list[str]:
    """pip's arguments for ``requirements``: the tool's lock, hash-checked and
    without dependencies. Nothing is installed from the index unlocked."""
    lock = lock_path(name)
    if not lock.exists():
        raise ForkError(
            f"{' '.join(requirements)} has no lock ({lock.relative_to(pins.ROOT)}): "
            "`make lock` writes it; commit it with the change that needs the tool"
        )
    lockfiles.read_file(lock, platform.python_version())  # refuses another's
    return ["--require-hashes", "--no-deps", "-r", str(lock)]


def _install(path: Path, name: str, requirements: list[str]) -> None:
    shutil.rmtree(path, ignore_errors=True)
    venv.make_venv(path)
    install = [str(path / "bin" / "python"), "-m", "pip", "install", "-q"]
    if (
        requirements
        and subprocess.run([*install, *_locked(name, requirements)]).returncode != 0
    ):
        raise ForkError(
            f"could not install {' '.join(requirements)} into {path} (pip output "
            "above); check your package index settings and run the command again"
        )
    (path / COMPLETE).touch()


def packages(requirements: tuple[str, ...]) -> Path:
    """A folder holding ``requirements`` alone (no dependencies), installed
    once through pip, for ``PYTHONPATH``: for packages any Python 3 can load
    beside what it has."""
    name = packages_name(requirements)
    path = _folder(name)
    what = " ".join(requirements)
    return _once(path, what, lambda: _install_target(path, name, requirements))


def _install_target(path: Path, name: str, requirements: tuple[str, ...]) -> None:
    shutil.rmtree(path, ignore_errors=True)
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps"]
    done = subprocess.run(
        [*install, "--target", str(path), *_locked(name, requirements)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        shutil.rmtree(path, ignore_errors=True)
        said = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ForkError(
            f"could not install {' '.join(requirements)} ({said}); check "
            "your package index settings and run the command again"
        )
    (path / COMPLETE).touch()
