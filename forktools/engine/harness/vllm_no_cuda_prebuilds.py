"""Keep CUDA kernel packages from building their launchers in the background.

Why: importing ``humming`` (a quantized-GEMM kernel package that vLLM 0.33.0
and later install, imported on the compile and engine paths) starts two
Python processes that try to build its CUDA launcher and NVRTC compiler,
about 3.5 CPU-seconds each, and on a machine without CUDA both fail; with the
proof's test processes and engine workers that was up to a quarter of one CPU.
Why it is safe: ``HUMMING_DISABLE_PARALLEL_BUILD=1`` is humming's own switch,
which only moves the build to the first humming kernel call, and no CPU run
makes one; vLLM's compile key reads no ``HUMMING_*`` variable. Test harness
only, never a patch.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

SWITCHES = {"HUMMING_DISABLE_PARALLEL_BUILD": "1"}


def skip_background_builds(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set each package's switch, inherited by every child process."""
    for name, value in SWITCHES.items():
        environ.setdefault(name, value)
