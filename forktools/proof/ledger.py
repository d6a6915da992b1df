"""The proof ledger: ``patches/<base>/proof.json``, written by ``make verify``.

"Patch P's tests pass with it and fail without it" is a fact about exact
inputs, so it is kept as data and proved again only when an input changes, the
way a build cache keeps an action's result. One row per patch in ``series``,
keyed by the digest of its inputs: the git tree of the whole queue (with the
fix) and of the queue with the fix undone, the locked sets of the environments
the tests ran in (each line of ``locks/<base>/`` with its sha256), the
content of the harness and of the code that shapes a run (``KEYED_CODE``),
the test functions run and the coarse platform (operating system and
architecture). Its value is what was observed with and without the fix, case
by case, when, in how many seconds, and on what machine
(``machine.fingerprint``: data the audit and ``make check`` read, not part of
the key, so that a ledger holds on the next machine of the same kind).

The key digests the inputs' values in their order, not the names the file
gives them: renaming a field proves nothing again.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import platform
from collections.abc import Iterable
from dataclasses import asdict, astuple, dataclass, field
from pathlib import Path

from forktools.environments import lockfiles, venv
from forktools.proof import machine, runner
from forktools.proof.runner import Outcome
from forktools.queue import commits, git, materialize, series
from forktools.queue.pins import Base, ForkError

FILE = "proof.json"
KEY_SHOWN = 12
# The code that shapes a checkout or a run, wherever it lives: the run
# itself, what a checkout links and removes, how an environment is filled
# from its lock. Its source (a value's repr) is in every key; the rest of
# each module can change without proving anything again.
KEYED_CODE = (
    runner,
    materialize.TEST_BY_PRODUCTS,
    materialize.VERSION_FILE,
    materialize.wheel_files,
    venv.install_commands,
    venv.engine_install_commands,
    venv.kernels_engine_commands,
    venv._LAYER_OVER,
    lockfiles.install_command,
)


def digest(values: Iterable) -> str:
    """The key of a record's input values, in order: sha256 of their JSON."""
    return hashlib.sha256(json.dumps(list(values)).encode()).hexdigest()


@dataclass(frozen=True)
class Inputs:
    """Everything a row's observation depends on."""

    tree_with_fix: str
    tree_without_fix: str
    environment: str
    harness: str
    code: str
    tests: tuple[str, ...]
    platform: str

    @property
    def key(self) -> str:
        return digest(astuple(self))

    def changed(self, recorded: Inputs) -> list[str]:
        """What differs from ``recorded``, in words; empty when nothing does."""
        words = {
            "tree_with_fix": "the queue's tree",
            "tree_without_fix": "the tree without the fix",
            "environment": "the locked environments (locks/<base>/)",
            "harness": "forktools/engine/harness/",
            "code": "the code that shapes a run (ledger.KEYED_CODE)",
            "tests": "the tests run",
            "platform": "the platform (operating system, architecture)",
        }
        mine, theirs = asdict(self), asdict(recorded)
        return [
            f"{words[name]} ({_short(theirs[name])} -> {_short(mine[name])})"
            for name in words
            if mine[name] != theirs[name]
        ]


@dataclass
class Proof:
    """One row: the observation made on ``inputs``."""

    patch: str
    inputs: Inputs
    undone_by: str
    with_fix: Outcome
    without_fix: Outcome
    proved: str  # the date, ISO 8601
    seconds: float  # of the without-fix run
    with_fix_seconds: float
    machine: dict  # machine.fingerprint() of the machine it was proved on

    @property
    def key(self) -> str:
        return self.inputs.key

    def to_json(self) -> dict:
        return {
            "patch": self.patch,
            "key": self.key,
            "inputs": {**asdict(self.inputs), "tests": list(self.inputs.tests)},
            "undone_by": self.undone_by,
            "proved": self.proved,
            "seconds": round(self.seconds),
            "with_fix_seconds": round(self.with_fix_seconds),
            "machine": self.machine,
            "with_fix": self.with_fix.to_json(),
            "without_fix": self.without_fix.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict) -> Proof:
        inputs = dict(data["inputs"])
        inputs["tests"] = tuple(inputs["tests"])
        inputs.setdefault("platform", "")  # a row from before platforms were keyed
        inputs.setdefault(
            "code", inputs.pop("verify", "")
        )  # one from before KEYED_CODE
        return cls(
            data["patch"],
            Inputs(**inputs),
            data["undone_by"],
            Outcome.from_json(data["with_fix"]),
            Outcome.from_json(data["without_fix"]),
            data["proved"],
            float(data["seconds"]),
            float(data.get("with_fix_seconds", 0.0)),
            dict(data.get("machine", {})),
        )


@dataclass
class Ledger:
    base: str
    proofs: dict[str, Proof]
    # The locked set of each environment the proofs ran in, by role.
    environments: dict[str, list[str]]
    # Rows dropped on load because their key is not their inputs' digest.
    problems: list[str] = field(default_factory=list)
    # Those rows: their seconds still estimate what proving them costs.
    dropped: dict[str, Proof] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "base": self.base,
            "environments": self.environments,
            "rows": [proof.to_json() for proof in self.proofs.values()],
        }


def path(base: Base) -> Path:
    return base.patch_dir / FILE


