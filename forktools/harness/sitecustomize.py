"""Pin vLLM's platform to the CPU in every process of a fork test run.

Some bases (v0.19.1) detect the CPU platform only from a ``cpu`` build
version, so on the CUDA wheel's code they fail with "Failed to infer device
type". The tooling puts this directory on PYTHONPATH with
``VLLM_TARGET_DEVICE=cpu``; subprocesses inherit both. Kept in the tooling so
that no patch carries test-harness code.
"""

import importlib.abc
import os
import sys


class _PinCpuPlatform(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "vllm.platforms":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            from vllm.platforms.cpu import CpuPlatform

            module._current_platform = CpuPlatform()

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
    import importlib.util

    sys.meta_path.insert(0, _PinCpuPlatform())
