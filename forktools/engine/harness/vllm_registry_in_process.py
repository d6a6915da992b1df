"""Inspect a model class in the running process, not in a fresh one.

Why: on a cache root with no ``modelinfos`` record, vLLM's model registry reads
a model class's capabilities in a fresh Python process that imports vLLM again
(``_run_in_subprocess``), about 11 s on this machine, and the proof's engine
starts and ``ModelConfig`` tests each begin on a fresh cache root. Why it is
safe: that process only keeps a GPU parent from initializing CUDA, which no CPU
run does; the same function reads the same class, the registry still saves and
loads its ``modelinfos`` record, and each inspection checks that it left the
Inductor and functorch configs (process state the compile key reads) as they
were, and stops the run if not. Test harness only, never a patch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")


def compile_configs() -> dict[str, dict[str, Any]]:
    """The process-wide compiler settings that vLLM's compile key reads."""
    import torch._functorch.config
    import torch._inductor.config

    return {
        "torch._inductor.config": torch._inductor.config.get_config_copy(),
        "torch._functorch.config": torch._functorch.config.get_config_copy(),
    }


def inspect_in_process(registry, configs=compile_configs) -> None:
    """Replace ``registry._run_in_subprocess`` (vllm.model_executor.models.registry)."""

    def run_here(fn: Callable[[], _T]) -> _T:
        before = configs()
        result = fn()
        after = configs()
        changed = [
            f"{module}.{name}"
            for module, settings in before.items()
            for name, value in settings.items()
            if after[module].get(name) != value
        ]
        if changed:
            raise RuntimeError(
                "inspecting a model class in this process changed "
                f"{', '.join(changed)}, which vLLM's fresh inspection process "
                "keeps apart: remove the harness's vllm_registry_in_process hook"
            )
        return result

    run_here.__wrapped__ = registry._run_in_subprocess
    registry._run_in_subprocess = run_here
