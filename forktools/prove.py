"""What one proof observes: tests run in a tree, with or without a fix.

Everything that decides an observation lives here or in the harness, so the
content of this file and of ``forktools/harness/`` is part of every proof
ledger key (``forktools/ledger.py``). Scheduling, judging and the table
(``forktools/verify.py``) can change without re-proving anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from forktools import git, materialize, queue
from forktools.pins import ROOT, Base, ForkError

HARNESS = ROOT / "forktools" / "harness"
PROOF_CODE = Path(__file__).resolve()
ASSERTIONS = {"AssertionError", "Failed"}
_ADDED_TEST = re.compile(r"^\+def (test_\w+)\(", re.MULTILINE)
_LOCKED_SET = (
    "import importlib.metadata as m, json, platform\n"
    "names = {f\"{d.metadata['Name'].lower()}=={d.version}\"\n"
    "         for d in m.distributions() if d.metadata['Name']}\n"
    "print(json.dumps([f'python {platform.python_version()} {platform.machine()}',"
    " *sorted(names)]))"
)


@dataclass
class Outcome:
    """What pytest reported for a set of tests."""

    # Call-phase outcome ("passed", "failed", "skipped") of each test case.
    calls: dict[str, str] = field(default_factory=dict)
    # "<exception type>: <message>" of each failed case.
    failures: dict[str, str] = field(default_factory=dict)
    # Anything but a clean call phase: setup, teardown, collection, skips.
    errors: list[str] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return list(self.calls.values()).count("passed")

    @property
    def failed(self) -> int:
        return list(self.calls.values()).count("failed")

    @property
    def total(self) -> int:
        return self.passed + self.failed

    @property
    def failure_types(self) -> set[str]:
        return {failure.partition(":")[0] for failure in self.failures.values()}

    def variant_counts(self, variant: str) -> tuple[int, int]:
        """(passed, failed) of the cases run under ``variant``."""
        outcomes = [o for n, o in self.calls.items() if variant_of(n) == variant]
        return outcomes.count("passed"), outcomes.count("failed")

    def facts(self) -> dict:
        """What must be observed again for the same inputs: each case's
        outcome, each failure's exception type, each error. Messages are
        kept for people but not compared: they hold paths and process ids."""
        return {
            "calls": self.calls,
            "failure_types": {n: f.partition(":")[0] for n, f in self.failures.items()},
            "errors": sorted(self.errors),
        }

    def to_json(self) -> dict:
        return {
            "passed": self.passed,
            "failed": self.failed,
            "calls": self.calls,
            "failures": self.failures,
            "errors": self.errors,
        }

    @classmethod
    def from_json(cls, data: dict) -> Outcome:
        return cls(dict(data["calls"]), dict(data["failures"]), list(data["errors"]))


def variant_of(nodeid: str) -> str:
    """The first parametrization id of a test (``t[mega-empty]`` -> ``mega``),
    which a fixture-level parameter such as the artifact format comes first
    in; ``""`` for a test without one."""
    _, bracket, ids = nodeid.partition("[")
    return ids.rstrip("]").split("-")[0] if bracket else ""


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


def changed_sources(tree: Path, commit: str) -> list[str]:
    """The files other than tests that ``commit`` changes."""
    return [p for p in _changed(tree, commit) if not p.startswith("tests/")]


def without_fix_diff(base: Base, patch: str) -> Path:
    """Where a test-only patch keeps the diff that puts its bug back."""
    return base.patch_dir / "verify" / f"{patch}.without-fix.diff"


def tree_with_fix(tree: Path) -> str:
    """The git tree id of the whole queue: what every row's tests pass on."""
    return git.out(tree, "rev-parse", "HEAD^{tree}")


def tree_without_fix(
    base: Base, entry: queue.Entry, tree: Path, commit: str
) -> tuple[str, str]:
    """The git tree id of the whole queue with ``commit``'s fix undone (its
    source hunks reverted, or its without-fix diff applied), and how it was
    undone. Made in a scratch index: no work tree is touched."""
    bug = without_fix_diff(base, entry.name)
    named = f"patches/{base.name}/verify/{bug.name}"
    if bug.exists():
        diff, reverse, how = bug.read_text(), False, f"applied {named}"
    else:
        sources = changed_sources(tree, commit)
        if not sources:
            raise ForkError(
                f"patches/{base.name}/{entry.name} changes only tests; add "
                f"{named} that puts the bug back, so verify can "
                "show the tests fail without the fix"
            )
        diff = git.run(tree, "diff", f"{commit}^", commit, "--", *sources).stdout
        reverse, how = True, f"reverted {', '.join(sources)}"
    try:
        return tree_with_diff(tree, "HEAD", diff, reverse), how
    except ForkError as error:
        raise ForkError(
            f"patches/{base.name}/{entry.name}: {how.split(' ')[0]} "
            f"{how.split(' ', 1)[1]} does not apply on the whole queue: "
            f"{error}; update it, then run verify again"
        ) from None


