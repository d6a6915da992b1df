"""``make bench FIGURES=keys``: does the compile cache key separate exactly
what compiles differently? A matrix of real-world changes between two
engine starts on one cache root, fork against pristine.

Each cell is a pair of ``LLM(...)`` starts of the base's CPU engine (the
tiny Llama of ``forktools/engine/engine_run.py``, LoRA on, AOT compile on; the
speculative cells, LoRA off, add its tiny draft models), or of its API
server: A cold on an empty cache root, then B, changed as the cell
says, on A's root.
Recorded for B: whether it got A's hash directory (no new
``torch_aot_compile/<hash>`` beside A's), whether it loaded an AOT artifact,
whether it compiled (saved an artifact or compiled again), and whether its
greedy tokens equal those of the same start on an empty root (A's, where B
runs what A ran). A cell that should load and compiled is a false miss; a
cell that should compile and got A's directory, loaded, or decoded other
tokens is a false hit.

Pristine on CPU never loads an AOT artifact on a warm start (the bug the
fork's CPU warm-load patch fixes), so its column is the pristine release
with that one patch; its hash directories do not depend on loading.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from forktools.engine import llm
from forktools.environments import venv
from forktools.queue import download, git, materialize, series
from forktools.queue.pins import Base, ForkError

CELLS_ENV = "VLLM_FORK_BENCH_CELLS"
NUMBER = 10
FIGURE = "compile cache keys: false hits and false misses over the cells"
WARM_LOAD_SUBJECT = "Load CPU AOT artifacts on warm start"
# A UTS and a PID namespace of their own: another hostname, the engine PID 1.
OTHER_HOST = (
    "unshare",
    "--uts",
    "--pid",
    "--fork",
    "--mount-proc",
    "sh",
    "-c",
    'hostname vllm-fork-other-host && exec "$@"',
    "sh",
)
MATRIX_HEADER = (
    "cell",
    "expect",
    "tree",
    "same hash dir",
    "B loaded",
    "B compiled",
    "B's tokens",
    "verdict",
)


@dataclass(frozen=True)
class Cell:
    name: str
    expect: str  # "load" or "compile"
    args: dict = field(default_factory=dict)  # B's engine arguments
    env: dict = field(default_factory=dict)  # B's extra environment
    first: dict = field(default_factory=dict)  # A's engine arguments
    both: dict = field(default_factory=dict)  # extra environment of every start
    move_root: bool = False  # the root copied elsewhere, the first moved away
    other_cwd: bool = False
    other_home: bool = False
    namespaces: bool = False  # another hostname, and PID 1 of a PID namespace
    relabel: bool = False  # B runs the label of a test-only queue update
    # A's and B's value of an attribute LlamaConfig does not declare, in
    # config.json (None: absent), the model at one path for both.
    hf_attribute: tuple[int | None, int | None] | None = None
    wheel: bool = False  # B runs the fork wheel's files, at another path
    server: bool = False  # API server starts, B on another port and name
    # Where B compiles one model and should load the others' artifacts (a
    # target and its drafter): how many it should load.
    loads: int = 0
    since: str = ""  # the first base whose CPU engine runs the cell
    why: str = ""  # what the cell stands for

    def runs_on(self, version: str) -> bool:
        return not self.since or _release(version) >= _release(self.since)

    @property
    def b_runs_otherwise(self) -> bool:
        """B's settings differ from A's (not only where or by whom it runs),
        so B's tokens need a cold start of their own to compare with."""
        runtime_only = set(self.first) <= RUNTIME_ONLY
        return (
            bool(self.args or self.env or self.relabel or self.hf_attribute)
            or not runtime_only
        )


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


