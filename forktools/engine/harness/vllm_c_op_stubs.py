"""Stand-in schemas for the ``torch.ops._C`` names vLLM's compile passes read.

Why: the passes look these ops up when they are imported, and on a machine
without ``libcuda.so.1`` the CUDA wheel's kernel library cannot load, so real
Inductor compiles could not even start on CPU. Why it is safe: a name is
defined only when the real library did not provide it, each schema takes and
returns nothing, and the CPU test graphs call none of these ops; calling one
fails loudly instead of computing anything. Test harness only, never a patch.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from pathlib import Path

_OP_REFERENCE = re.compile(r"torch\.ops\._C\.(\w+)")
_KERNEL_MODULES = ("vllm._C", "vllm._C_stable_libtorch")
# vllm._custom_ops registers fakes for an op's overloads once
# hasattr(torch.ops._C, name) holds (v0.19.1: scaled_fp4_quant.out), so each
# stand-in also has the overloads such registrations name.
_OVERLOADS = ("", ".out")


def referenced_ops(package_dir: Path) -> set[str]:
    """The ``torch.ops._C.<name>`` names that the sources under a dir use."""
    names: set[str] = set()
    for source in package_dir.rglob("*.py"):
        names.update(_OP_REFERENCE.findall(source.read_text(errors="replace")))
    return names


def _import_real_ops() -> None:
    for module in _KERNEL_MODULES:
        with contextlib.suppress(Exception):
            importlib.import_module(module)


def define_missing(compilation_dir: Path) -> list[str]:
    """Define a stand-in for every referenced op the kernels did not provide.

    Returns the names defined.
    """
    import torch

    _import_real_ops()
    missing = sorted(
        name
        for name in referenced_ops(compilation_dir)
        if not hasattr(torch.ops._C, name)
    )
    if missing:
        library = torch.library.Library("_C", "FRAGMENT")
        for name in missing:
            for overload in _OVERLOADS:
                library.define(f"{name}{overload}() -> ()")
        _libraries.append(library)
    return missing


# Registrations last as long as their Library object.
_libraries: list = []
