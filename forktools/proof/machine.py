"""The machine a proof ran on: data beside each ledger row, in no key.

``VLLM_FORK_MACHINE`` (a JSON object of fingerprint fields) stands in for
what this machine reads, field by field, so that the tooling's tests and a
maintainer can take this machine for another kind (avx2 only, avx512, amx,
another CPU count or user) without one.
"""

from __future__ import annotations

import json
import os

from forktools.proof import prove
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
    """This machine as ``prove.fingerprint`` reads it, with the fields
    ``VLLM_FORK_MACHINE`` forces."""
    return {**prove.fingerprint(), **forced()}


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
