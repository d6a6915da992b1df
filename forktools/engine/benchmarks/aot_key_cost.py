"""Cost of the module-tree factor of the AOT cache key, on CPU.

Run in the base's venv with a fork tree (the queue applied: it needs
``module_tree_digest``) on PYTHONPATH and ``VLLM_TARGET_DEVICE=cpu``, as
``forktools.engine.bench`` does, in a fresh process each time: the existing factors
cache part of their work in the process. Builds a 128-layer decoder-shaped
module tree on the meta device, plain and with a LoRA-style wrapper around
every linear layer of its decoder layers, then times, in the order that
``_support_torch_compile`` computes them on a compile:

- ``existing_first``: ``aot_compile_hash_factors(vllm_config)`` plus
  ``_model_hash_key(forward)``, the first call in the process (vLLM's IR
  kernels, which a real run has imported by then, imported beforehand);
- ``digest_first``: ``module_tree_digest`` of each tree, its first call;
- ``existing_cached`` and ``digest_cached``: medians of ``--repeats`` calls
  after those.

Prints one JSON object on stdout; vLLM's logs go to stderr.
"""

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

import torch
import vllm.envs as envs
from torch import nn
from vllm.compilation.caching import aot_compile_hash_factors
from vllm.compilation.decorators import _model_hash_key, module_tree_digest
from vllm.config import CompilationConfig, CompilationMode, VllmConfig
from vllm.platforms import current_platform

HIDDEN = 4096
INTERMEDIATE = 14336
VOCAB = 128256
LORA_RANK = 16
TREES = ("plain", "lora")


class RMSNorm(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden))


class Attention(nn.Module):
    """Stands in for vLLM's attention op, which holds no parameters."""


class LoRAWrapped(nn.Module):
    def __init__(self, base_layer: nn.Linear):
        super().__init__()
        self.base_layer = base_layer
        self.lora_a = nn.Parameter(torch.empty(LORA_RANK, base_layer.in_features))
        self.lora_b = nn.Parameter(torch.empty(base_layer.out_features, LORA_RANK))


def linear(in_features: int, out_features: int, lora: bool) -> nn.Module:
    layer = nn.Linear(in_features, out_features, bias=False)
    return LoRAWrapped(layer) if lora else layer


class SelfAttention(nn.Module):
    def __init__(self, lora: bool):
        super().__init__()
        self.qkv_proj = linear(HIDDEN, 3 * HIDDEN, lora)
        self.o_proj = linear(HIDDEN, HIDDEN, lora)
        self.attn = Attention()


class MLP(nn.Module):
    def __init__(self, lora: bool):
        super().__init__()
        self.gate_up_proj = linear(HIDDEN, 2 * INTERMEDIATE, lora)
        self.down_proj = linear(INTERMEDIATE, HIDDEN, lora)


class DecoderLayer(nn.Module):
    def __init__(self, lora: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(HIDDEN)
        self.self_attn = SelfAttention(lora)
        self.post_attention_layernorm = RMSNorm(HIDDEN)
        self.mlp = MLP(lora)


class Decoder(nn.Module):
    def __init__(self, num_layers: int, lora: bool):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(DecoderLayer(lora) for _ in range(num_layers))
        self.norm = RMSNorm(HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=128, help="decoder layers")
    parser.add_argument("--repeats", type=int, default=50, help="cached calls")
    parser.add_argument(
        "--trees", default=",".join(TREES), help="trees to digest, in this order"
    )
    return parser.parse_args()


def compile_config() -> VllmConfig:
    return VllmConfig(
        compilation_config=CompilationConfig(mode=CompilationMode.VLLM_COMPILE)
    )


def import_kernels_up_front() -> None:
    """A real run imports vLLM's IR kernels before its first compile; the
    config hash would import them on its first call here (v0.33.0)."""
    import_ir_kernels = getattr(current_platform, "import_ir_kernels", None)
    if import_ir_kernels is not None:
        import_ir_kernels()


def existing_key(vllm_config: VllmConfig, model: nn.Module) -> list[str]:
    factors = aot_compile_hash_factors(vllm_config)
    factors.append(_model_hash_key(model.forward))
    return factors


def seconds(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def median_seconds(call: Callable[[], object], repeats: int) -> float:
    return statistics.median(seconds(call) for _ in range(repeats))


def main() -> None:
    args = parse_args()
    tree_names = args.trees.split(",")
    vllm_config = compile_config()
    with torch.device("meta"):
        trees = {name: Decoder(args.layers, lora=name == "lora") for name in TREES}
    plain = trees["plain"]
    import_kernels_up_front()
    existing_first = seconds(lambda: existing_key(vllm_config, plain))
    digest_first = {
        name: seconds(lambda name=name: module_tree_digest(trees[name]))
        for name in tree_names
    }
    existing_cached = median_seconds(
        lambda: existing_key(vllm_config, plain), args.repeats
    )
    digest_cached = {
        name: median_seconds(
            lambda name=name: module_tree_digest(trees[name]), args.repeats
        )
        for name in tree_names
    }
    result = {
        "existing_first": existing_first,
        "existing_cached": existing_cached,
        "digest_first": digest_first,
        "digest_cached": digest_cached,
        "modules": {name: len(list(tree.modules())) for name, tree in trees.items()},
        "inductor_factors": bool(envs.VLLM_USE_MEGA_AOT_ARTIFACT),
    }
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