def tree_with_diff(tree: Path, start: str, diff: str, reverse: bool = False) -> str:
    """The git tree id of revision ``start`` with ``diff`` applied (or
    reverted), made in a scratch index: no work tree is touched. Raises
    ForkError with git's reason when the diff does not apply."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        git.run(tree, "read-tree", start, env=env)
        if diff:
            direction = ["--reverse"] if reverse else []
            applied = git.run(
                tree, "apply", "--cached", *direction, check=False, env=env, input=diff
            )
            if applied.returncode != 0:
                raise ForkError(applied.stderr.strip())
        return git.run(tree, "write-tree", env=env).stdout.strip()


def locked_set(python: Path) -> list[str]:
    """The Python and every distribution installed for ``python``, as
    ``name==version`` lines: the environment a proof ran in."""
    result = subprocess.run(
        [str(python), "-c", _LOCKED_SET], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise ForkError(
            f"could not list the distributions of {python}: {result.stderr.strip()}"
        )
    return json.loads(result.stdout)


def content_digest(path: Path) -> str:
    """sha256 of a file's bytes, or of the ``*.py`` files of a folder, each
    with its name."""
    digest = hashlib.sha256()
    for file in sorted(path.glob("*.py")) if path.is_dir() else [path]:
        digest.update(f"{file.name}\0".encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def code_digests() -> dict[str, str]:
    """The proof code's part of every key: the harness and this file."""
    return {"harness": content_digest(HARNESS), "verify": content_digest(PROOF_CODE)}


@contextmanager
def checkout(tree: Path, tree_id: str | None = None):
    """A throwaway checkout of the fork tree's HEAD, or of the git tree
    ``tree_id``, with the wheel's files linked."""
    revision = "HEAD"
    if tree_id is not None:
        revision = git.out(tree, "commit-tree", tree_id, "-p", "HEAD", "-m", "verify")
    path = Path(tempfile.mkdtemp(prefix="vllm-fork-verify-"))
    shutil.rmtree(path)
    git.run(tree, "worktree", "prune")  # what a killed run left
    git.run(tree, "worktree", "add", "--detach", "--quiet", str(path), revision)
    try:
        for name in materialize.wheel_files(tree):
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).symlink_to(tree / name)
        shutil.copy(tree / materialize.VERSION_FILE, path / materialize.VERSION_FILE)
        yield path
    finally:
        git.run(tree, "worktree", "remove", "--force", str(path), check=False)
        shutil.rmtree(path, ignore_errors=True)


def run_tests(
    python: Path,
    tree: Path,
    nodeids: list[str],
    engine: Path | None = None,
    label: str = "",
    harness: Path = HARNESS,
) -> Outcome:
    """Run ``nodeids`` in one pytest session, with ``tree`` and ``harness``
    (a folder that must hold the report plugin) on the path; ``engine``, the
    base's CPU engine Python if it pins one, is named to engine tests in
    VLLM_FORK_ENGINE_PYTHON. Each output line starts with ``[label]``."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        env = dict(
            caller_environment(),
            VLLM_TARGET_DEVICE="cpu",
            PYTHONPATH=os.pathsep.join([str(tree), str(harness)]),
            VLLM_FORK_REPORT=str(report),
            VLLM_CACHE_ROOT=str(Path(tmp) / "vllm-cache"),
            HF_HUB_OFFLINE="1",
            PYTHONUNBUFFERED="1",  # each test's line as it ends, not at exit
        )
        if engine is not None:
            env["VLLM_FORK_ENGINE_PYTHON"] = str(engine)
        command = [
            str(python),
            "-m",
            "pytest",
            "-p",
            "vllm_fork_report",
            "-v",
            "-p",
            "no:cacheprovider",
            *nodeids,
        ]
        _run_labelled(command, tree, env, f"[{label}] " if label else "")
        records = json.loads(report.read_text()) if report.exists() else []
    return summarize(records)


# Settings a caller's shell may hold that change what the tests observe. The
# ledger's key does not hold them, so the tests must not see them either.
CALLER_SETTINGS = ("VLLM_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "TORCH_", "PYTORCH_")


def caller_environment() -> dict[str, str]:
    """This process's environment without the settings of CALLER_SETTINGS."""
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(CALLER_SETTINGS)
    }


def summarize(records: list[dict]) -> Outcome:
    outcome = Outcome()
    for record in records:
        nodeid, kind = record["nodeid"], record["exception"]
        if record["when"] == "call":
            outcome.calls[nodeid] = record["outcome"]
            if record["outcome"] == "failed":
                outcome.failures[nodeid] = f"{kind}: {record.get('message', '')}"
            elif record["outcome"] != "passed":
                outcome.errors.append(f"{nodeid} skipped")
        elif record["outcome"] != "passed":
            outcome.errors.append(
                f"{nodeid} {record['outcome']} in {record['when']} ({kind})"
            )
    if not records:
        outcome.errors.append("pytest wrote no report")
    return outcome


def _run_labelled(
    command: list[str], tree: Path, env: dict[str, str], label: str
) -> None:
    """Run ``command``, its output to stderr line by line, each line led by
    ``label``, so that runs side by side stay readable."""
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
