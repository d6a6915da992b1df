"""Keep the compile mode with LoRA on CPU where VLLM_FORK_CPU_LORA_COMPILE=1.

Why: ``CpuPlatform.check_and_update_config`` turns compilation off whenever
LoRA is enabled (``vllm/platforms/cpu.py``, about line 253 in v0.19.1), so a
CPU engine never reaches the compile and AOT-artifact path that LoRA users run
on GPUs, where the module-tree bugs live. Why it is safe: it acts only where
an engine test sets the variable (its engine-core processes inherit it), and
there it runs the method unchanged with the LoRA config hidden for that one
call, which only its compile-mode line reads; under compile, CPU LoRA requests
return the base model's tokens, so such tests compare base-model outputs.
Test harness only, never a patch.
"""

from __future__ import annotations

import os

ENV = "VLLM_FORK_CPU_LORA_COMPILE"


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


def keep_compile_with_lora(platform_cls) -> None:
    """Wrap ``platform_cls.check_and_update_config`` (a classmethod)."""
    check_and_update_config = platform_cls.check_and_update_config.__func__

    def checked(cls, vllm_config):
        lora_config = vllm_config.lora_config
        if lora_config is None:
            return check_and_update_config(cls, vllm_config)
        vllm_config.lora_config = None
        try:
            return check_and_update_config(cls, vllm_config)
        finally:
            vllm_config.lora_config = lora_config

    checked.__wrapped__ = check_and_update_config
    platform_cls.check_and_update_config = classmethod(checked)
