"""Runs inside an engine environment: a tiny model, its HF reference, an engine run.

Started by ``forktools.engine.llm`` with the engine environment's Python, as a
script (``python -P engine_run.py model DIR`` or ``generate DIR OUT``; ``-P``
keeps forktools/ off sys.path, where its queue.py would shadow the standard
library's), so it imports nothing from forktools: only the standard library
and what that environment holds (torch, transformers, tokenizers,
safetensors, vllm).

``model`` writes a 2-layer Llama (hidden 128, 4 heads of 32: CPU attention
needs head_dim >= 32), a word-level tokenizer, a LoRA adapter in PEFT's
layout (written with safetensors), and the greedy tokens HF transformers
gives for fixed prompts, without and with the adapter merged; beside them,
two draft models for speculative decoding (``DRAFTERS``: Llamas of one and two
layers on the same vocabulary, each with a ``pard_token`` for parallel
drafting).

``generate`` starts ``LLM(model=DIR, enable_lora=True, ...)``, times the
start, and writes the greedy tokens without and with the adapter; each
``ARG=VALUE`` after OUT is one more engine argument, a whole number where it
is one (``tensor_parallel_size=2``; ``enable_lora=0`` runs without LoRA;
``dtype=bfloat16`` replaces float32; ``adapters=3`` serves two more adapters
after the first, each loaded at runtime; ``unwrapped=NAME`` leaves that LoRA
target unwrapped, in this process: it needs
``VLLM_ENABLE_V1_MULTIPROCESSING=0``; ``draft=NAME`` decodes speculatively
with that draft model, or ``draft=ngram`` with n-gram lookup, proposing
``draft_tokens=K`` tokens a step, ``parallel_drafting=1`` all in one drafter
pass). The engine core is otherwise a spawned process, hence the ``__main__``
guard.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

PROMPTS = [[1, 17, 42, 99, 5], [1, 300, 301, 302], [1, 777, 12, 512, 640, 8]]
NEW_TOKENS = 8
VOCAB = 1000
RANK, ALPHA = 8, 16
LORA_TARGETS = ("q_proj", "v_proj")
ADAPTER = "adapter"
REFERENCE = "hf_tokens.json"
DRAFTERS = {"draft": 1, "draft-deeper": 2}  # name: layers
PARALLEL_DRAFTING_TOKEN = 3


def make_model(directory: Path) -> None:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(_llama_config(layers=2)).eval()
    model.save_pretrained(directory, safe_serialization=True)
    _tokenizer().save_pretrained(directory)
    for name, layers in DRAFTERS.items():
        _write_drafter(directory / name, layers)
    deltas = _write_adapter(model, directory / ADAPTER)
    reference = {"base": _greedy(model, PROMPTS)}
    _merge(model, deltas)
    reference["lora"] = _greedy(model, PROMPTS)
    (directory / REFERENCE).write_text(json.dumps(reference))


def _llama_config(layers: int, **extra):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        **extra,
    )


def _write_drafter(directory: Path, layers: int) -> None:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(layers)
    config = _llama_config(layers, pard_token=PARALLEL_DRAFTING_TOKEN)
    LlamaForCausalLM(config).eval().save_pretrained(directory, safe_serialization=True)
    _tokenizer().save_pretrained(directory)


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", *(f"w{i}" for i in range(3, VOCAB))]
    vocab = {word: i for i, word in enumerate(words)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
    )


def _write_adapter(model, directory: Path) -> dict:
    """A PEFT LoRA adapter on LORA_TARGETS; returns each target's weight delta."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(1)
    tensors, deltas = {}, {}
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] not in LORA_TARGETS:
            continue
        out_features, in_features = module.weight.shape
        a = torch.randn(RANK, in_features, generator=generator) * 0.3
        b = torch.randn(out_features, RANK, generator=generator) * 0.3
        tensors[f"base_model.model.{name}.lora_A.weight"] = a
        tensors[f"base_model.model.{name}.lora_B.weight"] = b
        deltas[name] = (b @ a) * (ALPHA / RANK)
    directory.mkdir(parents=True)
    save_file(tensors, directory / "adapter_model.safetensors")
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": RANK,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "target_modules": list(LORA_TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
        "base_model_name_or_path": str(directory.parent),
    }
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return deltas