# A's engine arguments that change what it does after starting, not the start.
RUNTIME_ONLY = {"adapters"}
UNWRAPPED = "model.layers.1.self_attn.qkv_proj"
IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
# Ranks in worker processes, one core each (unbound, the CPU worker asserts
# "Not enough allowed NUMA nodes"); LoRA off, as the ranks engine test runs.
ONE_STAGE = {"enable_lora": 0, "distributed_executor_backend": "mp"}
RANK_PER_CORE = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
# Draft-model speculative decoding, k = 2, LoRA off (as the speculative
# engine tests run); v0.19.1's CPU model runner refuses speculative decoding.
SPECULATIVE = {"enable_lora": 0, "draft": "draft", "draft_tokens": 2}
PARALLEL = {**SPECULATIVE, "parallel_drafting": 1}
SPECULATIVE_SINCE = "0.33.0"
SAME_TARGET = (
    "the target's graph is the same (only a method that returns auxiliary "
    "hidden states changes it, and neither start uses one; a cold B writes the "
    "target's Inductor code under A's content hash)"
)
CELLS = (
    Cell(
        "restart",
        "load",
        why="the same start again; A served its adapter, loaded at runtime",
    ),
    Cell(
        "root copied to another path",
        "load",
        move_root=True,
        why="A's root copied to another path and removed; B on the copy, as a "
        "cache volume mounted elsewhere (52154)",
    ),
    Cell(
        "another working directory",
        "load",
        other_cwd=True,
        why="B started from another directory",
    ),
    Cell(
        "another user's HOME",
        "load",
        other_home=True,
        why="B with another HOME, so other VLLM_CONFIG_ROOT and XDG defaults (47573)",
    ),
    Cell(
        "another hostname and PID",
        "load",
        namespaces=True,
        why="B in UTS and PID namespaces of its own (another hostname, the "
        "engine PID 1), as containers of one image",
    ),
    Cell(
        "the wheel at another path",
        "load",
        wheel=True,
        why="A from a checkout of the fork's tree, as pip install -e . runs it; B "
        "from make wheel's wheel unpacked in another folder (without its CUDA "
        "kernels: both load the CPU build's)",
    ),
    Cell(
        "another port and served model name",
        "load",
        server=True,
        why="A and B are vllm serve, each on a free port; B with --served-model-name",
    ),
    Cell("another seed", "load", args={"seed": 1}, why="B with seed=1"),
    Cell(
        "another engine's Ray bundle",
        "load",
        env={"VLLM_RAY_BUNDLE_INDICES": "1"},
        why="B with VLLM_RAY_BUNDLE_INDICES=1, as RL frameworks give each engine "
        "its own placement bundle (SkyRL 2167); only the Ray executor reads it, "
        "and neither start uses that executor",
    ),
    Cell(
        "another k drafting token by token",
        "load",
        first=SPECULATIVE,
        args={**SPECULATIVE, "draft_tokens": 3},
        since=SPECULATIVE_SINCE,
        why="A drafts k=2 tokens with a one-layer draft model, B k=3: each drafter "
        "pass is a one-token-per-request graph run k times, and the target's "
        "graph takes any token count; on GPU k also sets the CUDA graph sizes, "
        "which the CPU platform clears (53366); a cold B writes both models' "
        "Inductor code under A's content hashes",
    ),
    Cell(
        "another k drafting in parallel",
        "load",
        first=PARALLEL,
        args={**PARALLEL, "draft_tokens": 3},
        since=SPECULATIVE_SINCE,
        why="as above with parallel_drafting: the drafter takes all k slots in one "
        "pass of a graph over any token count; only a drafter that builds k into "
        "its layers (DFlash2's block_size = 1 + k, 53313) compiles differently, "
        "and it runs only in the GPU model runner",
    ),
    Cell(
        "another speculative method",
        "load",
        first=SPECULATIVE,
        args={"enable_lora": 0, "draft": "ngram", "draft_tokens": 2},
        since=SPECULATIVE_SINCE,
        why="A drafts with the draft model, B with n-gram lookup, which compiles "
        f"nothing: {SAME_TARGET}",
    ),
    Cell(
        "speculative decoding on, then off",
        "load",
        first=SPECULATIVE,
        args={"enable_lora": 0},
        since=SPECULATIVE_SINCE,
        why=f"A drafts with the draft model, B decodes without drafting: {SAME_TARGET}",
    ),
    Cell(
        "a restart after adapters added at runtime",
        "load",
        first={"adapters": 3},
        why="A served three adapters, each loaded at runtime",
    ),
    Cell(
        "fork update: a test patch and a message only",
        "load",
        relabel=True,
        why="B runs the version label the tooling gives the queue with its last "
        "fork-only test patch and its message reworded",
    ),
    Cell(
        "LoRA partly, then fully wrapped",
        "compile",
        first={"unwrapped": UNWRAPPED},
        both=IN_PROCESS,
        why=f"A leaves {UNWRAPPED} out of the LoRA targets (55383); the engine core "
        "in-process for both, so that the patch reaches it",
    ),
    Cell(
        "LoRA on, then off",
        "compile",
        args={"enable_lora": 0},
        why="B with enable_lora=0",
    ),
    Cell(
        "the model split into two pipeline stages",
        "compile",
        first=ONE_STAGE,
        args={**ONE_STAGE, "pipeline_parallel_size": 2},
        both=RANK_PER_CORE,
        why="A the whole model, B pipeline_parallel_size=2, whose first stage saves "
        "under rank_0_0 as A did (stage against stage: the ranks engine test); "
        "LoRA off, the multiprocess executor, one core per rank, for both",
    ),
    Cell(
        "a changed Inductor setting",
        "compile",
        env={"TORCHINDUCTOR_SIZE_ASSERTS": "0"},
        why="B with TORCHINDUCTOR_SIZE_ASSERTS=0 (fix 1)",
    ),
    Cell("another dtype", "compile", args={"dtype": "bfloat16"}, why="B in bfloat16"),
    Cell(
        "another draft model",
        "compile",
        first=SPECULATIVE,
        args={**SPECULATIVE, "draft": "draft-deeper"},
        loads=1,
        since=SPECULATIVE_SINCE,
        why="B's draft model has two layers, A's one: B compiles its drafter (47911) "
        f"and should load the target's artifact: {SAME_TARGET}",
    ),
    Cell(
        "an undeclared HF config attribute added",
        "compile",
        hf_attribute=(None, 2),
        why="B's config.json, at A's path, gains an attribute LlamaConfig does "
        "not declare (fix 2)",
    ),
    Cell(
        "an undeclared HF config attribute changed",
        "compile",
        hf_attribute=(1, 2),
        why="that attribute's value in config.json goes from 1 to 2 (fix 2)",
    ),
)


