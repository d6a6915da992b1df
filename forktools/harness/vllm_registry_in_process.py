"""In an engine environment, inspect a model class in the engine's own process.

Why: on a cache root with no ``modelinfos`` record, vLLM's model registry reads
a model class's capabilities in a fresh Python process that imports vLLM again
(``_run_in_subprocess``), about 11 s on this machine; every engine test starts
its first engine on a fresh cache root, so the proof paid that once per cold
start. Why it is safe: the subprocess only keeps a GPU parent from initializing
CUDA, which the CPU engine never does, and the engine imports the same class in
its own process moments later to load the model; the same function reads the
same class, and the registry still saves and loads its ``modelinfos`` record
as before. Engine environments only, where the model runs in-process anyway.
Test harness only, never a patch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")


def inspect_in_process(registry) -> None:
    """Replace ``registry._run_in_subprocess`` (vllm.model_executor.models.registry)."""

    def run_here(fn: Callable[[], _T]) -> _T:
        return fn()

    run_here.__wrapped__ = registry._run_in_subprocess
    registry._run_in_subprocess = run_here
