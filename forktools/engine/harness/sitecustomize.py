"""Test-run set-up for vLLM on CPU, in every process of a fork test run.

The tooling puts this directory on PYTHONPATH with ``VLLM_TARGET_DEVICE=cpu``;
subprocesses inherit both. Kept in the tooling so that no patch carries
test-harness code. Four hooks, each run when vLLM first imports the module:

- ``vllm.platforms``: pin the CPU platform. Some bases (v0.19.1) detect it
  only from a ``cpu`` build version, so on the CUDA wheel's code they fail
  with "Failed to infer device type".
- ``vllm.compilation``: stand-in schemas for the ``torch.ops._C`` names its
  passes read at import (see ``vllm_c_op_stubs``), so real Inductor runs.
  Not in an engine environment, which loads real CPU kernels.
- ``vllm.platforms.cpu``: configure without triton-cpu on x86, which v0.34.0
  made an error (see ``vllm_triton_cpu_check``); and, where a run sets
  ``VLLM_FORK_CPU_LORA_COMPILE=1``, keep the compile mode with LoRA on (see
  ``vllm_cpu_lora_compile``).
- ``vllm.model_executor.models.registry``: read a model class's capabilities
  in the running process rather than in a fresh one (see
  ``vllm_registry_in_process``).

Before any of them, CUDA kernel packages are told not to build their
launchers in background processes (see ``vllm_no_cuda_prebuilds``).

In an engine environment (one with vLLM's CPU build installed, see
``forktools.environments.venv.ensure_engine``), vLLM's compiled extensions
load from that build rather than from the fork tree (see
``vllm_engine_kernels``).
"""

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path


def _pin_cpu_platform(module) -> None:
    from vllm.platforms.cpu import CpuPlatform

    module._current_platform = CpuPlatform()


def _configure_cpu_platform(module) -> None:
    import vllm_cpu_lora_compile
    import vllm_triton_cpu_check

    vllm_triton_cpu_check.tolerate_missing_triton_cpu(module.CpuPlatform)
    if vllm_cpu_lora_compile.enabled():
        vllm_cpu_lora_compile.keep_compile_with_lora(module.CpuPlatform)


def _inspect_models_in_process(module) -> None:
    import vllm_registry_in_process

    vllm_registry_in_process.inspect_in_process(module)


def _stub_missing_c_ops(module) -> None:
    import vllm_c_op_stubs

    vllm_c_op_stubs.define_missing(Path(module.__file__).parent)


class _ImportHooks(importlib.abc.MetaPathFinder):
    """Runs ``before`` hooks ahead of a module's code, ``after`` hooks after."""

    def __init__(self, before: dict, after: dict):
        self.before = before
        self.after = after

    def find_spec(self, name, path=None, target=None):
        if name not in self.before and name not in self.after:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        before = self.before.pop(name, None)
        after = self.after.pop(name, None)
        load = spec.loader.exec_module

        def exec_module(module):
            if before:
                before(module)
            load(module)
            if after:
                after(module)

        spec.loader.exec_module = exec_module
        if not self.before and not self.after:
            sys.meta_path.remove(self)
        return spec


if os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
    import vllm_engine_kernels
    import vllm_no_cuda_prebuilds

    vllm_no_cuda_prebuilds.skip_background_builds()

    in_engine = vllm_engine_kernels.install() is not None
    after = {
        "vllm.platforms": _pin_cpu_platform,
        "vllm.platforms.cpu": _configure_cpu_platform,
        "vllm.model_executor.models.registry": _inspect_models_in_process,
    }
    sys.meta_path.insert(
        0,
        _ImportHooks(
            before={} if in_engine else {"vllm.compilation": _stub_missing_c_ops},
            after=after,
        ),
    )
