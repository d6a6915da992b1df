"""What one proof observes: tests run in a tree, with or without a fix.

Everything that decides an observation lives here or in the harness, so the
content of this file and of ``forktools/engine/harness/`` is part of every proof
ledger key (``forktools/proof/ledger.py``). Scheduling, judging and the table
(``forktools/proof/verify.py``) can change without re-proving anything.
"""

from __future__ import annotations

import ast
import atexit
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from forktools.queue import git, materialize, series
from forktools.queue.pins import ROOT, Base, ForkError

HARNESS = ROOT / "forktools" / "engine" / "harness"
PROOF_CODE = Path(__file__).resolve()
ASSERTIONS = {"AssertionError", "Failed"}
_HUNK = re.compile(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", re.MULTILINE)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
KERNEL_FLAGS = ("avx512", "amx")
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
    # Seconds of each test case, its setup and teardown included.
    seconds: dict[str, float] = field(default_factory=dict)

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
            "calls": self.calls,
            "failures": self.failures,
            "errors": self.errors,
            "seconds": {name: round(s, 1) for name, s in self.seconds.items()},
        }

    @classmethod
    def from_json(cls, data: dict) -> Outcome:
        return cls(
            dict(data["calls"]),
            dict(data["failures"]),
            list(data["errors"]),
            dict(data.get("seconds", {})),
        )


def variant_of(nodeid: str) -> str:
    """The first parametrization id of a test (``t[mega-empty]`` -> ``mega``),
    which a fixture-level parameter such as the artifact format comes first
    in; ``""`` for a test without one."""
    _, bracket, ids = nodeid.partition("[")
    return ids.rstrip("]").split("-")[0] if bracket else ""


def added_tests(tree: Path, commit: str) -> list[str]:
    """Node ids of the tests ``commit`` adds or changes: test functions,
    ``async`` ones included, and test methods of ``Test*`` classes, whose
    lines (decorators included) the commit touches, in file order."""
    nodeids = []
    for path in _changed(tree, commit, "tests"):
        if not Path(path).name.startswith("test_") or not path.endswith(".py"):
            continue
        source = git.run(tree, "show", f"{commit}:{path}", check=False).stdout
        touched = _touched_lines(tree, commit, path)
        nodeids += [
            f"{path}::{name}"
            for name, lines in _test_spans(source)
            if touched.intersection(lines)
        ]
    return nodeids


def _touched_lines(tree: Path, commit: str, path: str) -> set[int]:
    """Lines of ``path`` at ``commit`` that it adds or changes; a deletion
    counts for the two lines around it."""
    diff = git.out(tree, "diff", "--unified=0", f"{commit}^", commit, "--", path)
    touched: set[int] = set()
    for start, count in _HUNK.findall(diff):
        first, length = int(start), int(count or 1)
        touched.update(range(first, first + length) if length else (first, first + 1))
    return touched


def _test_spans(source: str) -> list[tuple[str, range]]:
    """Each test of a module and the lines it spans: ``name`` of a function,
    ``Class::name`` of a method of a test class."""
    try:
        module = ast.parse(source)
    except SyntaxError:
        return []
    spans = []
    for node in module.body:
        if isinstance(node, _FUNCTIONS) and node.name.startswith("test"):
            spans.append((node.name, _span(node)))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            spans += [
                (f"{node.name}::{method.name}", _span(method))
                for method in node.body
                if isinstance(method, _FUNCTIONS) and method.name.startswith("test")
            ]
    return spans


