"""``make rebase PROBE=1``: a fix's own tests on the new release without it.

All passing means upstream fixed the bug its own way: the rebase drops the
patch, with the counts as evidence. Failing on assertions means it is still
needed; failing any other way means the tests no longer run as written and
prove nothing.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from forktools.environments import venv
from forktools.proof import checkouts, runner
from forktools.queue import commits, git
from forktools.queue.pins import Base
from forktools.queue.rebase import Result


def probe_tests(target: Base, tree: Path, result: Result) -> None:
    """Run the fix's tests on the new release without the fix (its test hunks
    only, on the queue replayed so far). All passing means upstream fixed it."""
    nodeids = commits.added_tests(tree, result.commit)
    if not nodeids:
        result.evidence.append("adds no test functions: tests not probed")
        return
    diff = ("diff", f"{result.commit}^", result.commit, "--", "tests")
    tests = git.run(tree, *diff).stdout
    python = venv.ensure(target)
    with checkouts.checkout(tree) as worktree:
        problem = _apply_tests(worktree, tests, result)
        if problem:
            result.evidence.append(
                f"its tests do not apply on {target.version} without it: not "
                f"probed ({problem})"
            )
            return
        print(f"rebase: {result.patch}: its tests without it", file=sys.stderr)
        outcome = runner.run_tests(python, worktree, nodeids)
    counts = f"{outcome.passed} passed, {outcome.failed} failed of {len(nodeids)}"
    other = sorted(outcome.failure_types - runner.ASSERTIONS)
    if other or outcome.errors or not outcome.passed + outcome.failed:
        problems = [f"failed with {', '.join(other)}"] if other else []
        result.evidence.append(
            f"its tests without it on {target.version} ({counts}) did not run as "
            f"written, so they prove nothing: {'; '.join(problems + outcome.errors)}"
        )
    elif outcome.failed:
        result.evidence.append(
            f"its tests without it on {target.version}: {counts}, on assertions: "
            "still needed"
        )
    else:
        result.outcome = "upstream"
        result.evidence[:0] = [
            f"its tests pass on {target.version} without it ({counts}): upstream "
            "fixed the bug its own way",
            f"its tests are not upstream ({', '.join(sorted(nodeids))}): to keep "
            "them, carry them as a Test-only patch with a verify/*.without-fix.diff",
        ]


def _apply_tests(worktree: Path, tests: str, result: Result) -> str:
    """Apply the test hunks; where they conflict with tests upstream added in
    the same place, keep both sides (a union merge). Returns what went wrong."""
    applied = git.run(worktree, "apply", "-3", "-", input=tests, check=False)
    if applied.returncode == 0:
        return ""
    unmerged = git.out(worktree, "diff", "--name-only", "--diff-filter=U").split()
    if not unmerged:
        return applied.stderr.strip().splitlines()[-1]
    for path in unmerged:
        if not _union_merge(worktree, path):
            return f"{path} conflicts and has no common ancestor to merge from"
    result.evidence.append(
        f"its test hunks conflict with upstream's tests in {', '.join(unmerged)}; "
        "probed with both kept (union merge)"
    )
    return ""


def _union_merge(worktree: Path, path: str) -> bool:
    staged = git.out(worktree, "ls-files", "--unmerged", "--", path).splitlines()
    blobs = {line.split()[2]: line.split()[1] for line in staged}
    if set(blobs) != {"1", "2", "3"}:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        versions = []
        for stage in ("2", "1", "3"):  # ours, base, theirs
            version = Path(tmp, stage)
            version.write_text(
                git.run(worktree, "cat-file", "blob", blobs[stage]).stdout
            )
            versions.append(str(version))
        merged = git.run(
            worktree, "merge-file", "-p", "--union", *versions, check=False
        )
    (worktree / path).write_text(merged.stdout)
    git.run(worktree, "add", "--", path)
    return True