@dataclass
class Outcome:
    cell: Cell
    tree: str
    same_dir: bool
    loaded: int  # artifacts
    compiled: bool
    tokens_equal: bool
    died: str = ""  # B's exception, where B did not finish its start

    @property
    def verdict(self) -> str:
        if self.cell.expect == "load":
            if self.compiled or not self.same_dir:
                return "FALSE MISS"
            if self.died:
                return "B died"
            return "ok" if self.loaded and self.tokens_equal else "wrong tokens"
        if self.loaded < self.cell.loads:
            return "B died" if self.died else "FALSE MISS"
        wrong_dir = self.same_dir and not self.cell.loads
        if wrong_dir or self.loaded > self.cell.loads or not self.tokens_equal:
            return "FALSE HIT"
        return "B died" if self.died else "ok"

    def cells(self) -> tuple[str, ...]:
        if self.died:
            tokens = f"B died: {self.died}"
        else:
            tokens = "equal" if self.tokens_equal else "DIFFER"
        return (
            self.cell.name,
            self.cell.expect,
            self.tree,
            _yes(self.same_dir),
            _yes(self.loaded),
            _yes(self.compiled),
            tokens,
            self.verdict,
        )


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def selected_cells() -> list[Cell]:
    """``CELLS=`` (``VLLM_FORK_BENCH_CELLS``): names, or parts of names,
    comma-separated; every cell when unset."""
    wanted = [w.strip() for w in os.environ.get(CELLS_ENV, "").split(",") if w.strip()]
    if not wanted:
        return list(CELLS)
    picked = [cell for cell in CELLS if any(w in cell.name for w in wanted)]
    if not picked:
        names = "; ".join(cell.name for cell in CELLS)
        raise ForkError(f"CELLS={','.join(wanted)} names no cell; the cells: {names}")
    return picked


