"""The proof ledger: ``patches/<base>/proof.json``, written by ``make verify``.

"Patch P's tests pass with it and fail without it" is a fact about exact
inputs, so it is kept as data and proved again only when an input changes, the
way a build cache keeps an action's result. One row per patch in ``series``,
keyed by the digest of its inputs: the git tree of the whole queue (with the
fix) and of the queue with the fix undone, the locked sets of the environments
the tests ran in (read from ``locks/<base>/``), the content of the harness and
of the proof code (``forktools/prove.py``), and the test functions run. Its
value is what was observed with and without the fix, when, and in how many
seconds.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from forktools import git, materialize, prove, queue, venv
from forktools.pins import Base, ForkError
from forktools.prove import Outcome

FILE = "proof.json"
KEY_SHOWN = 12


def digest(inputs: dict) -> str:
    """The key of a record's inputs: sha256 of their sorted JSON."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Inputs:
    """Everything a row's observation depends on."""

    tree_with_fix: str
    tree_without_fix: str
    environment: str
    harness: str
    verify: str
    tests: tuple[str, ...]

    @property
    def key(self) -> str:
        return digest(asdict(self))

    def changed(self, recorded: Inputs) -> list[str]:
        """What differs from ``recorded``, in words; empty when nothing does."""
        words = {
            "tree_with_fix": "the queue's tree",
            "tree_without_fix": "the tree without the fix",
            "environment": "the locked environments (locks/<base>/)",
            "harness": "forktools/harness/",
            "verify": "forktools/prove.py",
            "tests": "the tests run",
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
            "with_fix": self.with_fix.to_json(),
            "without_fix": self.without_fix.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict) -> Proof:
        inputs = dict(data["inputs"])
        inputs["tests"] = tuple(inputs["tests"])
        return cls(
            data["patch"],
            Inputs(**inputs),
            data["undone_by"],
            Outcome.from_json(data["with_fix"]),
            Outcome.from_json(data["without_fix"]),
            data["proved"],
            float(data["seconds"]),
        )


@dataclass
class Ledger:
    base: str
    proofs: dict[str, Proof]
    # The locked set of each environment the proofs ran in, by role.
    environments: dict[str, list[str]]
    # Rows dropped on load because their key is not their inputs' digest.
    problems: list[str] = field(default_factory=list)

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
            del ledger.proofs[proof.patch]
            ledger.problems.append(
                f"{file.name}: the row of {proof.patch} says key {row.get('key')}, "
                f"its inputs make {proof.key} (edited by hand?)"
            )
    return ledger


def save(base: Base, ledger: Ledger) -> Path:
    file = path(base)
    file.write_text(json.dumps(ledger.to_json(), indent=1) + "\n")
    return file


def environment_digest(base: Base, environments: dict[str, list[str]]) -> str:
    """The locked sets, and the pinned wheels whose compiled files the fork
    tree links (they are not in its git tree)."""
    wheel = base.wheel_for_this_machine()
    parts = [f"wheel {wheel.file} {wheel.sha256}"]
    engine = base.engine_wheel_for_this_machine()
    if engine is not None:
        parts.append(f"engine wheel {engine.file} {engine.sha256}")
    for role in sorted(environments):
        parts += [f"[{role}]", *environments[role]]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


@dataclass
class Subject:
    """A patch as it stands now, and what its proof depends on."""

    entry: queue.Entry
    commit: str
    tests: list[str]
    tree_without_fix: str
    undone_by: str

    def inputs(self, tree_with_fix: str, environment: str) -> Inputs:
        return Inputs(
            tree_with_fix,
            self.tree_without_fix,
            environment,
            **prove.code_digests(),
            tests=tuple(self.tests),
        )


def subjects(base: Base, tree: Path) -> list[Subject | ForkError]:
    """Each patch of the queue in the fork tree, or why it cannot be proved."""
    commits = git.out(tree, "rev-list", "--reverse", "base..HEAD").split()
    found: list[Subject | ForkError] = []
    for entry, commit in zip(queue.entries(base), commits, strict=True):
        tests = prove.added_tests(tree, commit)
        try:
            without, how = prove.tree_without_fix(base, entry, tree, commit)
        except ForkError as error:
            found.append(error)
            continue
        found.append(Subject(entry, commit, tests, without, how))
    return found


def stale(base: Base) -> list[str]:
    """Where the base's ledger no longer matches its queue and locks; empty
    if it does. The environments are read from the locks: nothing is built."""
    entries = queue.entries(base)
    if not entries:
        return []
    ledger = load(base)
    where = f"patches/{base.name}/{FILE}"
    run = f"run `make verify BASE={base.name}`"
    found = [f"patches/{base.name}/{problem}; {run}" for problem in ledger.problems]
    if not ledger.proofs:
        return found + [f"{where}: no proofs for {len(entries)} patch(es); {run}"]
    tree = materialize.ensure(base)
    tree_with_fix = prove.tree_with_fix(tree)
    environment = environment_digest(base, venv.environments(base))
    for subject in subjects(base, tree):
        if isinstance(subject, ForkError):
            found.append(str(subject))
            continue
        name = subject.entry.name
        proof = ledger.proofs.get(name)
        if proof is None:
            found.append(f"{where}: no row for {name}; {run}")
            continue
        changed = subject.inputs(tree_with_fix, environment).changed(proof.inputs)
        if changed:
            found.append(f"{where}: {name} is stale: {'; '.join(changed)}; {run}")
    listed = {entry.name for entry in entries}
    found += [
        f"{where}: a row for {name}, which series does not list; {run}"
        for name in ledger.proofs
        if name not in listed
    ]
    return found


def _short(value) -> str:
    if isinstance(value, tuple):
        return f"{len(value)} test(s)"
    return str(value)[:KEY_SHOWN]


def current_proof(base: Base, patch: str) -> Proof | None:
    """The ledger's row of ``patch``, if the ledger is current (as ``make
    check`` tells, the environment aside)."""
    proof = load(base).proofs.get(patch)
    return None if proof is None or stale(base) else proof
