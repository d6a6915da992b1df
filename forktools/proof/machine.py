"""The machine a proof ran on: data beside each ledger row, in no key.

``VLLM_FORK_MACHINE`` (a JSON object of fingerprint fields) stands in for
what this machine reads, field by field, so that the tooling's tests and a
maintainer can take this machine for another kind (avx2 only, avx512, amx,
another CPU count or user) without one.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import subprocess
from pathlib import Path

from forktools.queue.pins import ForkError

FORCED = "VLLM_FORK_MACHINE"

# What a difference in each field can change, for `make check` and the docs.
WHAT_DIFFERS = {
    "uid": "the user (root passes file modes the read-only cache tests rely on)",
    "capabilities": "the capabilities (the same, for the read-only cache tests)",
    "cpus": "the CPU count (how many compiles and workers run side by side)",
    "cpu_flags": "the CPU flags (which vector kernels Inductor and the engine pick)",
    "cxx": "the C++ compiler (what Inductor builds its kernels with)",
    "kernel": "the kernel release",
}


def fingerprint() -> dict[str, object]:
    """What of the machine a proof ran on may change an observation, kept as
    data beside each row: who ran it (root with capabilities takes other code
    paths in the read-only tests), the CPUs and the flags that pick kernels,
    the C++ compiler Inductor calls, the kernel release; with the fields
    ``VLLM_FORK_MACHINE`` forces."""
    return {**_machine(), **forced()}


def forced() -> dict[str, object]:
    text = os.environ.get(FORCED, "").strip()
    if not text:
        return {}
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as e:
        raise ForkError(f"{FORCED} is not JSON ({e}): {text!r}") from None
    unknown = set(fields) - set(WHAT_DIFFERS) if isinstance(fields, dict) else None
    if unknown is None or unknown:
        raise ForkError(
            f"{FORCED} must be a JSON object of the fields "
            f"{', '.join(WHAT_DIFFERS)}; got {text!r}"
        )
    return fields


def differences(recorded: dict, here: dict) -> list[str]:
    """The fields in which a row's machine differs from this one."""
    return [
        name
        for name in sorted(set(recorded) | set(here))
        if recorded.get(name) != here.get(name)
    ]


KERNEL_FLAGS = ("avx512", "amx")


@functools.cache
def _machine() -> dict[str, object]:
    return {
        "uid": os.getuid(),
        "capabilities": _effective_capabilities() != 0,
        "cpus": os.cpu_count() or 0,
        "cpu_flags": _kernel_flags(),
        "cxx": _compiler_version(),
        "kernel": platform.release(),
    }


def _effective_capabilities() -> int:
    status = Path("/proc/self/status")
    text = status.read_text() if status.exists() else ""
    found = re.search(r"^CapEff:\s*([0-9a-f]+)", text, re.MULTILINE)
    return int(found.group(1), 16) if found else 0


def _kernel_flags() -> list[str]:
    """The CPU flags that pick vector kernels: avx2, avx512*, amx*."""
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text() if cpuinfo.exists() else ""
    found = re.search(r"^flags\s*:(.*)$", text, re.MULTILINE)
    flags = found.group(1).split() if found else []
    return sorted(f for f in set(flags) if f == "avx2" or f.startswith(KERNEL_FLAGS))


def _compiler_version() -> str:
    """The first line of ``g++ --version``: the compiler Inductor calls
    when the tests see no CXX."""
    try:
        result = subprocess.run(
            ["g++", "--version"], capture_output=True, text=True, check=False
        )
    except OSError:
        return "none"
    return result.stdout.partition("\n")[0].strip() or "none"