def aot_dirs(root: Path) -> set[str]:
    """The AOT hash directories under a cache root, by name."""
    aot = root / "torch_compile_cache" / "torch_aot_compile"
    return {path.name for path in aot.glob("*")} if aot.exists() else set()


class Starts:
    """Engine starts of one tree in one scratch directory."""

    def __init__(self, python: Path, model: Path, tree: Path, work: Path, say):
        self.python, self.model, self.tree, self.work = python, model, tree, work
        self.say = say
        self.count = 0
        self.log = work / "start-0.log"  # the last start's

    def start(
        self,
        root: Path,
        tree: Path | None = None,
        cwd: Path | None = None,
        prefix: tuple[str, ...] = (),
        model: Path | None = None,
        args: dict | None = None,
        env: dict | None = None,
        served_name: str | None = None,
    ) -> llm.Run | llm.ServerStart:
        """``LLM(...)``, or the API server where ``served_name`` is given
        (``""``: the model's path)."""
        self.count += 1
        environment = llm.environment(
            tree or self.tree,
            root,
            TORCHINDUCTOR_CACHE_DIR=str(root.parent / "inductor"),
            **llm.AOT_COMPILE,
            **(env or {}),
        )
        log = self.log = self.work / f"start-{self.count}.log"
        self.say(f"start {self.count}: {log.name}")
        if served_name is not None:
            return llm.serve_once(
                self.python, model or self.model, environment, log, served_name
            )
        return llm.run_engine(
            self.python,
            model or self.model,
            environment,
            log,
            cwd or self.work,
            prefix,
            **(args or {}),
        )


def with_attribute(model: Path, copy: Path, value: int | None) -> Path:
    """``copy``, a copy of ``model`` whose config.json has the undeclared
    attribute at ``value`` (absent when None)."""
    if not copy.exists():
        shutil.copytree(model, copy)
    config = json.loads((copy / "config.json").read_text())
    config.pop(HF_ATTRIBUTE, None)
    if value is not None:
        config[HF_ATTRIBUTE] = value
    (copy / "config.json").write_text(json.dumps(config, indent=1))
    return copy


HF_ATTRIBUTE = "vllm_fork_bench_attribute"


