"""One run of a small AOT-compiled model on CPU, against a given compile cache.

Run in the base's venv with a fork tree (or its pristine checkout) on
PYTHONPATH, ``VLLM_TARGET_DEVICE=cpu`` and ``VLLM_CACHE_ROOT`` set, as
``forktools.engine.bench`` does, twice or more with the same ``VLLM_CACHE_ROOT``: the
first run compiles and saves the AOT artifact, later runs should load it. The
model is a stack of ``ColumnParallelLinear``/``RowParallelLinear`` blocks,
every other block's up projection wrapped by vLLM's LoRA layer (no adapter
active), compiled with ``VLLM_USE_AOT_COMPILE=1``.

``--artifacts default`` compiles as users do: real Inductor with standalone
compile, in the artifact format vLLM picks for this torch (the mega artifact
from torch 2.12). ``--artifacts eager-split`` runs the split graph's pieces
eagerly (``EagerAdaptor``) with the mega artifact off, which times the load
path without Inductor's outputs. Either way, shims that only a test or
benchmark may use: ``VLLM_COMPILE`` is restored after the CPU platform
downgrades it, ``compile_sizes=[]``, a one-process gloo group stands in for
the distributed setup, and the harness on PYTHONPATH stands in for the
``torch.ops._C`` schemas the compile passes read.

Prints one JSON object on stdout: vLLM's ``compilation_counter`` AOT counts of
this process, whether the model loaded from disk and matched eager output, the
seconds of the ``_try_load_aot_compiled_fn`` call that loaded it, and (fork
trees only) the seconds of ``_check_module_state_resolves`` within it.
"""

import argparse
import json
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from unittest.mock import patch

os.environ.update(
    VLLM_LOGGING_STREAM="ext://sys.stderr",
    VLLM_USE_AOT_COMPILE="1",
    VLLM_FORCE_AOT_LOAD="0",
    VLLM_DISABLE_COMPILE_CACHE="0",
)

import torch
import vllm.compilation.backends as compilation_backends
import vllm.compilation.decorators as compilation_decorators
import vllm.envs as envs
from script_io import single_process_group, stdout_to_stderr
from torch import nn
from vllm.compilation.compiler_interface import EagerAdaptor
from vllm.compilation.counter import compilation_counter
from vllm.compilation.decorators import support_torch_compile
from vllm.config import (
    CompilationConfig,
    CompilationMode,
    CUDAGraphMode,
    LoRAConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.forward_context import set_forward_context
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU
from vllm.lora.utils import from_layer
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    RowParallelLinear,
)

HIDDEN = 64
NUM_TOKENS = 8
CHECK = "_check_module_state_resolves"
LOAD = "_try_load_aot_compiled_fn"