def _merge(model, deltas: dict) -> None:
    import torch

    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, delta in deltas.items():
            modules[name].weight += delta


def _greedy(model, prompts: list[list[int]]) -> list[list[int]]:
    import torch

    results = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            for _ in range(NEW_TOKENS):
                logits = model(ids).logits[0, -1]
                ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
            results.append(ids[0, len(prompt) :].tolist())
    return results


def generate(directory: Path, out: Path, **engine_args: int) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    lora = bool(engine_args.pop("enable_lora", 1))
    dtype = engine_args.pop("dtype", "float32")
    adapters = engine_args.pop("adapters", 1)
    if unwrapped := engine_args.pop("unwrapped", ""):
        _leave_unwrapped(unwrapped)
    if draft := engine_args.pop("draft", ""):
        tokens = engine_args.pop("draft_tokens", 2)
        parallel = bool(engine_args.pop("parallel_drafting", 0))
        engine_args["speculative_config"] = _speculative(
            directory, draft, tokens, parallel
        )
    started = time.monotonic()
    llm = LLM(
        model=str(directory),
        enable_lora=lora,
        max_lora_rank=RANK,
        max_model_len=128,
        dtype=dtype,
        **engine_args,
    )
    startup = time.monotonic() - started
    prompts = [TokensPrompt(prompt_token_ids=p) for p in PROMPTS]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    adapter = LoRARequest("adapter", 1, str(directory / ADAPTER))
    base = _tokens(llm.generate(prompts, params, use_tqdm=False))
    with_adapter = (
        llm.generate(prompts, params, lora_request=adapter, use_tqdm=False)
        if lora
        else []
    )
    for number in range(2, adapters + 1):
        more = LoRARequest(f"adapter{number}", number, str(directory / ADAPTER))
        llm.generate(prompts, params, lora_request=more, use_tqdm=False)
    result = {
        "startup_s": startup,
        "base": base,
        "lora": _tokens(with_adapter),
        "vllm_file": sys.modules["vllm"].__file__,
        "kernels": importlib.util.find_spec("vllm._C").origin,
    }
    out.write_text(json.dumps(result, indent=1))


def _speculative(directory: Path, draft: str, tokens: int, parallel: bool) -> dict:
    if draft == "ngram":
        return {"method": "ngram", "num_speculative_tokens": tokens}
    return {
        "method": "draft_model",
        "model": str(directory / draft),
        "num_speculative_tokens": tokens,
        "parallel_drafting": parallel,
    }


def _leave_unwrapped(module_name: str) -> None:
    """LoRA wraps every target but ``module_name`` (issue 55383's run A).
    Releases decide in ``is_supported_lora_module`` (0.33.0) or in the
    manager's ``_match_target_modules`` (0.19.1): both are narrowed."""
    from vllm.lora import model_manager

    is_supported = model_manager.is_supported_lora_module

    def supported_but_one(name: str, *args) -> bool:
        return name != module_name and is_supported(name, *args)

    model_manager.is_supported_lora_module = supported_but_one
    manager = model_manager.LoRAModelManager
    if match_target_modules := getattr(manager, "_match_target_modules", None):

        def match_all_but_one(self, name: str) -> bool:
            return name != module_name and match_target_modules(self, name)

        manager._match_target_modules = match_all_but_one


def _tokens(outputs) -> list[list[int]]:
    return [list(output.outputs[0].token_ids) for output in outputs]


if __name__ == "__main__":
    command, directory, *rest = sys.argv[1:]
    if command == "model":
        make_model(Path(directory))
    elif command == "generate":
        out, *settings = rest
        engine_args = dict(setting.split("=", 1) for setting in settings)
        generate(
            Path(directory),
            Path(out),
            **{k: int(v) if v.isdigit() else v for k, v in engine_args.items()},
        )
    else:
        sys.exit(
            f"unknown command {command!r}: model DIR | generate DIR OUT [ARG=VALUE ...]"
        )