def died_of(log: Path) -> str:
    """The last exception a start's log names (a traceback's last line, or
    an engine process's error line), else its last line."""
    text = log.read_text(errors="replace") if log.exists() else ""
    named = re.findall(r"\b([A-Z]\w*(?:Error|Exception)(?:: .*)?)$", text, re.M)
    lines = named or [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip()[:120] if lines else "an empty log"


def run_cell(
    cell: Cell, starts: Starts, relabeled: Path | None, wheel: Path | None = None
) -> Outcome:
    """A cold, then B on A's root; B's tokens against B cold on an empty root."""
    # Inductor links through a shell command: a quote in a path breaks it.
    work = starts.work / re.sub(r"[^A-Za-z0-9]+", "-", cell.name).strip("-")
    work.mkdir(parents=True)
    root = work / "a" / "root"
    root.mkdir(parents=True)
    served = "" if cell.server else None
    model = None
    if cell.hf_attribute:
        model = with_attribute(starts.model, work / "model", cell.hf_attribute[0])
    a = {"args": cell.first, "env": cell.both, "model": model, "served_name": served}
    first = starts.start(root, **a)
    before = aot_dirs(root)
    if cell.move_root:
        moved = work / "b" / "root"
        moved.parent.mkdir()
        shutil.copytree(root, moved, symlinks=True)
        shutil.rmtree(root)
        root = moved
    cwd = work / "elsewhere" if cell.other_cwd else None
    if cwd:
        cwd.mkdir()
    b_tree = relabeled if cell.relabel else wheel if cell.wheel else None
    env = {**cell.both, **cell.env}
    if cell.other_home:
        env["HOME"] = str(work / "another-home")
        Path(env["HOME"]).mkdir()
    if cell.hf_attribute:
        with_attribute(starts.model, model, cell.hf_attribute[1])
    b = {
        "args": cell.args,
        "env": env,
        "model": model,
        "served_name": "another-name" if cell.server else None,
    }
    prefix = OTHER_HOST if cell.namespaces else ()
    try:
        second = starts.start(root, b_tree, cwd, prefix, **b)
    except ForkError:
        log = starts.log
        kept = download.cache_dir() / "logs" / f"bench-keys-{work.name}-{log.name}"
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, kept)
        starts.say(f"B died; its log is kept in {kept}")
        events = llm.log_events(log.read_text(errors="replace"))
        return _outcome(cell, before, aot_dirs(root), events, False, died_of(log))
    after = aot_dirs(root)
    if cell.b_runs_otherwise:
        fresh = work / "c" / "root"
        fresh.mkdir(parents=True)
        reference = starts.start(fresh, b_tree, **b)
    else:
        reference = first
    equal = second.tokens == reference.tokens
    return _outcome(cell, before, after, second.events, equal)


def _outcome(cell, before, after, events, tokens_equal, died="") -> Outcome:
    return Outcome(
        cell,
        "",
        same_dir=after == before,
        loaded=events[llm.AOT_LOADED],
        compiled=events[llm.AOT_SAVED] > 0 or events[llm.RECOMPILED] > 0,
        tokens_equal=tokens_equal,
        died=died,
    )


def relabeled_label(base: Base) -> str:
    """The version label the tooling gives the queue after an update that
    rewords the last fork-only test patch's message and a docstring of its
    test: what a fleet gets from such a fork update."""
    entries = series.entries(base)
    texts = [entry.text(base) for entry in entries]
    tests = [i for i, entry in enumerate(entries) if not entry.is_fix(base)]
    if not tests:
        raise ForkError(f"{base.name} has no test patch to reword")
    last = tests[-1]
    texts[last] = texts[last].replace("\n\n", "\n\nReworded.\n\n", 1)
    texts[last] = texts[last].replace('+"""', '+"""Reworded. ', 1)
    label = series.label_of(base, base.wheel_for_this_machine(), texts)
    return f"{base.version}+fork.{label}"


def warm_load_commit(tree: Path, base: Base) -> str:
    """A commit of the pristine release with only the CPU warm-load patch."""
    [entry] = [e for e in series.entries(base) if WARM_LOAD_SUBJECT in e.subject(base)]
    with tempfile.TemporaryDirectory() as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git.run(tree, "read-tree", "base", env=index)
        git.run(tree, "apply", "--cached", str(base.patch_dir / entry.name), env=index)
        written = git.run(tree, "write-tree", env=index).stdout.strip()
        message = f"pristine {base.version} with {entry.name} alone"
        return git.run(
            tree, "commit-tree", written, "-p", "base", "-m", message
        ).stdout.strip()


def wheel_site(base: Base, work: Path) -> Path:
    """The fork wheel ``make wheel`` builds for this machine, its files
    unpacked as an installer lays them out in another environment, without
    its CUDA kernels: this machine cannot load them, and every start loads
    the CPU build's kernels instead, as the tree's starts do."""
    from forktools.shipping import wheel

    dist = work / "dist"
    built = wheel.build(base, base.wheel_for_this_machine(), dist)
    site = work / "site-packages"
    with zipfile.ZipFile(built.path) as archive:
        members = [
            name
            for name in archive.namelist()
            if name.startswith("vllm/") and not name.endswith(".so")
        ]
        archive.extractall(site, members)
    shutil.rmtree(dist)
    return site


