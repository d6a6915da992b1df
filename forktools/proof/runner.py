"""One test run as a proof observes it: the contents of the checkout the
tests run in, the command, the environment they see, and what pytest
reported.

Everything here shapes an observation, so every byte of this file, of the
harness (``forktools/engine/harness/``) and of the few pieces elsewhere that
shape a checkout or an environment (``ledger.KEYED_CODE``) is part of every
ledger key. What only observes (the worktree pool in ``checkouts``, the
machine fingerprint in ``machine``, timing) lives outside it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from forktools.queue import download, git, materialize
from forktools.queue.pins import ROOT

HARNESS = ROOT / "forktools" / "engine" / "harness"
# The g++ that serves a compile Inductor repeats from a cache the sessions
# share (harness/vllm_cxx_cache.py), and where that cache lives.
COMPILER_SHIM = HARNESS / "cxx-cache-bin"
COMPILER_CACHE = "cxx-outputs"
ASSERTIONS = {"AssertionError", "Failed"}


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


def prepare(tree: Path, path: Path, revision: str) -> None:
    """Make the worktree ``path`` of ``tree`` hold ``revision`` as a test run
    sees it: checked out, without what is not tracked (test by-products too)
    but compiled bytecode, with the bytecode of every Python file the switch
    changed removed (Python trusts a .pyc whose source has the recorded size
    and mtime second, which a quick switch can keep), the wheel's compiled
    files linked from the tree and its version file copied."""
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
    for name in materialize.wheel_files(tree):
        if not (path / name).is_symlink():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).symlink_to(tree / name)
    shutil.copy(tree / materialize.VERSION_FILE, path / materialize.VERSION_FILE)


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
            **session_environment(Path(python), Path(tmp)),
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


# What the tests see of the caller's environment: the locale and the
# proxies. Anything else a shell may hold (PYTEST_ADDOPTS, CXX, OMP_*,
# LD_PRELOAD, MASTER_PORT, VLLM_*) would change what they observe while no
# ledger key holds it; where programs, home and scratch space are is fixed
# by ``session_environment``.
PROXIES = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
PASSED_THROUGH = ("LANG", *PROXIES)
# The programs a test may start besides its Python: git, the C++ compiler
# Inductor calls (through COMPILER_SHIM), the shell.
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
XDG_ROOTS = ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME")


def caller_environment() -> dict[str, str]:
    """The variables of PASSED_THROUGH this process has."""
    return {
        name: value
        for name, value in os.environ.items()
        if name in PASSED_THROUGH or name.lower() in PASSED_THROUGH
    }


def session_environment(python: Path, scratch: Path) -> dict[str, str]:
    """HOME, TMPDIR and the XDG roots fresh under ``scratch`` for one pytest
    session, and PATH fixed: the compiler shim, the session's Python's
    folder, then the system's. No cache, configuration or compiled artifact
    of another run reaches the tests through them (the cache bugs the queues
    fix are exactly that); the shim hands back only g++'s output for inputs
    of the same content."""
    home, tmp = scratch / "home", scratch / "tmp"
    path = [str(COMPILER_SHIM), str(python.parent), *SYSTEM_PATH]
    env = {
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "PATH": os.pathsep.join(path),
        "VLLM_FORK_CXX_CACHE": str(download.cache_dir() / COMPILER_CACHE),
        **{name: str(home / name.lower()) for name in XDG_ROOTS},
    }
    for folder in (home, tmp, *(home / name.lower() for name in XDG_ROOTS)):
        folder.mkdir(parents=True, exist_ok=True)
    return env


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
