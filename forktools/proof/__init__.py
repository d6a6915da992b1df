"""The proof: each patch's tests pass with it and fail without it, as data.

- ``runner``: one test run as a proof observes it (the checkout's contents, the
  command, the environment the tests see); it, the harness and the other
  code ``ledger.KEYED_CODE`` names are in every ledger key.
- ``checkouts``: the pool of worktrees runs check out into, in no key.
- ``machine``: the machine a proof ran on, kept beside each row, in no key.
- ``ledger``: ``patches/<base>/proof.json``, rows keyed by their inputs.
- ``symptoms``: ``patches/<base>/symptoms.toml``, what each test shows
  without its fix, and the judging of failures against it.
- ``verify``: plans the rows, runs them and judges them (``make verify``),
  auditing reused ones.
- ``hunks``: ``make verify HUNKS=1``, which hunks a fix's tests need.
- ``readonly``: ``make read-only``, the read-only tests without capabilities.
- ``schedule``: the one scheduler their test runs share.
- ``costs``: ``make costs``, where the ledgers' test-seconds go.
- ``probe``: ``make rebase PROBE=1``, a fix's tests on a new release.

Everything outside this package enters through the names below (an
import-linter contract in pyproject.toml holds that); it imports the queue
and environments packages only.
"""

from __future__ import annotations

from pathlib import Path

from forktools.proof import compiler_cache, ledger, schedule, symptoms, verify
from forktools.proof.checkouts import checkout
from forktools.proof.ledger import FILE as LEDGER_FILE
from forktools.proof.ledger import Proof
from forktools.proof.probe import probe_tests
from forktools.proof.runner import ASSERTIONS, HARNESS, Outcome, run_tests
from forktools.proof.verify import AUDIT_MINUTES, current_proof, stale
from forktools.queue.pins import Base, ForkError

__all__ = [
    "ASSERTIONS",
    "AUDIT_MINUTES",
    "COMMANDS",
    "HARNESS",
    "LEDGER_FILE",
    "Outcome",
    "Proof",
    "checkout",
    "current_proof",
    "default_jobs",
    "judge_without_fix",
    "ledger_path",
    "main",
    "probe_tests",
    "proved_here",
    "recorded_environments",
    "run_tests",
    "stale",
    "symptom_problems",
]

COMMANDS = ("verify", "hunks", "read-only", "costs")


def main(command: str, bases: list[Base], **options) -> int:
    """Run the proof ``command`` (one of COMMANDS) on ``bases``."""
    if command != "costs":
        compiler_cache.trim()
    if command == "verify":
        return verify.main(bases, **options)
    if command == "hunks":
        from forktools.proof import hunks

        return hunks.main(bases, **options)
    if command == "read-only":
        from forktools.proof import readonly

        return readonly.main(bases, **options)
    if command == "costs":
        from forktools.proof import costs

        return costs.main(bases)
    raise ForkError(f"no proof command {command!r}; one of {', '.join(COMMANDS)}")


def ledger_path(base: Base) -> Path:
    return ledger.path(base)


def proved_here(base: Base) -> str:
    """How many of the base's rows were proved on a machine like this one."""
    return ledger.proved_here(base)


def recorded_environments(base: Base) -> dict[str, list[str]]:
    """The environments the base's ledger records its rows ran in, by role."""
    return ledger.load(base).environments


def symptom_problems(base: Base) -> list[str]:
    """Where the ledger's failures without a fix and the declared symptoms
    (``patches/<base>/symptoms.toml``) disagree."""
    return symptoms.ledger_problems(base)


def judge_without_fix(base: Base, without: Outcome, port: str = "") -> list[str]:
    """What is wrong with a run without a fix, judged against the base's
    declared symptoms (and those of the ``port`` folder it came from); empty
    when every failure is its test's symptom."""
    return symptoms.problems(without, symptoms.load(base, port))


def default_jobs() -> int:
    return schedule.default_jobs()
