"""One cached virtual environment per base, for running its tests on CPU.

Each holds the upstream wheel (so every requirement of the release is
present) plus the base's test requirements; the fork tree shadows the
installed ``vllm`` through PYTHONPATH when tests run. Environments live in
the cache, keyed by base and requirements, so that fresh clones reuse them;
stale ones of the same base are removed, since each is about 10 GB.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from forktools import download
from forktools.pins import Base, ForkError

COMPLETE_MARKER = ".vllm-fork-complete"


def _key(base: Base, wheel: Path) -> str:
    spec = "\n".join([base.name, wheel.name, sys.version, *base.test_requirements])
    return hashlib.sha256(spec.encode()).hexdigest()[:12]


def ensure(base: Base) -> Path:
    """The base's virtual environment, built if missing. Returns its python."""
    wheel = download.fetch(base.wheel_for_this_machine())
    root = download.cache_dir() / "venvs"
    path = root / f"{base.name}-{_key(base, wheel)}"
    python = path / "bin" / "python"
    if (path / COMPLETE_MARKER).exists():
        return python
    _remove_stale(root, base, keep=path)
    shutil.rmtree(path, ignore_errors=True)
    print(
        f"vllm-fork: building the {base.name} test environment in {path}",
        file=sys.stderr,
        flush=True,
    )
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    install = [
        str(python),
        "-m",
        "pip",
        "install",
        "--progress-bar",
        "off",
        str(wheel),
        *base.test_requirements,
    ]
    if subprocess.run(install).returncode != 0:
        shutil.rmtree(path, ignore_errors=True)
        raise ForkError(
            f"{base.name}: installing the test environment failed (pip output "
            "above); nothing was kept. Fix the cause and run the command again."
        )
    (path / COMPLETE_MARKER).write_text("\n".join(install) + "\n")
    return python


def _remove_stale(root: Path, base: Base, keep: Path) -> None:
    for old in root.glob(f"{base.name}-*"):
        if old != keep:
            print(f"vllm-fork: removing stale environment {old}", file=sys.stderr)
            shutil.rmtree(old, ignore_errors=True)