class Block(nn.Module):
    def __init__(self, prefix: str):
        super().__init__()
        self.up_proj = ColumnParallelLinear(
            HIDDEN, 2 * HIDDEN, bias=False, prefix=f"{prefix}.up_proj"
        )
        self.down_proj = RowParallelLinear(
            2 * HIDDEN, HIDDEN, bias=False, prefix=f"{prefix}.down_proj"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.up_proj(x)
        out, _ = self.down_proj(hidden)
        return x + out


@support_torch_compile
class BlockStack(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", layers: int):
        super().__init__()
        self.layers = nn.ModuleList(Block(f"layers.{i}") for i in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class NoAdapterPunicaWrapper(PunicaWrapperCPU):
    # No adapter is active, so LoRA adds nothing; torch 2.10 cannot trace
    # PunicaWrapperCPU.add_lora_linear for an AOT artifact (v0.19.1).
    def add_lora_linear(self, y: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return y


def compile_config() -> VllmConfig:
    vllm_config = VllmConfig(
        compilation_config=CompilationConfig(
            mode=CompilationMode.VLLM_COMPILE,
            backend="inductor",
            cudagraph_mode=CUDAGraphMode.NONE,
        )
    )
    # The CPU platform downgrades VLLM_COMPILE to DYNAMO_TRACE_ONCE, whose
    # artifacts vLLM cannot load back.
    vllm_config.compilation_config.mode = CompilationMode.VLLM_COMPILE
    vllm_config.compilation_config.compile_sizes = []
    return vllm_config


def wrap_with_lora(block: Block) -> None:
    lora_config = LoRAConfig(max_loras=1, max_lora_rank=8, lora_dtype=torch.float32)
    lora_layer = from_layer(
        block.up_proj, max_loras=1, lora_config=lora_config, packed_modules_list=[]
    )
    lora_layer.set_mapping(NoAdapterPunicaWrapper(64, 4, "cpu"))
    block.up_proj = lora_layer


def build_model(vllm_config: VllmConfig, layers: int) -> BlockStack:
    with set_current_vllm_config(vllm_config):
        model = BlockStack(vllm_config=vllm_config, layers=layers)
    torch.manual_seed(0)
    for param in model.parameters():
        nn.init.normal_(param, std=0.1)
    for module in model.modules():
        quant_method = getattr(module, "quant_method", None)
        if quant_method is not None:
            quant_method.process_weights_after_loading(module)
    for block in model.layers[1::2]:
        wrap_with_lora(block)
    return model


def model_input() -> torch.Tensor:
    return torch.randn(NUM_TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))


def run(model: BlockStack) -> torch.Tensor:
    with (
        set_forward_context({}, model.vllm_config),
        set_current_vllm_config(model.vllm_config),
    ):
        return model(model_input())


@contextmanager
def timing(module, name: str, durations: list[float]):
    """Append the seconds of every call of ``module.<name>`` to ``durations``."""
    original = getattr(module, name)

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            durations.append(time.perf_counter() - started)

    with patch.object(module, name, timed):
        yield


@contextmanager
def eager_pieces():
    # vLLM still splits, serializes and reloads the graph; only the pieces run
    # eagerly instead of being built into C++ kernels by Inductor.
    with patch.object(
        compilation_backends, "make_compiler", lambda *args, **kwargs: EagerAdaptor()
    ):
        yield


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16, help="model blocks")
    parser.add_argument(
        "--artifacts",
        choices=["default", "eager-split"],
        default="default",
        help="vLLM's default format with real Inductor, or eager split pieces",
    )
    args = parser.parse_args()
    if "VLLM_CACHE_ROOT" not in os.environ:
        parser.error("set VLLM_CACHE_ROOT to the compile cache of the runs")
    return args


def artifact_format(name: str):
    """Set the environment for ``--artifacts``; the compiler context to use."""
    if name == "eager-split":
        os.environ["VLLM_USE_MEGA_AOT_ARTIFACT"] = "0"
        return eager_pieces()
    os.environ.pop("VLLM_USE_MEGA_AOT_ARTIFACT", None)
    os.environ.pop("VLLM_USE_STANDALONE_COMPILE", None)
    return nullcontext()


def main() -> None:
    args = parse_args()
    compiler = artifact_format(args.artifacts)
    has_check = hasattr(compilation_decorators, CHECK)
    load_seconds: list[float] = []
    check_seconds: list[float] = []
    timed_check = (
        timing(compilation_decorators, CHECK, check_seconds)
        if has_check
        else nullcontext()
    )
    with stdout_to_stderr(), single_process_group(), compiler:
        with timing(compilation_decorators, LOAD, load_seconds), timed_check:
            model = build_model(compile_config(), args.layers)
            output = run(model)
        with torch.no_grad():
            correct = torch.allclose(output, model.forward(model_input()))
    loaded = bool(getattr(model, "was_aot_compile_fn_loaded_from_disk", False))
    result = {
        "aot_compiles": compilation_counter.num_aot_compiles,
        "aot_artifacts_saved": compilation_counter.num_aot_artifacts_saved,
        "aot_artifacts_loaded": compilation_counter.num_aot_artifacts_loaded,
        "loaded_from_disk": loaded,
        "correct": bool(correct),
        "has_check": has_check,
        "mega_artifact": envs.VLLM_USE_MEGA_AOT_ARTIFACT,
        "load_seconds": load_seconds[-1] if loaded else None,
        "check_seconds": check_seconds[-1] if loaded and has_check else None,
    }
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
