"""Command-line tools the tooling installs for itself, pinned, in the cache."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from forktools import download, locks, venv
from forktools.pins import ForkError

RUFF = "ruff==0.14.0"  # our own code's, as in our .pre-commit-config.yaml
UV = "uv==0.13.9"
PYYAML = "pyyaml==6.0.3"
# Spreads the tooling's tests over the CPUs; pure Python, loaded beside the
# caller's own pytest.
XDIST = ("pytest-xdist==3.8.0", "execnet==2.1.2")
COMPLETE = ".vllm-fork-complete"


def installed(requirement: str, with_packages: tuple[str, ...] = ()) -> Path:
    """The executable of ``requirement`` (``name==version``), installed once
    with ``with_packages`` into a private virtual environment through pip."""
    name = re.split(r"[\[=<>!~ ;]", requirement, maxsplit=1)[0]
    path = download.cache_dir() / "tools" / _env_name(requirement, with_packages)
    if not with_packages and (path / "bin" / name).exists():
        return path / "bin" / name  # installed before environments were marked
    return environment(requirement, with_packages) / "bin" / name


def python(requirement: str, with_packages: tuple[str, ...] = ()) -> Path:
    """The interpreter of the environment that ``installed`` makes; with an
    empty ``requirement``, of one that holds ``with_packages`` alone."""
    return environment(requirement, with_packages) / "bin" / "python"


def environment(requirement: str, with_packages: tuple[str, ...] = ()) -> Path:
    path = download.cache_dir() / "tools" / _env_name(requirement, with_packages)
    requirements = [r for r in (requirement, *with_packages) if r]
    return _once(path, requirement, lambda: _install(path, requirements))


def _once(path: Path, what: str, install: Callable[[], None]) -> Path:
    """``path``, made by ``install`` (which marks it complete) unless a run
    before this one did; one run at a time installs it."""
    if (path / COMPLETE).exists():
        return path
    lock = download.lock_file(f"tool-{path.name}")
    with locks.held(lock, f"to install {what}"):
        if not (path / COMPLETE).exists():
            install()
    return path


def _env_name(requirement: str, with_packages: tuple[str, ...]) -> str:
    name = re.sub(r"[^\w.]+", "-", requirement.replace("==", "-")) or "python"
    if not with_packages:
        return name
    digest = hashlib.sha256("\n".join(sorted(with_packages)).encode()).hexdigest()
    return f"{name}+{digest[:10]}"


def _install(path: Path, requirements: list[str]) -> None:
    shutil.rmtree(path, ignore_errors=True)
    venv.make_venv(path)
    install = [str(path / "bin" / "python"), "-m", "pip", "install", "-q"]
    if requirements and subprocess.run([*install, *requirements]).returncode != 0:
        raise ForkError(
            f"could not install {' '.join(requirements)} into {path} (pip output "
            "above); check your package index settings and run the command again"
        )
    (path / COMPLETE).touch()


def packages(requirements: tuple[str, ...]) -> Path:
    """A folder holding ``requirements`` alone (no dependencies), installed
    once through pip, for ``PYTHONPATH``: for packages any Python 3 can load
    beside what it has."""
    name = "+".join(_env_name(requirement, ()) for requirement in requirements)
    path = download.cache_dir() / "tools" / name
    what = " ".join(requirements)
    return _once(path, what, lambda: _install_target(path, requirements))


def _install_target(path: Path, requirements: tuple[str, ...]) -> None:
    shutil.rmtree(path, ignore_errors=True)
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps"]
    done = subprocess.run(
        [*install, "--target", str(path), *requirements],
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
