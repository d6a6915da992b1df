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

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from forktools import git, materialize, pins, venv, verify
from forktools.pins import ROOT, Base, ForkError
from forktools.table import render

BENCH_FILE = ROOT / "BENCHMARKS.md"
BENCHMARKS = ROOT / "forktools" / "benchmarks"
INSTALL_ENV = "VLLM_FORK_BENCH_INSTALL"
LORA_BASE = "v0.19.1"
LORA_ROUNDS = 4
LORA_STEPS = 10_000
HEADER = ("#", "figure", "base", "measured", "goal", "holds")


@dataclass(frozen=True)
class Row:
    number: int
    figure: str
    base: str
    measured: str
    goal: str
    holds: str

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
    with verify.scratch_worktree(tree) as path:
        git.run(path, "checkout", "--quiet", "--detach", revision)
        yield path


def run_script(python: Path, tree: Path, name: str, *args: str) -> dict:
    """Run ``forktools/benchmarks/<name>.py`` against ``tree``; its JSON result."""
    env = dict(
        os.environ,
        VLLM_TARGET_DEVICE="cpu",
        PYTHONPATH=os.pathsep.join([str(tree), str(verify.HARNESS)]),
        HF_HUB_OFFLINE="1",
    )
    script = BENCHMARKS / f"{name}.py"
    result = subprocess.run(
        [str(python), str(script), *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise ForkError(
            f"{script.name} failed in {tree} (exit {result.returncode}):\n"
            f"{result.stderr[-3000:]}"
        )
    return json.loads(result.stdout)


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
    memo = {
        name: {r["slot_layout_memo"] for r in runs} for name, runs in results.items()
    }
    if memo != {"fork": {True}, "pristine": {False}}:
        raise ForkError(
            f"{base.name}: expected the slot-layout memo in the fork tree only, "
            f"found it as {memo}; is patch 0003 still in the queue?"
        )
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


def timed_pip_install(
    workdir: Path, name: str, cwd: Path, pip_args: list[str], env: dict[str, str]
) -> float:
    """Seconds ``pip install`` takes in a fresh venv, deleted afterwards."""
    env_dir = workdir / f"{name}-venv"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    log = workdir / f"{name}-pip.log"
    command = [str(env_dir / "bin" / "python"), "-m", "pip", "install", *pip_args]
    _progress(f"{name}: pip install {' '.join(pip_args)}")
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
        raise ForkError(
            f"{name}: pip install failed (exit {result.returncode}):\n{tail}"
        )
    return seconds


def install_seconds(base: Base, dry_run: bool) -> tuple[float, float]:
    """Fork (``pip install -e .`` in a fresh clone) and pristine install times."""
    options = ["--progress-bar", "off", *(["--dry-run"] if dry_run else [])]
    env = dict(os.environ, **{pins.BASE_ENV: base.name})
    with tempfile.TemporaryDirectory(prefix="vllm-fork-bench-") as tmp:
        workdir = Path(tmp)
        clone = workdir / "clone"
        git.run(workdir, "clone", "--quiet", str(ROOT), str(clone))
        fork = timed_pip_install(workdir, "fork", clone, [*options, "-e", "."], env)
        pristine_args = [*options, f"vllm=={base.version}"]
        pristine = timed_pip_install(workdir, "pristine", workdir, pristine_args, env)
    return fork, pristine


def install_time(bases: list[Base]) -> list[Row]:
    """``pip install -e .`` against ``pip install vllm==<version>``, wall time.

    The default base; each install in a fresh venv under a temporary
    directory, deleted right after it. The fork installs from a fresh
    ``git clone`` of this repository, so materializing its tree (from the
    warm download cache) is part of the measured time. The fork runs first,
    which leaves any warming of the package index to the pristine install.
    """
    figure = "pip install -e . / pip install vllm, wall time"
    pinned = pins.load()
    base = pinned.get(pinned.default)
    mode = os.environ.get(INSTALL_ENV, "1")
    if base.name not in {selected.name for selected in bases}:
        return [_skipped(4, figure, base.name, "<= 1.2", "base not selected")]
    if mode == "0":
        return [_skipped(4, figure, base.name, "<= 1.2", f"{INSTALL_ENV}=0")]
    dry_run = mode == "dry-run"
    fork, pristine = install_seconds(base, dry_run)
    ratio = fork / pristine
    measured = f"{ratio:.2f} ({fork:.0f} / {pristine:.0f} s)"
    holds = "dry run only" if dry_run else _verdict(ratio <= 1.2)
    return [Row(4, figure, base.name, measured, "<= 1.2", holds)]


# Each figure maps the selected bases to its rows, numbered as in the table.
# Figures 1 (AOT module-tree key cost) and 2 (warm-start recompiles) go first.
FIGURES: list[Callable[[list[Base]], list[Row]]] = [lora_mapping, install_time]


def _cells(row: Row) -> tuple[str, ...]:
    return (str(row.number), row.figure, row.base, row.measured, row.goal, row.holds)


def markdown(rows: list[Row]) -> str:
    lines = [HEADER, *(_cells(row) for row in rows)]
    table = [f"| {' | '.join(line)} |" for line in lines]
    table.insert(1, "|" + "---|" * len(HEADER))
    return "\n".join(table)


def report(rows: list[Row], started: datetime, load: float) -> str:
    how = "\n".join(
        f"- **{func.__name__}**: " + " ".join(func.__doc__.split()) for func in FIGURES
    )
    return (
        "# Benchmarks\n\n"
        f"Written by `make bench` on {started:%Y-%m-%d %H:%M} UTC "
        f"({platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{load:.1f} at the start). Each figure is the fork against pristine "
        "upstream measured side by side in one run, so the ratios hold on a "
        "loaded machine; the absolute times beside them do not.\n\n"
        f"{markdown(rows)}\n\n## How each figure is measured\n\n{how}\n"
    )


def main(bases: list[Base]) -> int:
    started = datetime.now(timezone.utc)
    load = os.getloadavg()[0]
    rows = [row for figure in FIGURES for row in figure(bases)]
    print(render([HEADER, *(_cells(row) for row in rows)]))
    BENCH_FILE.write_text(report(rows, started, load))
    print(f"\nwritten to {BENCH_FILE}")
    return 1 if any(row.failed for row in rows) else 0
