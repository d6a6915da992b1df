"""The queue's read-only cache tests, run again without capabilities.

As root, a directory's mode stops no write (CAP_DAC_OVERRIDE), so there
those tests make a cache read-only with a bind mount; unprivileged, as on
upstream's CI, they use file modes instead. ``make verify`` runs every
row's tests with its fix as the caller, the bind mount where CI runs as
root; this stage runs the read-only ones again with every capability
dropped, so that both ways run, and fails on a skip.

The tests run in a clean checkout of the queue's tree, as ``make verify``'s
do. A passing run is kept as ``patches/<base>/read_only.json``, keyed like a
ledger row (the queue's tree, the locked environments, the harness, the
proof code and this file, the tests) and reused while its key holds, but in
the turn of the audit's rotation that holds it (a row ``<base>/read-only``
of ``make verify``'s rotation); ``fresh`` runs them all again.
"""

from __future__ import annotations

import datetime
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from forktools.environments import venv
from forktools.proof import checkouts, ledger, runner, schedule, verify
from forktools.queue import commits, git, materialize
from forktools.queue.pins import Base, ForkError

READ_ONLY = "test_read_only"
RECORD = "read_only.json"
DROP_CAPABILITIES = ("setpriv", "--inh-caps=-all", "--bounding-set=-all", "--")


def read_only_tests(tree: Path) -> list[str]:
    """The read-only tests among those the queue's commits add, which are
    the tests ``make verify`` runs."""
    commit_ids = git.out(tree, "rev-list", "base..HEAD").split()
    added = [
        nodeid for commit in commit_ids for nodeid in commits.added_tests(tree, commit)
    ]
    return sorted({n for n in added if n.partition("::")[2].startswith(READ_ONLY)})


def problems(nodeids: list[str], outcome: runner.Outcome) -> list[str]:
    """Each read-only test that did not run and pass, every case of it."""
    calls = sorted(outcome.calls.items())
    found = [f"{nodeid}: {result}" for nodeid, result in calls if result != "passed"]
    ran = {nodeid.partition("[")[0] for nodeid in outcome.calls}
    found += [f"{nodeid}: did not run" for nodeid in nodeids if nodeid not in ran]
    return found + outcome.errors


def inputs(base: Base, tree: Path, nodeids: list[str]) -> dict:
    """What a run without capabilities depends on, as a ledger row's key."""
    environment = ledger.environment_digest(base, venv.environments(base))
    return {
        "tree_with_fix": commits.tree_with_fix(tree),
        "environment": environment,
        **ledger.code_digests(),
        "read_only": ledger.content_digest(Path(__file__).resolve()),
        "tests": nodeids,
        "platform": ledger.coarse_platform(),
    }


def recorded(base: Base) -> dict:
    file = base.patch_dir / RECORD
    try:
        return json.loads(file.read_text()) if file.exists() else {}
    except json.JSONDecodeError:
        return {}  # run again; a passing run writes it anew


def _record(base: Base, inputs: dict, outcome: runner.Outcome, seconds: float) -> None:
    record = {
        "key": ledger.digest(inputs.values()),
        "inputs": inputs,
        "calls": outcome.calls,
        "proved": datetime.date.today().isoformat(),
        "seconds": round(seconds, 1),
    }
    file = base.patch_dir / RECORD
    file.parent.mkdir(parents=True, exist_ok=True)
    materialize.replace_atomically(file, json.dumps(record, indent=1, sort_keys=True))


def _python_without_capabilities(python: Path, folder: Path) -> Path:
    """A stand-in for ``python`` that runs it with every capability dropped."""
    shim = folder / "python"
    shim.write_text(f'#!/bin/sh\nexec {" ".join(DROP_CAPABILITIES)} "{python}" "$@"\n')
    shim.chmod(0o755)
    return shim


def main(
    bases: list[Base],
    fresh: bool = False,
    seed: int | None = None,
    audit_minutes: float = verify.AUDIT_MINUTES,
    jobs: int | None = None,
) -> int:
    """Each base's read-only tests, a job of the proof's one scheduler each,
    in a clean checkout of its tree. A base whose record's key holds is
    reused unless ``fresh``, or unless this turn's slot of the audit's
    rotation (``seed``, default the commit count; slots sized as ``make
    verify`` sizes them on ``jobs`` CPUs) holds it: a record is a row named
    ``<base>/read-only`` of ``make verify``'s rotation."""
    if shutil.which(DROP_CAPABILITIES[0]) is None:
        raise ForkError(
            "the read-only tests without capabilities need setpriv (util-linux): "
            "`apt-get install util-linux`"
        )
    turn = seed if seed is not None else verify.commit_count()
    slots = verify.slot_count(bases, audit_minutes, jobs or 0)
    runs = []
    for base in bases:
        tree = materialize.ensure(base)
        nodeids = read_only_tests(tree)
        if not nodeids:
            print(f"read-only: {base.name}: the queue has no read-only test")
            continue
        now, record = inputs(base, tree, nodeids), recorded(base)
        held = record.get("key") == ledger.digest(now.values())
        audited = held and _in_turn(base, turn, slots)
        if held and not fresh and not audited:
            passed = sum(result == "passed" for result in record["calls"].values())
            print(
                f"read-only: {base.name}: reused (key {record['key'][:12]}, "
                f"{record['proved']}): {passed} passed"
            )
            continue
        if audited and not fresh:
            print(
                f"read-only: {base.name}: auditing its record (key "
                f"{record['key'][:12]}, {record['proved']}): rotation slot "
                f"{verify.turn_slot(turn, slots) + 1} of {slots} (turn {turn})"
            )
        runs.append(((base, tree, nodeids, now), record.get("seconds", 0.0)))
    failed: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        schedule.execute(
            [
                schedule.Job(seconds, lambda r=run: failed.append(_run(*r, Path(tmp))))
                for run, seconds in runs
            ]
        )
    return 1 if any(failed) else 0


def _in_turn(base: Base, turn: int, slots: int) -> bool:
    if not slots:
        return False
    slot = verify.slot_of(f"{base.name}/read-only", slots)
    return slot == verify.turn_slot(turn, slots)


def _run(base: Base, tree: Path, nodeids: list[str], now: dict, tmp: Path) -> str:
    """Runs ``nodeids`` without capabilities in a clean checkout of ``tree``;
    the base's name if a case did not pass, else "" (and the run is recorded
    under the key of ``now``)."""
    folder = tmp / base.name
    folder.mkdir()
    python = _python_without_capabilities(venv.ensure(base), folder)
    label = f"{base.name} read-only, no capabilities"
    started = time.monotonic()
    with checkouts.checkout(tree) as worktree:
        outcome = runner.run_tests(python, worktree, nodeids, label=label)
    found = problems(nodeids, outcome)
    for problem in found:
        print(f"read-only: {base.name}: {problem}", file=sys.stderr, flush=True)
    if not found:
        print(f"read-only: {base.name}: {outcome.passed} passed", flush=True)
        _record(base, now, outcome, time.monotonic() - started)
    return base.name if found else ""
