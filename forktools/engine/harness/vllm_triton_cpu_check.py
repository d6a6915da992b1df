"""Let the CPU platform configure on x86 without triton-cpu, as before v0.34.0.

Why: from v0.34.0, ``CpuPlatform.check_and_update_config`` raises "vLLM on
x86 CPUs requires Triton (triton-cpu)." when ``HAS_TRITON`` is false (up to
v0.33.0 it only warned). Every ``VllmConfig()`` runs that check, so no CPU
test could build a config here: triton-cpu is not on the package index, and
the CUDA wheel's triton has no CPU backend, so vLLM sets ``HAS_TRITON`` false.

Why it is sound: the check guards vLLM's x86 model runner, which runs Triton
kernels; the fork's tests build configs and compile modules (Inductor on CPU
emits C++), and start no model runner. The check raises before the method
changes anything, so it is run again with ``HAS_TRITON`` reading true for that
one call and restored after; the rest of the method runs unchanged.
Everywhere else ``HAS_TRITON`` stays false, so no Triton kernel can run, and a
module that first binds ``HAS_TRITON`` during that call stops the run rather
than keep the wrong value. Bases whose check only warns never reach this path.
Test harness only, never a patch.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

TRITON_CPU_REQUIRED = "vLLM on x86 CPUs requires Triton (triton-cpu)."


def tolerate_missing_triton_cpu(platform_cls) -> None:
    """Wrap ``platform_cls.check_and_update_config`` (a classmethod)."""
    check_and_update_config = platform_cls.check_and_update_config.__func__

    def checked(cls, vllm_config):
        try:
            return check_and_update_config(cls, vllm_config)
        except RuntimeError as error:
            if str(error) != TRITON_CPU_REQUIRED:
                raise
        with _triton_reported_present():
            return check_and_update_config(cls, vllm_config)

    checked.__wrapped__ = check_and_update_config
    platform_cls.check_and_update_config = classmethod(checked)


@contextmanager
def _triton_reported_present():
    import vllm.triton_utils as triton_utils

    modules_before = set(sys.modules)
    triton_utils.HAS_TRITON = True
    try:
        yield
    finally:
        triton_utils.HAS_TRITON = False
    leaked = sorted(
        name
        for name in set(sys.modules) - modules_before
        if getattr(sys.modules.get(name), "HAS_TRITON", False) is True
    )
    if leaked:
        raise RuntimeError(
            "forktools harness: imported while HAS_TRITON read true for the "
            f"CPU platform check, so they hold it true: {', '.join(leaked)}"
        )