def load(base: Base) -> Ledger:
    """The base's ledger; an empty one where there is none yet."""
    file = path(base)
    if not file.exists():
        return Ledger(base.name, {}, {})
    try:
        data = json.loads(file.read_text())
        proofs = [Proof.from_json(row) for row in data["rows"]]
        ledger = Ledger(
            data["base"],
            {proof.patch: proof for proof in proofs},
            data["environments"],
        )
    except (ValueError, KeyError, TypeError) as error:
        raise ForkError(
            f"{file} is not a proof ledger `make verify` wrote ({error!r}); "
            "restore it with git, or remove it and run `make verify`"
        ) from error
    for proof, row in zip(proofs, data["rows"], strict=True):
        if row.get("key") != proof.key:
            ledger.dropped[proof.patch] = ledger.proofs.pop(proof.patch)
            ledger.problems.append(
                f"{file.name}: the row of {proof.patch} says key {row.get('key')}, "
                f"its inputs make {proof.key} ({_why_keys_differ(row)})"
            )
    return ledger


def _why_keys_differ(row: dict) -> str:
    if "machine" not in row:
        return "written by a make verify that keyed rows otherwise"
    return "edited by hand?"


def save(base: Base, ledger: Ledger) -> Path:
    """Write the ledger whole or not at all: a run killed while writing
    leaves the file as it was."""
    file = path(base)
    materialize.replace_atomically(file, json.dumps(ledger.to_json(), indent=1))
    return file


def environment_digest(base: Base, environments: dict[str, list[str]]) -> str:
    """The locked sets, each lock line with the sha256 of its file (a re-lock
    to other files of the same versions is another environment), and the
    pinned wheels whose compiled files the fork tree links (they are not in
    its git tree)."""
    wheel = base.wheel_for_this_machine()
    parts = [f"wheel {wheel.file} {wheel.sha256}"]
    engine = base.engine_wheel_for_this_machine()
    if engine is not None:
        parts.append(f"engine wheel {engine.file} {engine.sha256}")
    for role in sorted(environments):
        parts += [f"[{role}]", *environments[role]]
        pinned = venv.lock_of(base, role).pinned
        parts += [f"{p.line} sha256:{p.sha256}" for p in pinned]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def content_digest(path: Path) -> str:
    """sha256 of a file's bytes, or of every file under a folder but compiled
    bytecode, each with its path there and whether it is executable (the
    harness holds a program, the compiler shim, besides its modules)."""
    if path.is_dir():
        files = [f for f in path.rglob("*") if f.is_file() and f.suffix != ".pyc"]
    else:
        files = [path]
    digest = hashlib.sha256()
    for file in sorted(files):
        name = file.relative_to(path) if path.is_dir() else file.name
        digest.update(f"{name}\0{os.access(file, os.X_OK)}\0".encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def code_digest() -> str:
    """sha256 of ``KEYED_CODE``: each module's file, each function's source,
    each value's repr (a set's sorted)."""
    digest = hashlib.sha256()
    for code in KEYED_CODE:
        if inspect.ismodule(code) or inspect.isfunction(code):
            text = inspect.getsource(code)
        else:
            text = repr(sorted(code) if isinstance(code, frozenset) else code)
        digest.update(f"{text}\0".encode())
    return digest.hexdigest()


def code_digests() -> dict[str, str]:
    """The code's part of every key: the harness and ``KEYED_CODE``."""
    return {"harness": content_digest(runner.HARNESS), "code": code_digest()}


def coarse_platform() -> str:
    """The part of the machine in every key: operating system and machine
    architecture (the Python build is in the locked sets), so a ledger holds
    on the next machine of the same kind."""
    return f"{platform.system()} {platform.machine()}"


@dataclass
class Subject:
    """A patch as it stands now, and what its proof depends on."""

    entry: series.Entry
    commit: str
    tests: list[str]
    tree_without_fix: str
    undone_by: str

    def inputs(self, tree_with_fix: str, environment: str) -> Inputs:
        return Inputs(
            tree_with_fix,
            self.tree_without_fix,
            environment,
            **code_digests(),
            tests=tuple(self.tests),
            platform=coarse_platform(),
        )


def subjects(base: Base, tree: Path) -> list[Subject | ForkError]:
    """Each patch of the queue in the fork tree, or why it cannot be proved."""
    commit_ids = git.out(tree, "rev-list", "--reverse", "base..HEAD").split()
    found: list[Subject | ForkError] = []
    for entry, commit in zip(series.entries(base), commit_ids, strict=True):
        tests = commits.added_tests(tree, commit)
        try:
            without, how = commits.tree_without_fix(base, entry, tree, commit)
        except ForkError as error:
            found.append(error)
            continue
        found.append(Subject(entry, commit, tests, without, how))
    return found


def proved_here(base: Base) -> str:
    """How many of the base's rows were proved on a machine like this one
    (``machine.fingerprint``), and what the others' differences can change."""
    proofs = list(load(base).proofs.values())
    here = machine.fingerprint()
    differs = [machine.differences(proof.machine, here) for proof in proofs]
    said = (
        f"{base.name}: {differs.count([])} of {len(proofs)} rows proved on a "
        "machine like this"
    )
    fields = sorted({name for names in differs for name in names})
    if not fields:
        return said
    what = "; ".join(machine.WHAT_DIFFERS.get(name, name) for name in fields)
    return (
        f"{said}; the others differ in {what}. A machine is data, not key: "
        "each `make verify` audits such rows here first "
        "(docs/proof-ledger.md, Machines)"
    )


def _short(value) -> str:
    if isinstance(value, tuple):
        return f"{len(value)} test(s)"
    return str(value)[:KEY_SHOWN]
