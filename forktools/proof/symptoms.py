"""What each test shows without its fix: ``patches/<base>/symptoms.toml``.

``make verify`` counts a failure without the fix only where it is the bug's
own symptom: the exception type its test declares, with a message that its
pattern matches (``re.search`` over what the ledger keeps: the message's
start and its end, where a child process's exception is). A declaration
names a test function, or one case of it (``test_x[mega-root]``), which
then wins over the function's: cases that fail differently each say how.
A test that cannot fail on its bug is declared ``no_regression``, saying
why; it must pass without the fix and is not counted. So is a case that
passes without the fix where other cases of its function fail: it says on
its own why it cannot bite, or it is a toothless case nobody noticed. The
declarations are read on every run, not kept in the ledger's keys:
changing them proves nothing again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

from forktools.proof import ledger
from forktools.proof.runner import Outcome
from forktools.queue import pins
from forktools.queue.pins import Base, ForkError

FILE = "symptoms.toml"


@dataclass(frozen=True)
class Symptom:
    exception: str = ""
    message: str = ""
    no_regression: str = ""  # why the test cannot fail on its bug


@dataclass(frozen=True)
class Declared:
    path: str  # as people see it: patches/<base>/symptoms.toml
    symptoms: dict[str, Symptom]


def load(base: Base, port: str = "") -> Declared:
    """The base's declarations, checked: each names an exception and a
    pattern, or why it is no-regression. ``port``: a folder of ports
    (``ports/<release>``) whose own declarations replace the base's for the
    tests they name, where the ported fix's bug shows otherwise there."""
    declared = _read(base.patch_dir / FILE, f"patches/{base.name}/{FILE}")
    if port:
        shown = f"patches/{base.name}/{port}/{FILE}"
        ported = _read(base.patch_dir / port / FILE, shown)
        declared = Declared(
            f"{declared.path} and {shown}", {**declared.symptoms, **ported.symptoms}
        )
    return declared


def _read(file: Path, shown: str) -> Declared:
    if not file.exists():
        return Declared(shown, {})
    try:
        data = pins.tomllib.loads(file.read_text())
    except pins.tomllib.TOMLDecodeError as error:
        raise ForkError(f"{shown}: {error}; fix the file and run again") from None
    return Declared(shown, {test: _symptom(shown, test, d) for test, d in data.items()})


def _symptom(shown: str, test: str, declared: object) -> Symptom:
    names = {field.name for field in fields(Symptom)}
    given = set(declared) if isinstance(declared, dict) else {"a value"}
    counted = {"exception", "message"} <= given and "no_regression" not in given
    if given - names or not (counted or given == {"no_regression"}):
        raise ForkError(
            f'{shown}: ["{test}"] has {", ".join(sorted(given)) or "nothing"}; '
            "declare exception and message, or only no_regression (why the "
            "test cannot fail on its bug)"
        )
    symptom = Symptom(**declared)
    try:
        re.compile(symptom.message)
    except re.error as error:
        raise ForkError(
            f'{shown}: ["{test}"] message is not a regular expression: {error}'
        ) from None
    return symptom


def function_of(nodeid: str) -> str:
    return nodeid.partition("[")[0]


def symptom_of(nodeid: str, declared: Declared) -> Symptom | None:
    """The case's own declaration, else its function's."""
    symptoms = declared.symptoms
    return symptoms.get(nodeid) or symptoms.get(function_of(nodeid))


def problems(without: Outcome, declared: Declared) -> list[str]:
    """Each failure without the fix that is not its test's declared symptom,
    each test function that passes without a no-regression label, and each
    passing case of a function that fails elsewhere without one of its own."""
    found = []
    failing = {function_of(nodeid) for nodeid in without.failures}
    for nodeid, failure in without.failures.items():
        kind, _, message = failure.partition(": ")
        symptom = symptom_of(nodeid, declared)
        said = f"{kind}: {message.splitlines()[0][:160]}" if message else kind
        if symptom is None:
            found.append(f"{nodeid} failed ({said}): no symptom in {declared.path}")
        elif symptom.no_regression:
            found.append(
                f"{nodeid} is declared no-regression in {declared.path} but fails "
                f"({said})"
            )
        elif kind != symptom.exception or not re.search(symptom.message, message):
            found.append(
                f"{nodeid} failed with {said}, not its declared symptom "
                f"{symptom.exception} matching {symptom.message!r}"
            )
    toothless = set()
    for nodeid in sorted(set(without.calls) - set(without.failures)):
        symptom = symptom_of(nodeid, declared)
        if symptom is not None and symptom.no_regression:
            continue
        if function_of(nodeid) in failing:
            found.append(
                f"{nodeid} passes without the fix while other cases of it fail: "
                f'declare ["{nodeid}"] no_regression in {declared.path}, saying '
                "why this case cannot fail on its bug, or make it bite"
            )
        else:
            toothless.add(function_of(nodeid))
    found += [
        f"{function} passes without the fix: make it fail there, or say "
        f"why it cannot (no_regression) in {declared.path}"
        for function in sorted(toothless)
    ]
    return found


def summary(without: Outcome, declared: Declared) -> str:
    """The table's word on a row whose declarations all hold."""
    functions = {function_of(n) for n in without.calls}
    matched = len({function_of(n) for n in without.failures})
    spared = len(functions) - matched
    return f"{matched} matched" + (f", {spared} no-regression" if spared else "")


def ledger_problems(base: Base) -> list[str]:
    """Each failure the ledger records without a fix is its test's declared
    symptom, judged as ``make verify`` judges it; each declaration names a
    test that a patch runs."""
    try:
        declared = load(base)
    except ForkError as e:
        return [str(e)]
    proofs = ledger.load(base).proofs
    found = [
        f"{declared.path}: {patch}: {problem}"
        for patch, proof in sorted(proofs.items())
        for problem in problems(proof.without_fix, declared)
    ]
    if proofs:
        nodeids = {n for proof in proofs.values() for n in proof.without_fix.calls}
        run = nodeids | {function_of(nodeid) for nodeid in nodeids}
        found += [
            f"{declared.path}: declares {test}, which no patch's tests run; "
            "remove it or correct its name"
            for test in sorted(set(declared.symptoms) - run)
        ]
    return found
