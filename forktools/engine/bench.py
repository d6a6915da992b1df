"""``make bench``: what the fork costs, each figure a ratio measured in one run.

Every figure runs the fork and pristine upstream side by side in the same
run, interleaved where that is cheap, so that the ratio holds on a loaded
machine where absolute times do not. The table goes to stdout and to
``BENCHMARKS.md``; each figure's docstring says how it is measured.

Set ``VLLM_FORK_BENCH_INSTALL=0`` to skip the install-time figure (about ten
minutes and 9 GB of scratch disk), or ``=dry-run`` to exercise its path with
``pip install --dry-run`` (resolves and downloads, installs nothing: a check
of the machinery, not the figure).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from forktools import proof
from forktools.engine import llm
from forktools.environments import tools, venv
from forktools.queue import git, materialize, pins
from forktools.queue.pins import ROOT, Base, ForkError
from forktools.queue.table import render

BENCH_FILE = ROOT / "BENCHMARKS.md"
BENCHMARKS = ROOT / "forktools" / "engine" / "benchmarks"
FAULT_MATRIX = BENCHMARKS / "fault_matrix.md"
KEYS_MATRIX = BENCHMARKS / "keys_matrix.md"
INSTALL_ENV = "VLLM_FORK_BENCH_INSTALL"
LORA_BASE = "v0.19.1"
LORA_ROUNDS = 4
LORA_STEPS = 10_000
AOT_KEY_ROUNDS = 6
AOT_KEY_LAYERS = 128
AOT_KEY_TREES = {"plain": "", "lora": ", LoRA-wrapped linears"}
AOT_WARM_RUNS = 3
AOT_ARTIFACT_FORMATS = ("default", "eager-split")
ENGINE_WARM_OVER_COLD = 0.8
FLEET_REPLICAS = 4
RANK_LAYOUTS = {
    "TP=2": {"tensor_parallel_size": 2},
    "PP=2": {"pipeline_parallel_size": 2},
}
# One rank per core; without it the CPU worker asserts "Not enough allowed NUMA nodes".
RANK_ENV = {"VLLM_USE_AOT_COMPILE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}
SAME_PID = ("unshare", "--pid", "--fork", "--mount-proc")
_PATH_DIRS = re.compile(r"(?<=[\s'\"(])/\S*/")  # a path's directories, in messages
HEADER = ("#", "figure", "base", "measured", "goal", "holds", "when")
_EARLIER_RUN = re.compile(
    r"Written by `make bench` on (.+?) UTC \(.*?load average\s+(\S+)", re.DOTALL
)


@dataclass(frozen=True)
class Row:
    number: int
    figure: str
    base: str
    measured: str
    goal: str
    holds: str
    when: str = ""

    @property
    def failed(self) -> bool:
        return self.holds == "NO"


def _skipped(number: int, figure: str, base: str, goal: str, why: str) -> Row:
    return Row(number, figure, base, "-", goal, f"skipped: {why}")


def _verdict(holds: bool) -> str:
    return "yes" if holds else "NO"


def _progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


@contextmanager
def checkout(tree: Path, revision: str):
    """A throwaway checkout of ``revision`` of a fork tree, wheel files linked."""
    with proof.checkout(tree) as path:
        git.run(path, "checkout", "--quiet", "--detach", revision)
        yield path


def run_script(
    python: Path, tree: Path, name: str, *args: str, extra_env: dict | None = None
) -> dict:
    """Run ``benchmarks/<name>.py`` against ``tree``; its JSON result."""
    script = BENCHMARKS / f"{name}.py"
    result = subprocess.run(
        [str(python), str(script), *args],
        cwd=tree,
        env=_script_env(tree, extra_env),
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise ForkError(
            f"{script.name} failed in {tree} (exit {result.returncode}):\n"
            f"{result.stderr[-3000:]}"
        )
    return json.loads(result.stdout)


def _script_env(tree: Path, extra_env: dict | None = None) -> dict[str, str]:
    return dict(
        os.environ,
        VLLM_TARGET_DEVICE="cpu",
        PYTHONPATH=os.pathsep.join([str(tree), str(proof.HARNESS)]),
        HF_HUB_OFFLINE="1",
        **(extra_env or {}),
    )


def interleaved(
    runs: dict[str, Callable[[], dict]], rounds: int
) -> dict[str, list[dict]]:
    """Results of each run, alternating their order every round (ABBA...)."""
    names = list(runs)
    results: dict[str, list[dict]] = {name: [] for name in names}
    for round_number in range(rounds):
        order = names if round_number % 2 == 0 else names[::-1]
        for name in order:
            _progress(f"round {round_number + 1}/{rounds}: {name}")
            results[name].append(runs[name]())
    return results


def aot_key_runs(base: Base) -> list[dict]:
    """``aot_key_cost`` results of the fork tree, one fresh process a round."""
    tree = materialize.ensure(base)
    python = venv.ensure(base)
    trees = list(AOT_KEY_TREES)
    results = []
    with checkout(tree, "HEAD") as fork:
        for round_number in range(AOT_KEY_ROUNDS):
            order = trees if round_number % 2 == 0 else trees[::-1]
            _progress(f"{base.name} AOT key, round {round_number + 1}/{AOT_KEY_ROUNDS}")
            args = ("--layers", str(AOT_KEY_LAYERS), "--trees", ",".join(order))
            results.append(run_script(python, fork, "aot_key_cost", *args))
    return results


def _milliseconds(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def aot_key_row(base: Base, tree: str, results: list[dict]) -> Row:
    existing_first = statistics.median(r["existing_first"] for r in results)
    existing_cached = statistics.median(r["existing_cached"] for r in results)
    digest_first = statistics.median(r["digest_first"][tree] for r in results)
    digest_cached = statistics.median(r["digest_cached"][tree] for r in results)
    ratio = digest_first / existing_first
    modules = results[0]["modules"][tree]
    figure = (
        f"module-tree key factor / existing AOT key, per compile "
        f"({AOT_KEY_LAYERS} layers, {modules:,} modules{AOT_KEY_TREES[tree]})"
    )
    measured = (
        f"{ratio:.3f} ({_milliseconds(digest_first)} / "
        f"{_milliseconds(existing_first)}; cached calls "
        f"{digest_cached / existing_cached:.2f}: {_milliseconds(digest_cached)} / "
        f"{_milliseconds(existing_cached)})"
    )
    if not results[0]["inductor_factors"]:
        # The goal is set against a key that includes the inductor factors;
        # without them (mega artifact off, torch < 2.12) the key is a few
        # milliseconds and any walk of the tree is of the same order.
        holds = f"n/a: no inductor factors in this key; +{_milliseconds(digest_first)}"
        return Row(1, figure, base.name, measured, "<= 0.10", holds)
    return Row(1, figure, base.name, measured, "<= 0.10", _verdict(ratio <= 0.10))


def aot_key_cost(bases: list[Base]) -> list[Row]:
    """``module_tree_digest`` against the AOT key factors computed before it.

    A 128-layer decoder-shaped tree of plain ``nn.Module``s on the meta device
    (embedding; per layer two norms, qkv/o projections, a parameterless
    attention module, gate_up/down projections; final norm, lm_head), and the
    same tree with every linear of its layers wrapped as ``base_layer`` of a
    module holding ``lora_a``/``lora_b``. In each of 6 fresh processes of the
    fork tree, in ``_support_torch_compile``'s order: first
    ``aot_compile_hash_factors(vllm_config)`` plus ``_model_hash_key(forward)``
    (first call in the process, as a compile pays it; the inductor factors
    enter it where ``VLLM_USE_MEGA_AOT_ARTIFACT`` is on, the default with torch
    2.12+), then the digest of each tree, then 50 cached calls of each; the
    tree digested first alternates by round. The ratio is of medians across
    processes of the first calls; the cached-call ratio is beside it.
    """
    rows = []
    for base in bases:
        results = aot_key_runs(base)
        rows += [aot_key_row(base, tree, results) for tree in AOT_KEY_TREES]
    return rows


def aot_warm_start_runs(base: Base, artifacts: str) -> dict[str, list[dict]]:
    """``aot_warm_start`` warm runs of the fork and pristine, after a cold one."""
    tree = materialize.ensure(base)
    python = venv.ensure(base)
    with (
        checkout(tree, "HEAD") as fork,
        checkout(tree, "base") as pristine,
        tempfile.TemporaryDirectory(prefix="vllm-fork-bench-aot-") as tmp,
    ):
        checkouts = {"fork": fork, "pristine": pristine}
        runs = {
            name: _aot_run(python, checkout_dir, Path(tmp) / name, artifacts)
            for name, checkout_dir in checkouts.items()
        }
        for name, run in runs.items():
            _progress(f"{base.name} AOT cold start ({artifacts}): {name}")
            _expect_cold_compile(base, name, run())
        _progress(f"{base.name} AOT warm starts ({artifacts})")
        warm = interleaved(runs, AOT_WARM_RUNS)
    _expect_fork_only(base, warm, "has_check", "the AOT load check")
    return warm


def _expect_fork_only(
    base: Base, results: dict[str, list[dict]], flag: str, what: str
) -> None:
    """Fail unless ``flag`` is set in every fork run and in no pristine one."""
    seen = {name: {run[flag] for run in runs} for name, runs in results.items()}
    if seen != {"fork": {True}, "pristine": {False}}:
        raise ForkError(
            f"{base.name}: expected {what} in the fork tree only, found it as "
            f"{seen}; is its patch still in the queue?"
        )


def _aot_run(
    python: Path, tree: Path, cache_root: Path, artifacts: str
) -> Callable[[], dict]:
    cache_env = {"VLLM_CACHE_ROOT": str(cache_root)}
    args = ("--artifacts", artifacts)
    return lambda: run_script(
        python, tree, "aot_warm_start", *args, extra_env=cache_env
    )


def _expect_cold_compile(base: Base, name: str, result: dict) -> None:
    if result["aot_artifacts_saved"] != 1 or not result["correct"]:
        raise ForkError(
            f"{base.name} ({name}): the cold run did not save one correct AOT "
            f"artifact: {result}"
        )


def _format_label(artifacts: str, warm: dict[str, list[dict]]) -> str:
    if artifacts == "eager-split":
        return "split artifacts, EagerAdaptor"
    mega = {run["mega_artifact"] for runs in warm.values() for run in runs}
    kind = "mega artifact" if mega == {True} else "split artifacts"
    return f"default: {kind}, real Inductor"


def warm_recompiles_row(base: Base, warm: dict[str, list[dict]], label: str) -> Row:
    recompiles = {name: sum(r["aot_compiles"] for r in warm[name]) for name in warm}
    wrong = [name for name in warm if not all(r["correct"] for r in warm[name])]
    measured = f"{recompiles['fork']} (pristine: {recompiles['pristine']})"
    if wrong:
        measured += f"; wrong output: {', '.join(wrong)}"
    figure = f"AOT recompiles over {AOT_WARM_RUNS} warm starts, same tree ({label})"
    holds = _verdict(recompiles["fork"] == 0 and not wrong)
    return Row(2, figure, base.name, measured, "0", holds)


def _median_load(results: list[dict]) -> float:
    return statistics.median(r["load_seconds"] for r in results)


def load_check_share_row(base: Base, warm: dict[str, list[dict]], label: str) -> Row:
    figure = f"load check / AOT artifact load, warm start ({label})"
    loads = {name: [r for r in warm[name] if r["loaded_from_disk"]] for name in warm}
    if not loads["fork"]:
        return Row(2, figure, base.name, "no warm load", "<= 0.02", "NO")
    fork = loads["fork"]
    share = statistics.median(r["check_seconds"] / r["load_seconds"] for r in fork)
    check = statistics.median(r["check_seconds"] for r in fork)
    fork_load = _median_load(fork)
    details = [f"{_milliseconds(check)} / {_milliseconds(fork_load)}"]
    if loads["pristine"]:
        pristine_load = _median_load(loads["pristine"])
        details.append(
            f"load fork / pristine {fork_load / pristine_load:.2f}, "
            f"pristine {_milliseconds(pristine_load)}"
        )
    measured = f"{share:.3f} ({'; '.join(details)})"
    return Row(2, figure, base.name, measured, "<= 0.02", _verdict(share <= 0.02))


def aot_warm_start(bases: list[Base]) -> list[Row]:
    """A second process with the same tree and ``VLLM_CACHE_ROOT`` loads warm.

    A real AOT save/load round trip on CPU: 16 blocks of
    ``ColumnParallelLinear``/``RowParallelLinear``, every other up projection
    wrapped by vLLM's LoRA layer, ``VLLM_USE_AOT_COMPILE=1``, in two formats:
    the one users run (real Inductor, standalone compile, vLLM's default
    artifact format for the base's torch: the mega artifact on v0.33.0, split
    artifacts on v0.19.1), and split artifacts whose pieces ``EagerAdaptor``
    runs, which isolates the load path from Inductor's outputs. Benchmark-only
    shims: ``VLLM_COMPILE`` restored after the CPU platform downgrades it,
    ``compile_sizes=[]``, a one-process gloo group, the harness's stand-in
    ``torch.ops._C`` schemas. Per base and format, a cold run of the fork
    tree and of its pristine ``base`` checkout each fills its own cache, then
    3 warm runs of each in fresh processes, alternating. Recompiles:
    ``compilation_counter.num_aot_compiles`` summed over the warm runs.
    Share: the time of ``_check_module_state_resolves`` within the
    ``_try_load_aot_compiled_fn`` call that loaded the artifact, median over
    the fork's warm runs; beside it the fork's load time against pristine's,
    which has no check.
    """
    rows = []
    for base in bases:
        for artifacts in AOT_ARTIFACT_FORMATS:
            warm = aot_warm_start_runs(base, artifacts)
            label = _format_label(artifacts, warm)
            rows += [
                warm_recompiles_row(base, warm, label),
                load_check_share_row(base, warm, label),
            ]
    return rows


def lora_mapping_runs(base: Base) -> dict[str, list[dict]]:
    """Interleaved ``lora_mapping`` results of the fork and its pristine base."""
    tree = materialize.ensure(base)
    python = venv.ensure(base)
    args = ("--steps", str(LORA_STEPS))
    with checkout(tree, "HEAD") as fork, checkout(tree, "base") as pristine:
        results = interleaved(
            {
                "fork": lambda: run_script(python, fork, "lora_mapping", *args),
                "pristine": lambda: run_script(python, pristine, "lora_mapping", *args),
            },
            LORA_ROUNDS,
        )
    _expect_fork_only(base, results, "slot_layout_memo", "the slot-layout memo")
    return results


def lora_mapping(bases: list[Base]) -> list[Row]:
    """``set_adapter_mapping`` in steady state (patch 0003's slot-layout memo).

    An ``LRUCacheLoRAModelManager`` on CPU with a two-layer dummy model, 4
    slots holding 4 adapters, and a 256-request decode batch. Per-call time
    of ``set_adapter_mapping`` with an equal mapping and unchanged slots (the
    fastest of 7 blocks of 20,000 calls per process, which sheds interference
    from other load), fork tree HEAD against a checkout of its ``base`` tag,
    in separate processes alternating over 4 rounds; the ratio is of the
    medians across rounds, the range that of the rounds' own ratios.
    Refreshes: calls to the punica wrapper's ``update_metadata`` over 10,000
    engine steps that re-activate the running
    adapters and map the same batch.
    """
    cost = "set_adapter_mapping per call (256-token batch), fork / pristine"
    refreshes = f"punica refreshes over {LORA_STEPS:,} unchanged steps"
    if LORA_BASE not in {base.name for base in bases}:
        why = f"needs base {LORA_BASE}"
        return [
            _skipped(3, cost, LORA_BASE, "<= 1.10", why),
            _skipped(3, refreshes, LORA_BASE, "1", why),
        ]
    results = lora_mapping_runs(pins.load().get(LORA_BASE))
    fork_costs = [r["seconds_per_call"] for r in results["fork"]]
    pristine_costs = [r["seconds_per_call"] for r in results["pristine"]]
    ratio = statistics.median(fork_costs) / statistics.median(pristine_costs)
    round_ratios = [f / p for f, p in zip(fork_costs, pristine_costs, strict=True)]
    fork_refreshes = max(r["refreshes"] for r in results["fork"])
    pristine_refreshes = max(r["refreshes"] for r in results["pristine"])
    cost_measured = (
        f"{ratio:.2f} (rounds {min(round_ratios):.2f}-{max(round_ratios):.2f}; "
        f"{statistics.median(fork_costs) * 1e6:.2f} / "
        f"{statistics.median(pristine_costs) * 1e6:.2f} µs)"
    )
    return [
        Row(3, cost, LORA_BASE, cost_measured, "<= 1.10", _verdict(ratio <= 1.10)),
        Row(
            3,
            refreshes,
            LORA_BASE,
            f"{fork_refreshes} (pristine: {pristine_refreshes})",
            "1",
            _verdict(fork_refreshes == 1),
        ),
    ]


def engine_startup_runs(
    base: Base,
    python: Path,
    work: Path,
    start_engine: Callable[..., Any] = llm.run_engine,
    **env: str,
) -> dict[str, dict]:
    """Cold then warm engine starts of the fork tree and of its pristine
    ``base`` checkout, each tree on a cache root of its own, alternating.
    ``start_engine(python, model, environment, log)`` starts one (default:
    ``LLM`` with LoRA); ``env`` replaces ``llm.AOT_COMPILE`` in each
    start's environment."""
    tree = materialize.ensure(base)
    llm.make_model(python, work / "model")
    runs: dict[str, dict] = {"fork": {}, "pristine": {}}
    with checkout(tree, "HEAD") as fork, checkout(tree, "base") as pristine:
        trees = {"fork": fork, "pristine": pristine}
        for start in ("cold", "warm"):
            for name in (
                ("fork", "pristine") if start == "cold" else ("pristine", "fork")
            ):
                _progress(f"{base.name} engine {start} start: {name}")
                # Inductor's own cache too, or the cold start would find
                # the graphs that an earlier run on this machine compiled.
                environment = llm.environment(
                    trees[name],
                    work / f"cache-{name}",
                    TORCHINDUCTOR_CACHE_DIR=str(work / f"inductor-{name}"),
                    **(env or llm.AOT_COMPILE),
                )
                log = work / f"{name}-{start}.log"
                runs[name][start] = start_engine(
                    python, work / "model", environment, log
                )
    return runs


def _startup(name: str, runs: dict, seconds: str = "startup_s") -> tuple[float, str]:
    """Warm over cold of the runs' ``seconds`` field, and the row's text."""
    cold, warm = getattr(runs["cold"], seconds), getattr(runs["warm"], seconds)
    ratio = warm / cold
    events = runs["warm"].events
    outcome = "loaded" if events[llm.AOT_LOADED] else "not loaded"
    if events[llm.RECOMPILED]:
        outcome += ", compiled again"
    return ratio, f"{name} {ratio:.2f} ({warm:.1f} / {cold:.1f} s, {outcome})"


def _loaded_warm(warm: llm.Run | llm.ServerStart) -> bool:
    """The warm start loaded the AOT artifact and compiled nothing again."""
    return warm.events[llm.AOT_LOADED] > 0 and not warm.events[llm.RECOMPILED]


def engine_startup(bases: list[Base]) -> list[Row]:
    """The CPU engine's start-up, warm against cold, fork against pristine.

    ``LLM(...)`` of a tiny Llama (2 layers, hidden 128) with
    ``enable_lora=True``, compile kept on under LoRA by the harness and
    ``VLLM_USE_AOT_COMPILE=1``, in the base's CPU engine environment (bases
    that pin none are skipped). The fork tree and its pristine ``base``
    checkout each start cold on a cache root of its own, then warm on it,
    in fresh processes, alternating; the figure is ``LLM(...)``'s own time
    (the engine start with its compile or load, not the process's imports
    or generation), warm over cold. Each tree has its own Inductor cache
    directory too, so that the cold start compiles. The figure holds when the
    fork's warm start loaded the AOT artifact without compiling again and
    took at most ``ENGINE_WARM_OVER_COLD`` (0.8) of the cold start's time.
    """
    figure = "CPU engine start-up LLM(...), warm / cold (AOT, LoRA, compile on)"
    goal = f"<= {ENGINE_WARM_OVER_COLD}, loaded"
    rows = []
    for base in bases:
        runs = _engine_runs(base)
        if runs is None:
            rows.append(_skipped(6, figure, base.name, goal, "no engine pinned"))
            continue
        ratio, fork_text = _startup("fork", runs["fork"])
        _, pristine_text = _startup("pristine", runs["pristine"])
        holds = ratio <= ENGINE_WARM_OVER_COLD and _loaded_warm(runs["fork"]["warm"])
        measured = f"{fork_text}; {pristine_text}"
        rows.append(Row(6, figure, base.name, measured, goal, _verdict(holds)))
    return rows


def _engine_runs(base: Base, *args, **kwargs) -> dict[str, dict] | None:
    """``engine_startup_runs`` in a scratch directory; None without an engine."""
    python = venv.ensure_engine(base)
    if python is None:
        return None
    work = Path(tempfile.mkdtemp(prefix="vllm-fork-bench-engine-"))
    try:
        return engine_startup_runs(base, python, work, *args, **kwargs)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _rank_start(name: str, runs: dict) -> str:
    cold, warm = runs["cold"], runs["warm"]
    loads = warm.events[llm.AOT_LOADED]
    text = f"{name} cold {cold.startup_s:.0f} s, warm {warm.startup_s:.0f} s, "
    text += f"{loads} AOT loads"
    if warm.events[llm.RECOMPILED]:
        text += ", compiled again"
    if warm.base != cold.base:
        text += ", tokens differ"
    return text


def engine_ranks(bases: list[Base]) -> list[Row]:
    """The CPU engine with two ranks: tensor-parallel, then pipeline-parallel.

    ``LLM(...)`` of the tiny Llama without LoRA, ``tensor_parallel_size=2``
    or ``pipeline_parallel_size=2``, vLLM's multiprocess executor with each
    rank bound to one core (``VLLM_CPU_OMP_THREADS_BIND="0|1"``) and
    ``VLLM_USE_AOT_COMPILE=1``, in the base's CPU engine environment. Fork and
    pristine each start cold on a cache root of their own, then warm on it,
    alternating, as ``engine_startup`` does. Measured: ``LLM(...)``'s own
    seconds cold and warm, and the AOT loads the warm start's log reports
    (one per rank when every rank loads). Holds when the fork's warm start
    loaded on both ranks, compiled nothing again and gave the cold start's
    tokens.
    """
    rows = []
    for layout, engine_args in RANK_LAYOUTS.items():
        figure = f"CPU engine {layout}, cold and warm LLM(...) (AOT, no LoRA)"
        goal = "warm: 2 loads, 0 recompiles, same tokens"
        start = functools.partial(llm.run_engine, enable_lora=0, **engine_args)
        for base in bases:
            runs = _engine_runs(base, start_engine=start, **RANK_ENV)
            if runs is None:
                rows.append(_skipped(8, figure, base.name, goal, "no engine pinned"))
                continue
            warm, cold = runs["fork"]["warm"], runs["fork"]["cold"]
            holds = (
                _loaded_warm(warm)
                and warm.events[llm.AOT_LOADED] == 2
                and warm.base == cold.base
            )
            measured = "; ".join(_rank_start(n, runs[n]) for n in ("fork", "pristine"))
            rows.append(Row(8, figure, base.name, measured, goal, _verdict(holds)))
    return rows


def server_startup(bases: list[Base]) -> list[Row]:
    """The OpenAI API server's start-up, cold and then warm on its cache.

    ``python -m vllm.entrypoints.openai.api_server`` (what ``vllm serve``
    runs) on the tiny Llama with ``VLLM_USE_AOT_COMPILE=1``, without LoRA
    (with LoRA the CPU platform runs eager and saves no artifact), in the
    base's CPU engine environment. Fork and pristine each start cold on a
    cache root of their own, then warm on it, alternating; each start is
    timed from the process's launch until ``/health`` answers, then answers
    one greedy ``/v1/completions`` request and is stopped. Holds when the
    fork's warm start loaded the AOT artifact, compiled nothing again,
    answered as the cold start did, and was ready in at most
    ``ENGINE_WARM_OVER_COLD`` (0.8) of the cold start's time.
    """
    figure = "API server start-up until /health, warm / cold (AOT)"
    goal = f"<= {ENGINE_WARM_OVER_COLD}, loaded"
    rows = []
    for base in bases:
        env = {"VLLM_USE_AOT_COMPILE": "1"}
        runs = _engine_runs(base, llm.serve_once, **env)
        if runs is None:
            rows.append(_skipped(9, figure, base.name, goal, "no engine pinned"))
            continue
        ratio, fork_text = _startup("fork", runs["fork"], "ready_s")
        _, pristine_text = _startup("pristine", runs["pristine"], "ready_s")
        cold, warm = runs["fork"]["cold"], runs["fork"]["warm"]
        holds = (
            ratio <= ENGINE_WARM_OVER_COLD
            and _loaded_warm(warm)
            and warm.answer == cold.answer
        )
        measured = f"{fork_text}; {pristine_text}"
        rows.append(Row(9, figure, base.name, measured, goal, _verdict(holds)))
    return rows


def keys(bases: list[Base]) -> list[Row]:
    """Whether the compile cache key separates exactly what compiles
    differently, in the real CPU engine. Each cell is a pair of
    ``LLM(...)`` starts (the tiny Llama, LoRA on, ``VLLM_USE_AOT_COMPILE=1``,
    the base's default artifact format) on one cache root: A cold, then B,
    changed as the cell says (``forktools/engine/keys_figure.py`` lists them). Should
    load: a restart (A served a LoRA adapter loaded at runtime), the root
    copied to another path and the first moved away, another working
    directory, another user's ``HOME``, another hostname with the engine PID
    1 of a PID namespace (``unshare --uts --pid``), B from the files of the
    fork wheel ``make wheel`` builds, unpacked in another folder, two API
    servers (``vllm serve``) on other ports, B with another served model
    name, another seed, another engine's Ray placement bundle
    (``VLLM_RAY_BUNDLE_INDICES``), a restart after A served three adapters
    loaded at runtime, a fork update that rewords only a test patch and its message
    (B runs the label the tooling gives that queue); from v0.33.0, whose CPU
    runner decodes speculatively (LoRA off, a one-layer draft model): another
    ``num_speculative_tokens``, drafting token by token or in parallel,
    n-gram lookup instead of the draft model, and speculative decoding off.
    Should compile: another draft model (two layers; B should still load the
    target's artifact), LoRA
    partly, then fully wrapped (issue 55383; the engine core in-process so
    that A's patch reaches it), LoRA off, the model split into two pipeline
    stages (B's first stage saves under ``rank_0_0`` as A's whole model
    did), a changed Inductor setting,
    another dtype, an attribute ``LlamaConfig`` does not declare added to,
    or changed in, ``config.json`` at the same path. For B: whether it got
    A's ``torch_aot_compile/<hash>`` directory, loaded, compiled, and
    decoded the tokens of the same start on an empty root (a B that dies is
    recorded with its exception). On the fork tree and on pristine with only
    the CPU warm-load patch (pristine on CPU never loads a warm artifact; its
    hash directories do not depend on that). A start takes about 60 s on 2
    cores, a cell two or three starts per tree: every cell of one base about
    an hour; ``CELLS=`` runs only the cells named, and replaces only their
    rows of the matrix below. Holds when the fork has no false hit and no
    false miss that pristine lacks.
    """
    from forktools.engine import keys_figure

    goal = "fork: 0 false hits, no false miss pristine lacks"
    rows, sections = [], _keys_sections()
    for base in bases:
        outcomes = keys_figure.measure(base, _progress, checkout)
        if outcomes is None:
            why = "no engine pinned"
            rows.append(
                _skipped(keys_figure.NUMBER, keys_figure.FIGURE, base.name, goal, why)
            )
            continue
        cells = keys_figure.merged(sections.get(base.name, ""), outcomes)
        sections[base.name] = keys_figure.matrix(base, cells)
        counts = keys_figure.summary(cells)
        extra = keys_figure.fork_only_misses(cells)
        holds = counts["fork false hits"] == 0 and not extra
        text = "; ".join(
            f"{tree}: {counts[f'{tree} false hits']} false hits, "
            f"{counts[f'{tree} false misses']} false misses "
            f"of {counts[f'{tree} cells']} cells"
            for tree in keys_figure.TREES
        )
        if extra:
            text += f"; the fork alone misses: {', '.join(extra)}"
        number, figure = keys_figure.NUMBER, keys_figure.FIGURE
        rows.append(Row(number, figure, base.name, text, goal, _verdict(holds)))
    _write_keys_matrix(sections)
    return rows


def _keys_sections() -> dict[str, str]:
    """The keys matrix's section of each base, as last written."""
    sections = {}
    if KEYS_MATRIX.exists():
        for part in KEYS_MATRIX.read_text().split("\n### ")[1:]:
            name = part.split("\n", 1)[0].strip()
            if name.startswith("v"):
                sections[name] = "### " + part.rstrip("\n") + "\n"
    return sections


def _write_keys_matrix(sections: dict[str, str]) -> None:
    if not sections:
        return
    intro = (
        "## Compile cache keys\n\nWritten by `make bench FIGURES=keys` (row 10): "
        'each cell is A cold, then B on A\'s cache root. "same hash dir": B '
        "made no `torch_aot_compile/<hash>` beside A's; \"B's tokens\": against "
        "the same start on an empty root. The pristine column runs the release "
        "with only the CPU warm-load patch.\n"
    )
    body = "\n".join(sections[name] for name in sorted(sections, reverse=True))
    KEYS_MATRIX.write_text(f"{intro}\n{_keys_cells()}\n{body}")


def _keys_cells() -> str:
    """How each cell of the keys matrix is made."""
    from forktools.engine import keys_figure

    rows = [f"| {c.name} | {c.expect} | {c.why} |" for c in keys_figure.CELLS]
    head = "| cell | expect | how B differs from A |\n|---|---|---|"
    return "### How each cell is made\n\n" + "\n".join([head, *rows]) + "\n"


def fleet_phase(python: Path, tree: Path, work: Path, phase: str) -> list[dict]:
    """``FLEET_REPLICAS`` replicas of ``fleet_replica.py`` at once on one cache
    root, each PID 1 of its own PID namespace; a crashed one is ``{"error"}``."""
    with ExitStack() as logs:
        started = []
        for number in range(FLEET_REPLICAS):
            log = work / f"{phase}{number}.log"
            proc = subprocess.Popen(
                [*SAME_PID, str(python), str(BENCHMARKS / "fleet_replica.py")],
                cwd=tree,
                env=_script_env(tree, _replica_env(work, phase, number)),
                stdout=subprocess.PIPE,
                stderr=logs.enter_context(open(log, "w")),
                text=True,
            )
            started.append((proc, log))
        return [_replica_result(proc, log) for proc, log in started]


def _replica_env(work: Path, phase: str, number: int) -> dict[str, str]:
    env = {
        "VLLM_CACHE_ROOT": str(work / "vllm_cache"),
        "FLEET_REPLICA": f"{phase}{number}",
        # Each replica's own, as in separate containers.
        "TORCHINDUCTOR_CACHE_DIR": str(work / f"{phase}{number}-inductor"),
    }
    if phase == "writer":
        env["FLEET_BARRIER"] = str(work / "barrier")
        env["FLEET_REPLICAS"] = str(FLEET_REPLICAS)
    return env


def _replica_result(proc: subprocess.Popen, log: Path) -> dict:
    output, _ = proc.communicate()
    if proc.returncode == 0:
        return json.loads(output)
    lines = log.read_text(errors="replace").strip().splitlines()
    return {"error": lines[-1] if lines else f"exit {proc.returncode}"}


def fleet_runs(base: Base) -> dict[str, dict[str, list]]:
    """Writers then readers, on the fork tree and on its pristine checkout."""
    tree = materialize.ensure(base)
    python = venv.ensure(base)
    runs: dict[str, dict[str, list]] = {}
    with checkout(tree, "HEAD") as fork, checkout(tree, "base") as pristine:
        for name, checkout_dir in (("pristine", pristine), ("fork", fork)):
            with tempfile.TemporaryDirectory(prefix="vllm-fork-bench-fleet-") as tmp:
                work = Path(tmp)
                runs[name] = {}
                for phase in ("writer", "reader"):
                    _progress(f"{base.name} fleet, {FLEET_REPLICAS} {phase}s: {name}")
                    runs[name][phase] = fleet_phase(python, checkout_dir, work, phase)
                left = (work / "vllm_cache").rglob("*.tmp")
                runs[name]["tmp_left"] = [str(path) for path in left]
    return runs


def _fleet_counts(run: dict[str, list]) -> tuple[int, int, int, int]:
    """Writers correct, saves landed without a warning, readers warm, *.tmp."""
    writers = [writer for writer in run["writer"] if "error" not in writer]
    if any(writer["barrier_timed_out"] for writer in writers):
        raise ForkError(f"the writers' renames did not overlap: {run['writer']}")
    readers = [reader for reader in run["reader"] if "error" not in reader]
    return (
        sum(writer["correct"] for writer in writers),
        sum(
            writer["aot_artifacts_saved"] == 1 and _clean(writer) for writer in writers
        ),
        sum(r["correct"] and r["loaded_from_disk"] and _clean(r) for r in readers),
        len(run["tmp_left"]),
    )


def _clean(replica: dict) -> bool:
    return "error" not in replica and not replica["warnings"]


def _fleet_text(name: str, run: dict[str, list]) -> str:
    correct, landed, warm, left = _fleet_counts(run)
    n = FLEET_REPLICAS
    text = (
        f"{name}: {correct}/{n} writers correct, {landed}/{n} saves landed, "
        f"{warm}/{n} readers warm, {left} *.tmp"
    )
    faults = {
        _PATH_DIRS.sub("…/", writer.get("error") or writer["warnings"][0])
        for writer in run["writer"]
        if not _clean(writer)
    }
    if faults:
        text += f" ({'; '.join(sorted(faults))})"
    return text


def fleet(bases: list[Base]) -> list[Row]:
    """Identical replicas on one shared cache, as a fleet of containers runs.

    Four cold writers at once, each PID 1 of a PID namespace of its own
    (``unshare --pid --fork --mount-proc``, as containers of one image), on
    one ``VLLM_CACHE_ROOT``, compile ``aot_warm_start``'s model (2 blocks)
    in the base's default artifact format with real Inductor and AOT
    compile; each holds its renames of vLLM's saves into the cache at a
    barrier until all four are there, as replicas finishing one compile
    together would. Then four readers at once. The pristine ``base``
    checkout, then fork tree HEAD, each on a cache root of its own. Counted:
    writers that exit cleanly with correct outputs, writers whose AOT save
    landed without a compile-cache warning, readers that load warm with no
    warning, and ``*.tmp`` files left in the cache. Counts, not times: they
    hold on a loaded machine.
    """
    figure = f"fleet: {FLEET_REPLICAS} same-PID replicas on one cache, then readers"
    goal = f"{FLEET_REPLICAS}/{FLEET_REPLICAS} each, 0 *.tmp"
    rows = []
    for base in bases:
        runs = fleet_runs(base)
        correct, landed, warm, left = _fleet_counts(runs["fork"])
        holds = min(correct, landed, warm) == FLEET_REPLICAS and left == 0
        measured = "; ".join(_fleet_text(name, runs[name]) for name in runs)
        rows.append(Row(7, figure, base.name, measured, goal, _verdict(holds)))
    return rows


def timed_install(
    workdir: Path,
    name: str,
    cwd: Path,
    args: list[str],
    env: dict[str, str],
    uv: Path | None = None,
) -> float:
    """Seconds ``pip install`` (``uv pip install`` with ``uv``) takes in a
    fresh venv, deleted afterwards."""
    env_dir = workdir / f"{name}-venv"
    python = env_dir / "bin" / "python"
    if uv:
        venv_command = [uv, "venv", "-q", "--python", sys.executable, env_dir]
        subprocess.run(venv_command, check=True)
        command = [str(uv), "pip", "install", "--python", str(python), *args]
    else:
        subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
        command = [str(python), "-m", "pip", "install", *args]
    log = workdir / f"{name}-install.log"
    _progress(f"{name}: {' '.join(str(part) for part in command)}")
    try:
        with log.open("w") as output:
            started = time.monotonic()
            result = subprocess.run(
                command, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT
            )
            seconds = time.monotonic() - started
    finally:
        shutil.rmtree(env_dir, ignore_errors=True)
    if result.returncode != 0:
        tail = log.read_text()[-3000:]
        raise ForkError(f"{name}: install failed (exit {result.returncode}):\n{tail}")
    return seconds


def install_seconds(base: Base, dry_run: bool, uv: Path | None) -> tuple[float, float]:
    """Fork (``-e .`` in a fresh clone) and pristine install times.

    With uv the pristine install runs once before, unmeasured, so that both
    measured installs find uv's cache warm.
    """
    options = ["--dry-run"] if dry_run else []
    if not uv:
        options.insert(0, "--progress-bar=off")
    env = dict(os.environ, **{pins.BASE_ENV: base.name})
    pristine_args = [*options, f"vllm=={base.version}"]
    with tempfile.TemporaryDirectory(prefix="vllm-fork-bench-") as tmp:
        workdir = Path(tmp)
        clone = workdir / "clone"
        git.run(workdir, "clone", "--quiet", str(ROOT), str(clone))
        if uv:
            timed_install(workdir, "warm-up", workdir, pristine_args, env, uv)
        fork = timed_install(workdir, "fork", clone, [*options, "-e", "."], env, uv)
        pristine = timed_install(workdir, "pristine", workdir, pristine_args, env, uv)
    return fork, pristine


def install_time(bases: list[Base]) -> list[Row]:
    """``pip install -e .`` against ``pip install vllm==<version>``, wall time.

    The default base; each install in a fresh venv under a temporary
    directory, deleted right after it. The fork installs from a fresh
    ``git clone`` of this repository, so materializing its tree (from the
    warm download cache) is part of the measured time. The fork runs first,
    which leaves any warming of the package index to the pristine install.
    """
    return _install_rows(bases, 4, "pip install -e . / pip install vllm", uv=False)


def uv_install_time(bases: list[Base]) -> list[Row]:
    """``uv pip install -e .`` against ``uv pip install vllm==<version>``.

    As for pip, in fresh venvs made by ``uv venv``, with the pinned uv. uv
    hard-links from its own cache, so an install with a warm cache is quick
    and the fork's fixed costs weigh more: the pristine install runs once
    unmeasured first, so that both measured runs find the cache warm. Where
    the fork's extra seconds go (``uv pip install -v``, timestamped, v0.33.0,
    2026-12-05): resolving (2.4 s) and linking (0.4-0.8 s) cost what they cost
    pristine; materializing the tree in the fresh clone costs 1.6-3.3 s (the
    checkout of 6,225 source files from the shared pristine tree, 0.7-2.2 s,
    then ``git am`` of the queue, 0.2 s); setuptools runs ``setup.py`` three
    times, 0.25 s each; the editable wheel takes 0.3-0.5 s. So the ratio
    cannot reach 1.2 while a fresh clone writes its tree: 1.2 leaves the fork
    0.6 s, less than the checkout alone.
    """
    figure = "uv pip install -e . / uv pip install vllm"
    return _install_rows(bases, 5, figure, uv=True)


def _install_rows(bases: list[Base], number: int, figure: str, uv: bool) -> list[Row]:
    figure = f"{figure}, wall time"
    pinned = pins.load()
    base = pinned.get(pinned.default)
    mode = os.environ.get(INSTALL_ENV, "1")
    if base.name not in {selected.name for selected in bases}:
        return [_skipped(number, figure, base.name, "<= 1.2", "base not selected")]
    if mode == "0":
        return [_skipped(number, figure, base.name, "<= 1.2", f"{INSTALL_ENV}=0")]
    dry_run = mode == "dry-run"
    uv_binary = tools.installed(tools.UV) if uv else None
    fork, pristine = install_seconds(base, dry_run, uv_binary)
    ratio = fork / pristine
    measured = f"{ratio:.2f} ({fork:.0f} / {pristine:.0f} s)"
    holds = "dry run only" if dry_run else _verdict(ratio <= 1.2)
    return [Row(number, figure, base.name, measured, "<= 1.2", holds)]


# Each figure maps the selected bases to its rows, numbered as in the table.
FIGURES: list[Callable[[list[Base]], list[Row]]] = [
    aot_key_cost,
    aot_warm_start,
    lora_mapping,
    install_time,
    uv_install_time,
    engine_startup,
    fleet,
    engine_ranks,
    server_startup,
    keys,
]


def _cells(row: Row) -> tuple[str, ...]:
    return (
        str(row.number),
        row.figure,
        row.base,
        row.measured,
        row.goal,
        row.holds,
        row.when,
    )


def markdown(rows: list[Row]) -> str:
    lines = [HEADER, *(_cells(row) for row in rows)]
    table = [f"| {' | '.join(line)} |" for line in lines]
    table.insert(1, "|" + "---|" * len(HEADER))
    return "\n".join(table)


def report(rows: list[Row]) -> str:
    how = "\n".join(
        f"- **{func.__name__}**: " + " ".join(func.__doc__.split()) for func in FIGURES
    )
    return (
        "# Benchmarks\n\n"
        f"Written by `make bench` ({platform.machine()}, {os.cpu_count()} CPUs); "
        "each row says when its run started and the load average then. Each "
        "figure is the fork against pristine upstream measured side by side in "
        "one run, so the ratios hold on a loaded machine; the absolute times "
        "beside them do not. `make bench FIGURES=fleet,...` measures only the "
        "figures named and keeps the other rows.\n\n"
        f"{markdown(rows)}\n\n## How each figure is measured\n\n{how}\n"
        f"{_fault_matrix()}"
    )


def earlier_rows(text: str) -> list[Row]:
    """The rows of an earlier BENCHMARKS.md; those written before the table had
    a "when" column take the date its header gave."""
    earlier = _EARLIER_RUN.search(text)
    when = f"{earlier[1]} (load {earlier[2].rstrip(',.')})" if earlier else "?"
    rows = []
    for line in text.split("\n## ", 1)[0].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if line.startswith("| ") and cells[0].isdigit():
            if len(cells) == len(HEADER) - 1:
                cells.append(when)
            if len(cells) == len(HEADER):
                rows.append(Row(int(cells[0]), *cells[1:]))
    return rows


def _fault_matrix() -> str:
    """The compile cache fault table, which the queues' tests measure (each
    case a fresh process) rather than this command; kept beside the figures.
    Then the keys matrix, which ``keys`` writes."""
    tables = [path for path in (FAULT_MATRIX, KEYS_MATRIX) if path.exists()]
    return "".join("\n" + path.read_text() for path in tables)


def main(bases: list[Base], names: list[str] | None = None) -> int:
    figures = selected(names)
    when = (
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} (load {os.getloadavg()[0]:.1f})"
    )
    rows = [
        dataclasses.replace(row, when=when)
        for figure in figures
        for row in figure(bases)
    ]
    print(render([HEADER, *(_cells(row) for row in rows)]))
    # The exit status is this run's: rows kept from earlier runs had theirs.
    failed = any(row.failed for row in rows)
    if names:
        measured = {(row.number, row.base) for row in rows}
        kept = earlier_rows(BENCH_FILE.read_text()) if BENCH_FILE.exists() else []
        rows += [row for row in kept if (row.number, row.base) not in measured]
        rows.sort(key=lambda row: row.number)
    BENCH_FILE.write_text(report(rows))
    print(f"\nwritten to {BENCH_FILE}")
    return 1 if failed else 0


def selected(names: list[str] | None) -> list[Callable[[list[Base]], list[Row]]]:
    """The figures named (every figure for None), in the table's order."""
    known = {figure.__name__: figure for figure in FIGURES}
    unknown = sorted(set(names or []) - set(known))
    if unknown:
        raise ForkError(
            f"no figure named {', '.join(unknown)}; the figures are {', '.join(known)}"
        )
    return [figure for name, figure in known.items() if not names or name in names]
