"""Steady-state cost of ``LoRAModelManager.set_adapter_mapping`` on CPU.

Run in the base's venv with a fork tree of v0.19.1 (or its pristine checkout)
and ``forktools/engine/harness`` on PYTHONPATH and ``VLLM_TARGET_DEVICE=cpu``, as
``forktools.engine.bench`` does. Builds an ``LRUCacheLoRAModelManager`` on a small
dummy model, maps one decode batch, then:

- ``slot_layout_memo``: whether the tree has patch 0003's memo, so that a
  caller can tell the fork from pristine upstream;
- ``refreshes``: punica ``update_metadata`` calls over ``--steps`` engine
  steps that re-activate the running adapters and map the same batch again;
- ``seconds_per_call``: the fastest, over ``--blocks`` timed blocks, of the
  per-call time of ``set_adapter_mapping`` with an equal mapping (a new object
  each call, as the model runner builds one per step) and unchanged slots.

Prints one JSON object on stdout; vLLM's logs and gloo's chatter go to stderr.
"""

import argparse
import json
import os
import sys
import time
from collections import OrderedDict
from unittest.mock import MagicMock

os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

import torch
from script_io import single_process_group, stdout_to_stderr
from torch import nn
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.config.lora import LoRAConfig
from vllm.lora.lora_model import LoRAModel
from vllm.lora.lora_weights import LoRALayerWeights
from vllm.lora.model_manager import (
    DEFAULT_LANGUAGE_WRAPPER_KEY,
    LoRAMapping,
    LRUCacheLoRAModelManager,
)
from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
from vllm.model_executor.models.interfaces import SupportsLoRA

RANK = 8
VOCAB_SIZE = 32064
LORA_MODULES = ("dense1", "dense2")


class DummyLoRAModel(nn.Sequential, SupportsLoRA):
    pass


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256, help="decoding requests")
    parser.add_argument("--max-loras", type=int, default=4, help="GPU LoRA slots")
    parser.add_argument("--steps", type=int, default=10_000, help="unchanged steps")
    parser.add_argument("--calls", type=int, default=20_000, help="calls per block")
    parser.add_argument("--blocks", type=int, default=7, help="timed blocks")
    return parser.parse_args()


def dummy_model() -> DummyLoRAModel:
    model = DummyLoRAModel(
        OrderedDict(
            [
                ("dense1", ColumnParallelLinear(64, 32)),
                ("dense2", RowParallelLinear(32, 16)),
            ]
        )
    )
    model.config = MagicMock()
    model.embedding_modules = {}
    model.unpadded_vocab_size = VOCAB_SIZE
    return model


def lru_manager(model: nn.Module, batch: int, max_loras: int):
    config = LoRAConfig(
        max_lora_rank=RANK,
        max_cpu_loras=max_loras,
        max_loras=max_loras,
        lora_dtype=torch.get_default_dtype(),
    )
    return LRUCacheLoRAModelManager(
        model, batch, batch, VOCAB_SIZE, config, device="cpu"
    )


def random_lora(lora_id: int, model: nn.Module) -> LoRAModel:
    loras = {}
    for name in LORA_MODULES:
        weight = model.get_submodule(name).weight
        loras[name] = LoRALayerWeights(
            name,
            RANK,
            16,
            torch.rand([RANK, weight.shape[1]]),
            torch.rand([weight.shape[0], RANK]),
        )
    return LoRAModel(lora_id, RANK, loras)


def decode_batch(batch: int, max_loras: int) -> list[int]:
    """One token per request; every fifth request runs without LoRA."""
    return [0 if i % 5 == 0 else 1 + i % max_loras for i in range(batch)]


def new_mapping(lora_ids: list[int]) -> LoRAMapping:
    return LoRAMapping(tuple(lora_ids), tuple(lora_ids))


def count_refreshes(manager, lora_ids: list[int], steps: int) -> int:
    punica_wrapper = manager.punica_wrapper_mapping[DEFAULT_LANGUAGE_WRAPPER_KEY]
    update_metadata = punica_wrapper.update_metadata
    refreshes = 0

    def counting_update_metadata(*args, **kwargs):
        nonlocal refreshes
        refreshes += 1
        return update_metadata(*args, **kwargs)

    punica_wrapper.update_metadata = counting_update_metadata
    running = sorted(set(lora_ids) - {0})
    for _ in range(steps):
        for lora_id in running:
            manager.activate_adapter(lora_id)
        manager.set_adapter_mapping(new_mapping(lora_ids))
    punica_wrapper.update_metadata = update_metadata
    return refreshes


def seconds_per_call(manager, lora_ids: list[int], calls: int) -> float:
    mappings = [new_mapping(lora_ids) for _ in range(calls)]
    set_adapter_mapping = manager.set_adapter_mapping
    started = time.perf_counter()
    for mapping in mappings:
        set_adapter_mapping(mapping)
    return (time.perf_counter() - started) / calls


def main() -> None:
    args = parse_args()
    with (
        stdout_to_stderr(),
        single_process_group(),
        set_current_vllm_config(VllmConfig()),
    ):
        model = dummy_model()
        manager = lru_manager(model, args.batch, args.max_loras)
        for lora_id in range(1, args.max_loras + 1):
            manager.add_adapter(random_lora(lora_id, model))
            manager.activate_adapter(lora_id)
        lora_ids = decode_batch(args.batch, args.max_loras)
        refreshes = count_refreshes(manager, lora_ids, args.steps)
        timings = [
            seconds_per_call(manager, lora_ids, args.calls) for _ in range(args.blocks)
        ]
    result = {
        "seconds_per_call": min(timings),
        "refreshes": refreshes,
        "slot_layout_memo": hasattr(manager, "_last_slot_layout"),
        "steps": args.steps,
        "batch": args.batch,
        "max_loras": args.max_loras,
    }
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