def _span(node: ast.FunctionDef | ast.AsyncFunctionDef) -> range:
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return range(first, (node.end_lineno or node.lineno) + 1)


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
    base: Base, entry: series.Entry, tree: Path, commit: str
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
    ``tree_id``, with the wheel's files linked: a worktree of ``tree`` that
    an earlier checkout gave back, switched to that revision (see
    ``_switch``), or a new one."""
    revision = git.out(tree, "rev-parse", "HEAD")
    if tree_id is not None:
        revision = git.out(tree, "commit-tree", tree_id, "-p", "HEAD", "-m", "verify")
    path = _idle_worktree(tree)
    try:
        _switch(path, revision)
        shutil.copy(tree / materialize.VERSION_FILE, path / materialize.VERSION_FILE)
        yield path
    except BaseException:
        _remove_worktree(tree, path)
        raise
    with _WORKTREES_LOCK:
        _IDLE_WORKTREES.setdefault(tree, []).append(path)


def _switch(path: Path, revision: str) -> None:
    """Check ``revision`` out in the worktree ``path``, remove what is not
    tracked there (test by-products too) but compiled bytecode, and the
    bytecode of every Python file the switch changed: Python trusts a .pyc
    whose source has the recorded size and mtime second, which a quick
    switch can keep."""
    before = git.out(path, "rev-parse", "HEAD")
    git.run(path, "checkout", "--force", "--detach", "--quiet", revision)
    git.run(path, "clean", "-ffdq", "--exclude=__pycache__")
    for by_product in materialize.TEST_BY_PRODUCTS - {"__pycache__"}:
        shutil.rmtree(path / by_product, ignore_errors=True)
    changed = git.out(path, "diff", "--name-only", "--no-renames", before, "HEAD")
    for name in changed.splitlines():
        source = path / name
        if source.suffix == ".py":
            for compiled in source.parent.glob(f"__pycache__/{source.stem}.*.pyc"):
                compiled.unlink()


# Worktrees given back by checkouts, per tree: a new one costs seconds of
# file writes (6,000 files and 2,000 links for a recent base), a switch
# rewrites only the files two revisions change.
_IDLE_WORKTREES: dict[Path, list[Path]] = {}
_WORKTREES_LOCK = threading.Lock()


def _idle_worktree(tree: Path) -> Path:
    """A worktree of ``tree`` given back earlier, or a new one. A tree built
    again in place (a new ``.git``) no longer knows its old worktrees: they
    are removed, not reused."""
    while True:
        with _WORKTREES_LOCK:
            idle = _IDLE_WORKTREES.get(tree)
            path = idle.pop() if idle else None
        if path is None:
            break
        if _known(path):
            return path
        _remove_worktree(tree, path)
    path = Path(tempfile.mkdtemp(prefix="vllm-fork-verify-"))
    shutil.rmtree(path)
    git.run(tree, "worktree", "prune")  # what a killed run left
    git.run(tree, "worktree", "add", "--detach", "--quiet", str(path), "HEAD")
    try:
        for name in materialize.wheel_files(tree):
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).symlink_to(tree / name)
    except BaseException:
        _remove_worktree(tree, path)
        raise
    return path


def _known(path: Path) -> bool:
    """Whether the worktree ``path``'s repository still holds its record."""
    link = path / ".git"
    if not link.is_file():
        return False
    return Path(link.read_text().removeprefix("gitdir:").strip()).is_dir()


def _remove_worktree(tree: Path, path: Path) -> None:
    git.run(tree, "worktree", "remove", "--force", str(path), check=False)
    shutil.rmtree(path, ignore_errors=True)


@atexit.register
def remove_checkouts() -> None:
    """Remove the worktrees checkouts gave back."""
    with _WORKTREES_LOCK:
        idle = [
            (tree, path) for tree, paths in _IDLE_WORKTREES.items() for path in paths
        ]
        _IDLE_WORKTREES.clear()
    for tree, path in idle:
        _remove_worktree(tree, path)


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


# What the tests see of the caller's environment: where programs, home and
# scratch space are, the locale and the proxies. Anything else a shell may
# hold (PYTEST_ADDOPTS, CXX, OMP_*, LD_PRELOAD, MASTER_PORT, VLLM_*) would
# change what they observe while no ledger key holds it.
PROXIES = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
PASSED_THROUGH = ("PATH", "HOME", "TMPDIR", "LANG", *PROXIES)


def caller_environment() -> dict[str, str]:
    """The variables of PASSED_THROUGH this process has."""
    return {
        name: value
        for name, value in os.environ.items()
        if name in PASSED_THROUGH or name.lower() in PASSED_THROUGH
    }


def coarse_platform() -> str:
    """The part of the machine in every key: operating system and machine
    architecture (the Python build is in the locked sets), so a ledger holds
    on the next machine of the same kind."""
    return f"{platform.system()} {platform.machine()}"


def fingerprint() -> dict[str, object]:
    """What else of the machine a proof ran on may change an observation,
    kept as data beside each row: who ran it (root with capabilities takes
    other code paths in the read-only tests), the CPUs and the flags that
    pick kernels, the C++ compiler Inductor calls, the kernel release."""
    return dict(_machine())


@functools.cache
def _machine() -> dict[str, object]:
    return {
        "uid": os.getuid(),
        "capabilities": _effective_capabilities() != 0,
        "cpus": os.cpu_count() or 0,
        "cpu_flags": _kernel_flags(),
        "cxx": _compiler_version(),
        "kernel": platform.release(),
    }


def _effective_capabilities() -> int:
    status = Path("/proc/self/status")
    text = status.read_text() if status.exists() else ""
    found = re.search(r"^CapEff:\s*([0-9a-f]+)", text, re.MULTILINE)
    return int(found.group(1), 16) if found else 0


def _kernel_flags() -> list[str]:
    """The CPU flags that pick vector kernels: avx2, avx512*, amx*."""
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text() if cpuinfo.exists() else ""
    found = re.search(r"^flags\s*:(.*)$", text, re.MULTILINE)
    flags = found.group(1).split() if found else []
    return sorted(f for f in set(flags) if f == "avx2" or f.startswith(KERNEL_FLAGS))


def _compiler_version() -> str:
    """The first line of ``g++ --version``: the compiler Inductor calls
    when the tests see no CXX."""
    try:
        result = subprocess.run(
            ["g++", "--version"], capture_output=True, text=True, check=False
        )
    except OSError:
        return "none"
    return result.stdout.partition("\n")[0].strip() or "none"


def summarize(records: list[dict]) -> Outcome:
    outcome = Outcome()
    for record in records:
        nodeid, kind = record["nodeid"], record["exception"]
        if "seconds" in record:
            spent = outcome.seconds.get(nodeid, 0.0) + record["seconds"]
            outcome.seconds[nodeid] = spent
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
