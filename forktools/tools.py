"""Command-line tools the tooling installs for itself, pinned, in the cache."""

from __future__ import annotations

import subprocess
from pathlib import Path

from forktools import download, locks, venv
from forktools.pins import ForkError

RUFF = "ruff==0.14.0"  # upstream's pre-commit pin on both bases
UV = "uv==0.13.9"


def installed(requirement: str) -> Path:
    """The executable of ``requirement`` (``name==version``), installed once
    into a private virtual environment through pip."""
    name = requirement.split("==")[0]
    path = download.cache_dir() / "tools" / requirement.replace("==", "-")
    executable = path / "bin" / name
    if executable.exists():
        return executable
    lock = download.lock_file(f"tool-{path.name}")
    with locks.held(lock, f"to install {requirement}"):
        if not executable.exists():
            _install(requirement, path)
    return executable


def _install(requirement: str, path: Path) -> None:
    venv.make_venv(path)
    install = [str(path / "bin" / "python"), "-m", "pip", "install", "-q"]
    if subprocess.run([*install, requirement]).returncode != 0:
        raise ForkError(
            f"could not install {requirement} into {path} (pip output above); "
            "check your package index settings and run the command again"
        )
