"""``make verify``: each commit's tests pass with it and fail without it.

For every commit of every queue, in a scratch worktree of the fork tree:
run the test functions the commit adds with the whole queue applied (all
must pass), then with the commit's non-test hunks reverted and its tests kept
(at least one must fail, every failure through an assertion, and nothing may
error in collection or setup). A test-only commit names a patch that puts the
bug back instead, ``patches/<base>/verify/<patch>.without-fix.diff``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from forktools import git, materialize, queue, venv
from forktools.pins import ROOT, Base, ForkError
from forktools.table import render

HARNESS = ROOT / "forktools" / "harness"
ASSERTIONS = {"AssertionError", "Failed"}
_ADDED_TEST = re.compile(r"^\+def (test_\w+)\(", re.MULTILINE)


@dataclass
class Outcome:
    passed: int
    failed: int
    errors: list[str]
    failure_types: set[str]
    # Call-phase outcome ("passed", "failed", ...) of each parametrized case.
    calls: dict[str, str] = field(default_factory=dict)

    def variant_counts(self, variant: str) -> tuple[int, int]:
        """(passed, failed) of the cases run under ``variant``."""
        outcomes = [o for n, o in self.calls.items() if variant_of(n) == variant]
        return outcomes.count("passed"), outcomes.count("failed")

    @property
    def total(self) -> int:
        return self.passed + self.failed


@dataclass
class Row:
    base: str
    patch: str
    tests: int
    with_fix: Outcome | None
    without_fix: Outcome | None
    seconds: float
    problem: str = ""
    nodeids: list[str] = field(default_factory=list)
    undone_by: str = ""

    @property
    def holds(self) -> bool:
        return not self.problem


def added_tests(tree: Path, commit: str) -> list[str]:
    """Node ids of the top-level test functions that ``commit`` adds."""
    nodeids = []
    for path in _changed(tree, commit, "tests"):
        diff = git.out(tree, "show", "--format=", commit, "--", path)
        nodeids += [f"{path}::{name}" for name in _ADDED_TEST.findall(diff)]
    return nodeids


def _changed(tree: Path, commit: str, *pathspec: str) -> list[str]:
    names = git.out(tree, "diff", "--name-only", f"{commit}^", commit, "--", *pathspec)
    return names.splitlines()


def run_tests(
    python: Path,
    tree: Path,
    nodeids: list[str],
    engine: Path | None = None,
    label: str = "",
) -> Outcome:
    """Run ``nodeids``; ``engine``, the base's CPU engine Python if it pins
    one, is named to engine tests in VLLM_FORK_ENGINE_PYTHON. Each output
    line starts with ``[label]`` when given."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        env = dict(
            os.environ,
            VLLM_TARGET_DEVICE="cpu",
            PYTHONPATH=os.pathsep.join([str(tree), str(HARNESS)]),
            VLLM_FORK_REPORT=str(report),
            VLLM_CACHE_ROOT=str(Path(tmp) / "vllm-cache"),
            HF_HUB_OFFLINE="1",
        )
        if engine is not None:
            env["VLLM_FORK_ENGINE_PYTHON"] = str(engine)
        command = [
            str(python),
            "-m",
            "pytest",
            "-p",
            "vllm_fork_report",
            "-q",
            "-p",
            "no:cacheprovider",
            *nodeids,
        ]
        _run_labelled(command, tree, env, f"[{label}] " if label else "")
        records = json.loads(report.read_text()) if report.exists() else []
    return _summarize(records)


def variant_of(nodeid: str) -> str:
    """The first parametrization id of a test (``t[mega-empty]`` -> ``mega``),
    which a fixture-level parameter such as the artifact format comes first
    in; ``""`` for a test without one."""
    _, bracket, ids = nodeid.partition("[")
    return ids.rstrip("]").split("-")[0] if bracket else ""


def _summarize(records: list[dict]) -> Outcome:
    outcome = Outcome(0, 0, [], set())
    for record in records:
        if record["when"] == "call":
            outcome.calls[record["nodeid"]] = record["outcome"]
            if record["outcome"] == "passed":
                outcome.passed += 1
            elif record["outcome"] == "failed":
                outcome.failed += 1
                outcome.failure_types.add(record["exception"])
            else:
                outcome.errors.append(f"{record['nodeid']} skipped")
        elif record["outcome"] != "passed":
            outcome.errors.append(
                f"{record['nodeid']} {record['outcome']} in {record['when']}"
                f" ({record['exception']})"
            )
    if not records:
        outcome.errors.append("pytest wrote no report")
    return outcome