def measure(
    base: Base, say: Callable[[str], None], checkout: Callable
) -> list[Outcome] | None:
    """Every selected cell the base's engine runs, on the fork tree and on
    pristine with the warm-load fix, each in a ``checkout(tree, revision)`` of
    its own; None when the base pins no engine."""
    python = venv.ensure_engine(base)
    if python is None:
        return None
    cells = [cell for cell in selected_cells() if cell.runs_on(base.version)]
    if not cells:
        return []
    tree = materialize.ensure(base)
    work = Path(tempfile.mkdtemp(prefix="vllm-fork-bench-keys-"))
    outcomes: list[Outcome] = []
    try:
        llm.make_model(python, work / "model")
        pristine = warm_load_commit(tree, base)
        with (
            checkout(tree, "HEAD") as fork,
            checkout(tree, pristine) as plain,
            checkout(tree, "HEAD") as relabeled,
        ):
            (relabeled / materialize.VERSION_FILE).write_text(
                materialize._version_module(relabeled_label(base), "bench")
            )
            site = wheel_site(base, work) if any(c.wheel for c in cells) else None
            for name, checkout in zip(TREES, (fork, plain), strict=True):
                starts = Starts(
                    python, work / "model", checkout, work / name.split("+")[0], say
                )
                starts.work.mkdir()
                for cell in cells:
                    if (cell.relabel or cell.wheel) and name != "fork":
                        continue  # the fork's label and wheel; pristine has neither
                    say(f"{base.name} {name}: {cell.name}")
                    outcome = run_cell(cell, starts, relabeled, site)
                    outcome.tree = name
                    outcomes.append(outcome)
    except ForkError as error:
        # The failed start's log is in there: keep it.
        raise ForkError(f"{error} (the runs' files are kept in {work})") from None
    shutil.rmtree(work, ignore_errors=True)
    return outcomes


TREES = ("fork", "pristine+warm load")


def merged(earlier: str, outcomes: list[Outcome]) -> list[tuple[str, ...]]:
    """The matrix rows of an earlier section, each replaced by this run's
    outcome of its cell and tree (a ``CELLS=`` run measures some)."""
    rows = {}
    for line in earlier.splitlines():
        cells = tuple(cell.strip() for cell in line.strip().strip("|").split(" | "))
        is_row = line.startswith("| ") and len(cells) == len(MATRIX_HEADER)
        if is_row and cells != MATRIX_HEADER:
            rows[cells[0], cells[2]] = cells
    for outcome in outcomes:
        rows[outcome.cell.name, outcome.tree] = outcome.cells()
    order = {cell.name: number for number, cell in enumerate(CELLS)}
    return sorted(
        rows.values(),
        key=lambda row: (TREES.index(row[2]), order.get(row[0], len(order))),
    )


def fork_only_misses(rows: list[tuple[str, ...]]) -> list[str]:
    """Cells where the fork misses and pristine (with the warm-load fix),
    run the same way, does not."""
    plain = {row[0]: row[7] for row in rows if row[2] != "fork"}
    return [
        row[0]
        for row in rows
        if row[2] == "fork"
        and row[7] == "FALSE MISS"
        and plain.get(row[0]) != "FALSE MISS"
    ]


def summary(rows: list[tuple[str, ...]]) -> dict[str, int]:
    counts = {}
    for tree in TREES:
        ours = [row for row in rows if row[2] == tree]
        counts[f"{tree} false hits"] = sum(row[7] == "FALSE HIT" for row in ours)
        counts[f"{tree} false misses"] = sum(row[7] == "FALSE MISS" for row in ours)
        counts[f"{tree} cells"] = len(ours)
    return counts


def matrix(base: Base, rows: list[tuple[str, ...]]) -> str:
    lines = [f"| {' | '.join(row)} |" for row in [MATRIX_HEADER, *rows]]
    lines.insert(1, "|" + "---|" * len(MATRIX_HEADER))
    return f"### {base.name}\n\n" + "\n".join(lines) + "\n"
