"""``make bench FIGURES=keys``: does the compile cache key separate exactly
what compiles differently? A matrix of real-world changes between two
engine starts on one cache root, fork against pristine.

Each cell is a pair of ``LLM(...)`` starts of the base's CPU engine (the
tiny Llama of ``forktools/engine_run.py``, LoRA on, AOT compile on): A cold
on an empty cache root, then B, changed as the cell says, on A's root.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from forktools import engine, git, materialize, queue, venv
from forktools.pins import Base, ForkError

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
    move_root: bool = False  # the root copied elsewhere, the first moved away
    other_cwd: bool = False
    other_home: bool = False
    namespaces: bool = False  # another hostname, and PID 1 of a PID namespace
    relabel: bool = False  # B runs the label of a test-only queue update
    hf_attribute: bool = False  # B's config.json has an attribute A's lacks
    why: str = ""  # what the cell stands for


CELLS = (
    Cell("restart", "load", why="the same start again"),
    Cell(
        "root copied to another path",
        "load",
        move_root=True,
        why="a cache volume mounted elsewhere (52154)",
    ),
    Cell("another working directory", "load", other_cwd=True),
    Cell("another user's HOME", "load", other_home=True, why="47573"),
    Cell(
        "another hostname and PID",
        "load",
        namespaces=True,
        why="UTS and PID namespaces, as containers of one image",
    ),
    Cell("another seed", "load", args={"seed": 1}),
    Cell(
        "fork update: a test patch and a message only",
        "load",
        relabel=True,
        why="the label of the queue with its last fork-only test patch reworded",
    ),
    Cell("LoRA on, then off", "compile", args={"enable_lora": 0}),
    Cell(
        "a changed Inductor setting",
        "compile",
        env={"TORCHINDUCTOR_SIZE_ASSERTS": "0"},
        why="TORCHINDUCTOR_SIZE_ASSERTS=0 (fix 1)",
    ),
    Cell("another dtype", "compile", args={"dtype": "bfloat16"}),
    Cell(
        "an undeclared HF config attribute added",
        "compile",
        hf_attribute=True,
        why="fix 2: an attribute LlamaConfig does not declare, in config.json",
    ),
)


@dataclass
class Outcome:
    cell: Cell
    tree: str
    same_dir: bool
    loaded: bool
    compiled: bool
    tokens_equal: bool

    @property
    def verdict(self) -> str:
        if self.cell.expect == "load":
            if self.compiled or not self.same_dir:
                return "FALSE MISS"
            return "ok" if self.loaded and self.tokens_equal else "wrong tokens"
        if self.same_dir or self.loaded or not self.tokens_equal:
            return "FALSE HIT"
        return "ok"

    def cells(self) -> tuple[str, ...]:
        return (
            self.cell.name,
            self.cell.expect,
            self.tree,
            _yes(self.same_dir),
            _yes(self.loaded),
            _yes(self.compiled),
            "equal" if self.tokens_equal else "DIFFER",
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

    def other_model(self) -> Path:
        """The model with one more, undeclared, attribute in its config."""
        other = self.model.with_name("model-with-attribute")
        if not other.exists():
            shutil.copytree(self.model, other)
            config = json.loads((other / "config.json").read_text())
            config["vllm_fork_bench_attribute"] = 2
            (other / "config.json").write_text(json.dumps(config, indent=1))
        return other

    def start(
        self,
        root: Path,
        tree: Path | None = None,
        cwd: Path | None = None,
        prefix: tuple[str, ...] = (),
        **change,
    ) -> engine.Run:
        self.count += 1
        args, env = change.get("args", {}), change.get("env", {})
        model = self.other_model() if change.get("hf_attribute") else self.model
        environment = engine.environment(
            tree or self.tree,
            root,
            TORCHINDUCTOR_CACHE_DIR=str(root.parent / "inductor"),
            **engine.AOT_COMPILE,
            **env,
        )
        log = self.work / f"start-{self.count}.log"
        self.say(f"start {self.count}: {log.name}")
        return engine.run_engine(
            self.python, model, environment, log, cwd or self.work, prefix, **args
        )


def run_cell(cell: Cell, starts: Starts, relabeled: Path | None) -> Outcome:
    """A cold, then B on A's root; B's tokens against B cold on an empty root."""
    # Inductor links through a shell command: a quote in a path breaks it.
    work = starts.work / re.sub(r"[^A-Za-z0-9]+", "-", cell.name).strip("-")
    work.mkdir(parents=True)
    root = work / "a" / "root"
    root.mkdir(parents=True)
    first = starts.start(root)
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
    b_tree = relabeled if cell.relabel else None
    env = dict(cell.env)
    if cell.other_home:
        env["HOME"] = str(work / "another-home")
        Path(env["HOME"]).mkdir()
    change = {"args": cell.args, "env": env, "hf_attribute": cell.hf_attribute}
    prefix = OTHER_HOST if cell.namespaces else ()
    second = starts.start(root, b_tree, cwd, prefix, **change)
    after = aot_dirs(root)
    # A run of other settings needs its own cold reference; a run elsewhere not.
    changed_run = bool(cell.args or cell.env or cell.relabel or cell.hf_attribute)
    if changed_run:
        fresh = work / "c" / "root"
        fresh.mkdir(parents=True)
        reference = starts.start(fresh, b_tree, **change)
    else:
        reference = first
    events = second.events
    return Outcome(
        cell,
        "",
        same_dir=after == before,
        loaded=events[engine.AOT_LOADED] > 0,
        compiled=events[engine.AOT_SAVED] > 0 or events[engine.RECOMPILED] > 0,
        tokens_equal=(second.base, second.lora) == (reference.base, reference.lora),
    )


def relabeled_label(base: Base) -> str:
    """The version label the tooling gives the queue after an update that
    rewords the last fork-only test patch's message and a docstring of its
    test: what a fleet gets from such a fork update."""
    entries = queue.entries(base)
    texts = [entry.text(base) for entry in entries]
    tests = [i for i, entry in enumerate(entries) if not entry.is_fix(base)]
    if not tests:
        raise ForkError(f"{base.name} has no test patch to reword")
    last = tests[-1]
    texts[last] = texts[last].replace("\n\n", "\n\nReworded.\n\n", 1)
    texts[last] = texts[last].replace('+"""', '+"""Reworded. ', 1)
    label = queue.label_of(base, base.wheel_for_this_machine(), texts)
    return f"{base.version}+fork.{label}"


def warm_load_commit(tree: Path, base: Base) -> str:
    """A commit of the pristine release with only the CPU warm-load patch."""
    [entry] = [e for e in queue.entries(base) if WARM_LOAD_SUBJECT in e.subject(base)]
    with tempfile.TemporaryDirectory() as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git.run(tree, "read-tree", "base", env=index)
        git.run(tree, "apply", "--cached", str(base.patch_dir / entry.name), env=index)
        written = git.run(tree, "write-tree", env=index).stdout.strip()
        message = f"pristine {base.version} with {entry.name} alone"
        return git.run(
            tree, "commit-tree", written, "-p", "base", "-m", message
        ).stdout.strip()


def measure(base: Base, say: Callable[[str], None]) -> list[Outcome] | None:
    """Every selected cell on the fork tree and on pristine with the warm-load
    fix; None when the base pins no engine."""
    from forktools import bench

    python = venv.ensure_engine(base)
    if python is None:
        return None
    cells = selected_cells()
    tree = materialize.ensure(base)
    work = Path(tempfile.mkdtemp(prefix="vllm-fork-bench-keys-"))
    outcomes: list[Outcome] = []
    try:
        engine.make_model(python, work / "model")
        pristine = warm_load_commit(tree, base)
        with (
            bench.checkout(tree, "HEAD") as fork,
            bench.checkout(tree, pristine) as plain,
            bench.checkout(tree, "HEAD") as relabeled,
        ):
            (relabeled / materialize.VERSION_FILE).write_text(
                materialize._version_module(relabeled_label(base), "bench")
            )
            for name, checkout in zip(TREES, (fork, plain), strict=True):
                starts = Starts(
                    python, work / "model", checkout, work / name.split("+")[0], say
                )
                starts.work.mkdir()
                for cell in cells:
                    if cell.relabel and name != "fork":
                        continue  # pristine's version is the release's
                    say(f"{base.name} {name}: {cell.name}")
                    outcome = run_cell(cell, starts, relabeled)
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