@contextmanager
def scratch_worktree(tree: Path):
    """A throwaway checkout of the tree's HEAD, with the wheel's files linked."""
    path = Path(tempfile.mkdtemp(prefix="vllm-fork-verify-"))
    shutil.rmtree(path)
    git.run(tree, "worktree", "add", "--detach", "--quiet", str(path), "HEAD")
    try:
        for name in materialize.wheel_files(tree):
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).symlink_to(tree / name)
        shutil.copy(tree / materialize.VERSION_FILE, path / materialize.VERSION_FILE)
        yield path
    finally:
        git.run(tree, "worktree", "remove", "--force", str(path), check=False)
        shutil.rmtree(path, ignore_errors=True)


def without_fix_diff(base: Base, patch: str) -> Path:
    """Where a test-only patch keeps the diff that puts its bug back."""
    return base.patch_dir / "verify" / f"{patch}.without-fix.diff"


def changed_sources(tree: Path, commit: str) -> list[str]:
    """The files other than tests that ``commit`` changes."""
    return [p for p in _changed(tree, commit) if not p.startswith("tests/")]


def without_fix(base: Base, entry: queue.Entry, worktree: Path, commit: str) -> str:
    """Undo the fix in ``worktree``; returns a description of what was done."""
    bug = without_fix_diff(base, entry.name)
    if bug.exists():
        git.run(worktree, "apply", str(bug))
        return f"applied {bug.relative_to(ROOT)}"
    sources = changed_sources(worktree, commit)
    if not sources:
        raise ForkError(
            f"patches/{base.name}/{entry.name} changes only tests; add "
            f"{bug.relative_to(ROOT)} that puts the bug back, so verify can "
            "show the tests fail without the fix"
        )
    diff = git.run(worktree, "diff", f"{commit}^", commit, "--", *sources).stdout
    subprocess.run(
        ["git", "-C", str(worktree), "apply", "-R"], input=diff, text=True, check=True
    )
    return f"reverted {', '.join(sources)}"


