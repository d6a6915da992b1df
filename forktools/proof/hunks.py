"""``make verify HUNKS=1``: which of a fix's hunks its tests need.

For each source hunk of a fix patch, the patch's tests run on the whole queue
with that hunk alone reverted. A hunk whose reversal fails no test is one no
test needs: it gets a test, leaves the patch, or the patch's body says why it
stays. Nothing is kept in the proof ledger: this runs on demand, its cost is
a test run per hunk, every hunk of every patch a job of one scheduler.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from forktools.environments import venv
from forktools.proof import checkouts, ledger, runner, schedule
from forktools.proof.runner import Outcome
from forktools.queue import commits, git, materialize, series
from forktools.queue.pins import Base, ForkError
from forktools.queue.table import render

_HUNK_HEADER = re.compile(
    r"^@@ -\d+(?:,\d+)? \+(?P<line>\d+)(?:,\d+)? @@ ?(?P<scope>.*)$"
)


@dataclass(frozen=True)
class Hunk:
    path: str
    line: int  # where the hunk starts in the fixed file
    scope: str  # the enclosing definition, as git names it
    patch: str  # a diff of this hunk alone

    @property
    def where(self) -> str:
        scope = f" ({self.scope})" if self.scope else ""
        return f"{self.path}:{self.line}{scope}"


@dataclass
class Need:
    hunk: Hunk
    outcome: Outcome | None = None
    problem: str = ""

    @property
    def needed(self) -> bool:
        """Some test fails without it, or cannot even be collected (an
        import the rest of the patch uses)."""
        return self.outcome is not None and bool(
            self.outcome.failed or self.outcome.errors
        )


def split(diff: str) -> list[Hunk]:
    """Each hunk of a unified ``git diff`` as a diff of its own."""
    hunks: list[Hunk] = []
    header: list[str] = []
    path = ""
    current: list[str] = []
    start, scope = 0, ""

    def close() -> None:
        if current:
            text = "".join(header + current)
            hunks.append(Hunk(path, start, scope, text))

    for line in diff.splitlines(keepends=True):
        if line.startswith("diff --git "):
            close()
            current, header = [], [line]
            path = line.rstrip("\n").split(" b/", 1)[1]
        elif match := _HUNK_HEADER.match(line.rstrip("\n")):
            close()
            current = [line]
            start, scope = int(match["line"]), match["scope"].strip()
        elif current:
            current.append(line)
        else:
            header.append(line)
    close()
    return hunks


def source_hunks(tree: Path, commit: str) -> list[Hunk]:
    sources = commits.changed_sources(tree, commit)
    if not sources:
        return []
    diff = git.run(tree, "diff", f"{commit}^", commit, "--", *sources).stdout
    return split(diff)


def tree_without(tree: Path, hunk: Hunk) -> str:
    """The git tree of the whole queue with ``hunk`` alone reverted."""
    try:
        return commits.tree_with_diff(tree, "HEAD", hunk.patch, reverse=True)
    except ForkError as error:
        where = f"{hunk.where} does not revert alone on the whole queue"
        raise ForkError(f"{where}: {error}") from None


def main(bases: list[Base], patch: int | None = None) -> int:
    """For each fix patch of ``bases`` (or patch number ``patch``), each hunk's
    need; the table, and non-zero when a hunk no test needs is found. Every
    hunk's run is a job of the proof's one scheduler."""
    found: list[tuple[Base, str, Need]] = []
    jobs: list[schedule.Job] = []
    for base in bases:
        tree = materialize.ensure(base)
        materialize.refuse_if_unexported(tree, f"verify the hunks of {base.name}")
        python, engine = venv.ensure(base), venv.ensure_engine(base)
        commit_ids = git.out(tree, "rev-list", "--reverse", "base..HEAD").split()
        entries = list(zip(series.entries(base), commit_ids, strict=True))
        if patch is not None:
            if not 1 <= patch <= len(entries):
                raise ForkError(f"patches/{base.name} has no patch #{patch}")
            entries = [entries[patch - 1]]
        recorded = ledger.load(base).proofs
        for entry, commit in entries:
            tests = commits.added_tests(tree, commit)
            hunks = source_hunks(tree, commit)
            proof = recorded.get(entry.name)
            estimate = proof.with_fix_seconds if proof else 0.0
            for number, hunk in enumerate(hunks, 1):
                need = Need(hunk)
                found.append((base, entry.name, need))
                label = f"{entry.name[:4]} hunk {number}/{len(hunks)}"
                run = _runner(tree, tests, python, engine, label, need)
                jobs.append(schedule.Job(estimate, run))
    schedule.execute(jobs)
    lines = [("base", "patch", "hunk", "tests failing without it", "needed")]
    lines += [_line(base, name, need) for base, name, need in found]
    print(render(lines))
    return 1 if any(not need.needed for _, _, need in found) else 0


def _runner(tree, tests, python, engine, label, need: Need) -> Callable[[], None]:
    """The job that runs ``tests`` with ``need``'s hunk alone reverted."""

    def run() -> None:
        print(f"hunks: {label}: {need.hunk.where}", file=sys.stderr)
        if not tests:
            need.problem = "the patch adds no tests"
            return
        try:
            with checkouts.checkout(tree, tree_without(tree, need.hunk)) as worktree:
                need.outcome = runner.run_tests(python, worktree, tests, engine, label)
        except ForkError as error:
            need.problem = str(error)

    return run


def _line(base: Base, name: str, need: Need) -> tuple[str, ...]:
    if need.outcome is None:
        return (base.name, name[:4], need.hunk.where, need.problem, "?")
    failing = sorted(
        nodeid.split("::", 1)[1]
        for nodeid, kind in need.outcome.calls.items()
        if kind == "failed"
    )
    shown = ", ".join(failing[:4]) + (
        f" and {len(failing) - 4} more" if len(failing) > 4 else ""
    )
    if failing:
        kinds = ", ".join(sorted(need.outcome.failure_types))
        shown = f"{len(failing)}/{need.outcome.total}: {shown} ({kinds})"
    errors = (
        f"; errors: {'; '.join(need.outcome.errors)}" if need.outcome.errors else ""
    )
    return (
        base.name,
        name[:4],
        need.hunk.where,
        (shown or "none") + errors,
        "yes" if need.needed else "NO: no test needs it",
    )