def _run_labelled(
    command: list[str], tree: Path, env: dict[str, str], label: str
) -> None:
    """Run ``command``, its output to stderr line by line, each line led by
    ``label``, so that bases verified side by side stay readable."""
    with subprocess.Popen(
        command,
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stderr.write(label + line)


def verify_base(base: Base) -> list[Row]:
    """The base's rows; ``main`` has refused unexported edits already."""
    tree = materialize.ensure(base)
    entries = queue.entries(base)
    if not entries:
        return []
    python = venv.ensure(base)
    engine = venv.ensure_engine(base)
    commits = git.out(tree, "rev-list", "--reverse", "base..HEAD").split()
    rows = []
    with scratch_worktree(tree) as worktree:
        for entry, commit in zip(entries, commits, strict=True):
            rows.append(_verify_commit(base, entry, commit, python, worktree, engine))
            git.run(worktree, "reset", "--hard", "--quiet", "HEAD")
    return rows


def _verify_commit(base, entry, commit, python, worktree, engine=None) -> Row:
    started = time.monotonic()
    nodeids = added_tests(worktree, commit)
    row = Row(base.name, entry.name, len(nodeids), None, None, 0.0, nodeids=nodeids)
    if not nodeids:
        row.problem = "adds no test functions"
        return row
    print(f"verify: {base.name} {entry.name}: with the fix", file=sys.stderr)
    row.with_fix = run_tests(python, worktree, nodeids, engine, base.name)
    row.undone_by = without_fix(base, entry, worktree, commit)
    print(f"verify: {base.name} {entry.name}: {row.undone_by}", file=sys.stderr)
    row.without_fix = run_tests(python, worktree, nodeids, engine, base.name)
    row.seconds = time.monotonic() - started
    row.problem = _judge(row.with_fix, row.without_fix) or _judge_variants(
        row.with_fix, row.without_fix
    )
    return row


def _judge(with_fix: Outcome, without: Outcome) -> str:
    if with_fix.errors or with_fix.failed or not with_fix.passed:
        return f"with the fix: {with_fix.failed} failed; {'; '.join(with_fix.errors)}"
    if without.errors:
        return f"without the fix: {'; '.join(without.errors)}"
    if not without.failed:
        return "without the fix every test still passes: the tests do not bite"
    if not without.failure_types <= ASSERTIONS:
        kinds = ", ".join(sorted(without.failure_types - ASSERTIONS))
        return f"without the fix the tests fail with {kinds}, not an assertion"
    return ""


def _judge_variants(with_fix: Outcome, without: Outcome) -> str:
    """Each shared variant (e.g. every artifact format) must bite on its own."""
    toothless = [
        variant
        for variant in shared_variants(list(with_fix.calls))
        if not without.variant_counts(variant)[1]
    ]
    if toothless:
        names = ", ".join(f"[{v}]" for v in toothless)
        return f"without the fix every {names} test still passes"
    return ""


def table(rows: list[Row]) -> str:
    lines = [("base", "patch", "tests", "with fix", "without fix", "seconds", "holds")]
    for row in rows:
        lines.append(
            (
                row.base,
                row.patch,
                str(row.tests),
                _ratio(row.with_fix, "passed"),
                _ratio(row.without_fix, "failed"),
                f"{row.seconds:.0f}",
                "yes" if row.holds else f"NO: {row.problem}",
            )
        )
        lines += _variant_lines(row)
    return render(lines)


def shared_variants(nodeids: list[str]) -> list[str]:
    """Variants that several test functions run under: a fixture-level
    parameter, such as the artifact format, rather than one test's cases."""
    functions: dict[str, set[str]] = {}
    for nodeid in nodeids:
        variant = variant_of(nodeid)
        if variant:
            functions.setdefault(variant, set()).add(nodeid.partition("[")[0])
    return sorted(v for v, names in functions.items() if len(names) > 1)


def _variant_lines(row: Row) -> list[tuple[str, ...]]:
    if row.with_fix is None or row.without_fix is None:
        return []
    lines = []
    for variant in shared_variants(list(row.with_fix.calls)):
        passed, failed = row.with_fix.variant_counts(variant)
        kept, bitten = row.without_fix.variant_counts(variant)
        lines.append(
            (
                "",
                f"  [{variant}]",
                "",
                f"{passed}/{passed + failed} passed",
                f"{bitten}/{kept + bitten} failed",
                "",
                "yes" if passed and not failed and bitten else "no",
            )
        )
    return lines


def _ratio(outcome: Outcome | None, field: str) -> str:
    if outcome is None:
        return "-"
    return f"{getattr(outcome, field)}/{outcome.total} {field}"


def results_file(base: Base) -> Path:
    return materialize.tree_dir(base).parent.parent / "verify" / f"{base.name}.json"


def _save(base: Base, rows: list[Row]) -> None:
    path = results_file(base)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows_data = []
    for row in rows:
        data = asdict(row)
        for key in ("with_fix", "without_fix"):
            if data[key]:
                data[key]["failure_types"] = sorted(data[key]["failure_types"])
        rows_data.append(data)
    data = {"queue": queue.queue_id(base), "rows": rows_data}
    path.write_text(json.dumps(data, indent=1) + "\n")


def saved_row(base: Base, patch: str) -> dict | None:
    """The last verify result of ``patch``, if made on the current queue."""
    path = results_file(base)
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if data["queue"] != queue.queue_id(base):
        return None
    return next((row for row in data["rows"] if row["patch"] == patch), None)


def default_jobs(bases: list[Base]) -> int:
    """One base per CPU: each test run keeps about one core busy."""
    return max(1, min(len(bases), os.cpu_count() or 1))


def main(bases: list[Base], jobs: int | None = None) -> int:
    """Verify ``bases``, ``jobs`` of them at a time (each in its own tree,
    scratch worktree and environments); the table keeps their order."""

    def verify_and_save(base: Base) -> list[Row]:
        base_rows = verify_base(base)
        _save(base, base_rows)
        return base_rows

    # Refuse before any base starts, not once a side-by-side one is done.
    for base in bases:
        materialize.refuse_if_unexported(
            materialize.ensure(base), f"verify {base.name}"
        )
    jobs = jobs or default_jobs(bases)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        rows = [
            row for base_rows in pool.map(verify_and_save, bases) for row in base_rows
        ]
    print(table(rows) if rows else "verify: every queue is empty")
    return 0 if all(row.holds for row in rows) else 1
