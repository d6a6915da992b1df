"""``make verify``: each commit's tests pass with it and fail without it.

For every commit of every queue: the test functions it adds must all pass
with the whole queue applied, and with the commit's source hunks reverted
(its tests kept) at least one must fail, every failure its test's declared
symptom (``forktools/proof/symptoms.py``), nothing erroring in collection or
setup. A test-only commit names a patch that puts the bug back instead,
``patches/<base>/verify/<patch>.without-fix.diff``.

Both halves are facts about exact inputs (the trees with and without the
fix, the locked environments, the harness, the proof code, the tests), kept
in the base's proof ledger (``forktools/proof/ledger.py``) under one key and
proved again only when a row's key changed, or for every row with
``fresh``: a test result is an action output, as a build cache keeps it.
Each run also audits halves of reused rows (a row's tests with every fix,
or without its fix), proving them again: the halves of one slot of a
rotation over the commit count, sized so that every slot fits a budget of
wall-clock minutes and any as many consecutive commits as there are slots
audit every half of every row (``pick_rotation``), then the halves of rows
proved on another kind of machine within what the run's own proofs leave of
the budget. An audit
fails naming the row and what differs from its record, or a fresh failure
that is not its test's declared symptom. ``audit=n`` picks n rows at random
instead. Runs are scheduled across the CPUs longest first, rows of all
bases side by side.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from forktools.environments import venv
from forktools.proof import checkouts, ledger, machine, runner, schedule, symptoms
from forktools.proof.ledger import Ledger, Proof, Subject
from forktools.proof.runner import Outcome, variant_of
from forktools.queue import check, commits, git, materialize, pins, series
from forktools.queue.pins import Base, ForkError
from forktools.queue.table import render

UNKNOWN_SECONDS = 300.0  # a row's tests, with or without its fix
AUDIT_MINUTES = 10.0  # the audit's default wall-clock budget
HALVES = ("with", "without")  # a row's tests with every fix, without its own
# The most slots the rotation takes, as a multiple of the fewest whose share
# of the total fits the budget: a cluster of costly halves in one slot may
# outgrow the budget rather than stretch the rotation without end.
SLOTS_OVER_SHARE = 4


@dataclass
class Row:
    base: str
    patch: str
    tests: int
    with_fix: Outcome | None
    without_fix: Outcome | None
    problem: str = ""
    nodeids: list[str] = field(default_factory=list)
    undone_by: str = ""
    # How the without-fix half was had: "proved in N s", "reused (key ...)".
    proof: str = ""
    # Test functions whose failures are their declared symptoms, and those
    # declared no-regression; "" where a declaration does not hold.
    symptoms: str = ""

    @property
    def holds(self) -> bool:
        return not self.problem


@dataclass
class Planned:
    """A row of this run: its subject, its inputs and the record it has."""

    subject: Subject
    inputs: ledger.Inputs
    recorded: Proof | None
    why: str  # why it is proved again; "" when its record is reused
    # The halves of a reused row proved again this run ("with", "without").
    audited: tuple[str, ...] = ()
    # A row of the patch whose key is not its inputs' digest (dropped on
    # load): its seconds still estimate this one's.
    last: Proof | None = None
    # Its tests with every fix, this run.
    with_fix: Outcome | None = None
    with_fix_seconds: float = 0.0
    # Its tests without its fix, where this run proves them.
    observed: Outcome | None = None
    seconds: float = 0.0

    @property
    def proves(self) -> bool:
        return bool(self.why) or bool(self.audited)

    def runs(self, half: str) -> bool:
        """Whether this run runs the row's tests ``half`` the fix."""
        return bool(self.why) or half in self.audited


@dataclass
class BaseRun:
    base: Base
    tree: Path
    tree_with_fix: str
    environments: dict[str, list[str]]
    ledger: Ledger
    declared: symptoms.Declared  # patches/<base>/symptoms.toml
    planned: list[Planned | ForkError] = field(default_factory=list)
    # The test and engine Pythons, built once the plan is printed (equip).
    python: Path = Path()
    engine: Path | None = None

    @property
    def with_fix_seconds(self) -> float:
        return sum(planned.with_fix_seconds for planned in self.rows())

    def rows(self) -> list[Planned]:
        return [p for p in self.planned if isinstance(p, Planned)]


def _estimate(planned: Planned, half: str = "without") -> float:
    """Expected seconds of one half of the row's tests: those its last
    proof took."""
    last = planned.recorded or planned.last
    if last is None:
        return UNKNOWN_SECONDS
    if half == "with" and last.with_fix_seconds:
        return last.with_fix_seconds
    return last.seconds


def prepare(base: Base, fresh: bool) -> BaseRun:
    """The base's tree and ledger, and what each row needs; its
    environments are read from their locks, not built (``equip``)."""
    tree = materialize.ensure(base)
    environments = venv.environments(base)
    run = BaseRun(
        base,
        tree,
        commits.tree_with_fix(tree),
        environments,
        ledger.load(base),
        symptoms.load(base),
    )
    environment = ledger.environment_digest(base, environments)
    for subject in ledger.subjects(base, tree):
        if isinstance(subject, ForkError):
            run.planned.append(subject)
            continue
        inputs = subject.inputs(run.tree_with_fix, environment)
        recorded = run.ledger.proofs.get(subject.entry.name)
        why = _why(inputs, recorded, fresh)
        last = run.ledger.dropped.get(subject.entry.name)
        run.planned.append(Planned(subject, inputs, recorded, why, last=last))
    return run


def stale(base: Base, proving: bool = False) -> list[str]:
    """Where the base's ledger no longer matches its queue and locks, as
    ``make verify`` would plan it (``prepare``); empty if it does. The
    environments are read from the locks: nothing is built. ``proving``
    (``make test``, whose verify stage comes next) leaves out the rows that
    only need proving: no row yet, or a row whose inputs changed."""
    if not series.entries(base):
        return []
    run = prepare(base, fresh=False)
    where = f"patches/{base.name}/{ledger.FILE}"
    again = f"run `make verify BASE={base.name}`"
    found = [f"patches/{base.name}/{p}; {again}" for p in run.ledger.problems]
    if not run.ledger.proofs:
        rows = len(run.planned)
        if proving:
            return found
        return found + [f"{where}: no proofs for {rows} patch(es); {again}"]
    for planned in run.planned:
        if isinstance(planned, ForkError):
            found.append(str(planned))
        elif proving:
            continue
        elif planned.recorded is None:
            found.append(f"{where}: no row for {planned.subject.entry.name}; {again}")
        elif planned.why:
            changed = "; ".join(planned.inputs.changed(planned.recorded.inputs))
            name = planned.subject.entry.name
            found.append(f"{where}: {name} is stale: {changed}; {again}")
    listed = {p.subject.entry.name for p in run.rows()}
    found += [
        f"{where}: a row for {name}, which series does not list; {again}"
        for name in run.ledger.proofs
        if name not in listed
    ]
    return found


def current_proof(base: Base, patch: str) -> Proof | None:
    """The ledger's row of ``patch``, if the ledger is current (as ``make
    check`` tells, the environment aside)."""
    proof = ledger.load(base).proofs.get(patch)
    return None if proof is None or stale(base) else proof


def equip(run: BaseRun) -> BaseRun:
    """Build (or find) the base's test and engine environments."""
    run.python = venv.ensure(run.base)
    run.engine = venv.ensure_engine(run.base)
    return run


def plan(runs: list[BaseRun], workers: int) -> list[str]:
    """What this run will do, before it builds an environment or runs a test:
    per base the rows to prove and reused, the test-seconds the ledger
    expects, and the environments still to build with the disk they take."""
    lines, total = [], 0.0
    for run in runs:
        rows = run.rows()
        proving = [p for p in rows if p.why]
        audited = [p for p in rows if p.audited]
        seconds = sum(_cost(p) for p in rows if p.subject.tests and p.proves)
        total += seconds
        said = f", {len(audited)} of them audited" if audited else ""
        lines.append(
            f"  {run.base.name}: {len(rows)} rows: {len(proving)} to prove, "
            f"{len(rows) - len(proving)} reused{said}; about {seconds / 60:.0f} "
            "min of test runs"
        )
    lines.append(
        f"  about {total / 60 / workers:.0f} min on {workers} CPU(s), from the "
        "seconds each row's last proof took (a row without one: "
        f"{UNKNOWN_SECONDS / 60:.0f} min)"
    )
    missing = [(run.base, role) for run in runs for role in venv.missing(run.base)]
    if missing:
        needed = sum(venv.TYPICAL_GB[role] for _, role in missing)
        names = ", ".join(f"{base.name} {role}" for base, role in missing)
        lines.append(
            f"  environments to build first: {names}; about {needed:.0f} GB in "
            f"{venv.cache_root()} (free: {_free_gb(venv.cache_root()):.0f} GB)"
        )
    else:
        lines.append("  every environment is built already")
    return ["verify: plan", *lines]


def _free_gb(path: Path) -> float:
    import shutil

    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free / 2**30


def _why(inputs: ledger.Inputs, recorded: Proof | None, fresh: bool) -> str:
    if fresh:
        return "FRESH=1"
    if recorded is None:
        return "no row in the ledger"
    if recorded.key != inputs.key:
        return "changed: " + "; ".join(inputs.changed(recorded.inputs))
    return ""


def pick_audits(runs: list[BaseRun], count: int, seed: int) -> list[Planned]:
    """``count`` reused rows, at random, to prove again."""
    reused = [planned for _, planned in _reused_by_name(runs)]
    picked = random.Random(seed).sample(reused, min(count, len(reused)))
    for planned in picked:
        planned.audited = HALVES
    return picked


def _cost(planned: Planned) -> float:
    """Test-seconds of both halves of a row."""
    return _estimate(planned, "with") + _estimate(planned)


def audit_slots(total: float, budget: float) -> int:
    """How many runs the rotation takes to audit every row: the least power
    of two whose share of ``total`` test-seconds fits ``budget``."""
    slots = 1
    while total / slots > budget:
        slots *= 2
    return slots


def _slots(runs: list[BaseRun], budget: float) -> int:
    """The fewest slots, a power of two, in which every slot's halves fit
    ``budget``, at most SLOTS_OVER_SHARE times as many as the share of the
    total needs."""
    total = sum(_cost(p) for run in runs for p in run.rows())
    share = slots = audit_slots(total, budget)
    halves = _reused_halves(runs)
    while (
        slots < share * SLOTS_OVER_SHARE and max(_slot_seconds(halves, slots)) > budget
    ):
        slots *= 2
    return slots


def _slot_seconds(halves: list[tuple[str, str, Planned]], slots: int) -> list[float]:
    seconds = [0.0] * slots
    for name, half, planned in halves:
        seconds[slot_of(_item(name, half), slots)] += _estimate(planned, half)
    return seconds


def _item(name: str, half: str) -> str:
    """What the rotation places: one half of the row ``name``."""
    return f"{name} {half}"


def slot_of(name: str, slots: int) -> int:
    """The slot of the half ``name`` (``<base>/<patch file> <half>``) among
    ``slots``: a point its name fixes on [0, 1), so that no other row moves
    it."""
    point = int(hashlib.sha256(name.encode()).hexdigest()[:12], 16) / 16**12
    return int(point * slots)


def turn_slot(turn: int, slots: int) -> int:
    """The slot turn ``turn`` audits: its low bits reversed. A turn's slot
    lies within its slot of every coarser rotation, so any ``slots``
    consecutive turns audit every row whatever number of slots, at most
    ``slots``, each of them had."""
    bits = slots.bit_length() - 1
    return int(f"{turn % slots:0{bits}b}"[::-1], 2) if bits else 0


def pick_rotation(
    runs: list[BaseRun], minutes: float, workers: int, turn: int
) -> tuple[list[Planned], int, int]:
    """The reused rows with a half in the slot of ``turn``, those proved on
    another kind of machine first; then, within the budget left after this
    run's own proofs and the slot, the other halves of rows proved on
    another kind of machine. With the slot's number and the number of slots
    (0 with no budget or no reused row). The slot is audited whatever this
    run proves besides, so coverage does not depend on what the queues
    changed. Each picked row's ``audited`` names its halves."""
    budget = minutes * 60 * workers
    halves = _reused_halves(runs)
    if not halves or budget <= 0:
        return [], 0, 0
    slots = _slots(runs, budget)
    number = turn_slot(turn, slots)
    here = machine.fingerprint()
    group = [
        (planned, half)
        for name, half, planned in halves
        if slot_of(_item(name, half), slots) == number
    ]
    for planned, half in group:
        planned.audited += (half,)
    left = budget - sum(_cost(p) for run in runs for p in run.rows() if p.why)
    left -= sum(_estimate(planned, half) for planned, half in group)
    picked = sorted(
        {id(p): p for p, _ in group}.values(), key=lambda p: not _elsewhere(p, here)
    )
    # The other halves of rows from elsewhere, those of the next slots first.
    for _, half, planned in sorted(
        halves, key=lambda item: _after(_item(item[0], item[1]), number, slots)
    ):
        if half in planned.audited or not _elsewhere(planned, here):
            continue
        if _estimate(planned, half) <= left:
            planned.audited += (half,)
            left -= _estimate(planned, half)
            if planned not in picked:
                picked.append(planned)
    return picked, number, slots


def _after(name: str, number: int, slots: int) -> tuple[int, str]:
    return (slot_of(name, slots) - number) % slots, name


def _reused_by_name(runs: list[BaseRun]) -> list[tuple[str, Planned]]:
    return [
        (f"{run.base.name}/{p.subject.entry.name}", p)
        for run in runs
        for p in run.rows()
        if not p.why and p.subject.tests
    ]


def _reused_halves(runs: list[BaseRun]) -> list[tuple[str, str, Planned]]:
    return [(name, half, p) for name, p in _reused_by_name(runs) for half in HALVES]


def _elsewhere(planned: Planned, here: dict) -> bool:
    """Whether the row was proved on a machine unlike this one."""
    assert planned.recorded is not None
    return bool(machine.differences(planned.recorded.machine, here))


def rotation(
    bases: list[Base], minutes: float = AUDIT_MINUTES, workers: int = 0
) -> list[tuple[list[str], float]]:
    """The audit's rotation slots as a run of this tree would cut them: each
    slot's rows and its estimated minutes on ``workers`` CPUs."""
    workers = workers or schedule.default_jobs()
    runs = _prepared(bases)
    halves = _reused_halves(runs)
    if not halves:
        return []
    slots = _slots(runs, minutes * 60 * workers)
    names: list[list[str]] = [[] for _ in range(slots)]
    for name, half, planned in halves:
        names[slot_of(_item(name, half), slots)].append(
            f"{_name(runs, planned)} {half}"
        )
    return [
        (slot, seconds / 60 / workers)
        for slot, seconds in zip(names, _slot_seconds(halves, slots), strict=True)
    ]


def slot_count(bases: list[Base], minutes: float, workers: int = 0) -> int:
    """The rotation's number of slots as a run of this tree sizes it, for
    rows outside the ledgers (``make read-only``'s records); 0 with no
    budget."""
    budget = minutes * 60 * (workers or schedule.default_jobs())
    return _slots(_prepared(bases), budget) if budget > 0 else 0


def _prepared(bases: list[Base]) -> list[BaseRun]:
    return [prepare(base, fresh=False) for base in bases if series.entries(base)]


def commit_count() -> int:
    """Commits on this repository's HEAD: the rotation's turn (0 outside a
    git checkout). A shallow clone has too few: it is deepened first, or
    refused in one line."""
    try:
        shallow = git.out(pins.ROOT, "rev-parse", "--is-shallow-repository")
    except (ForkError, OSError):
        return 0
    if shallow == "true":
        _deepen()
    try:
        return int(git.out(pins.ROOT, "rev-list", "--count", "HEAD"))
    except (ForkError, ValueError):
        return 0  # a repository with no commit yet


def _deepen() -> None:
    print(
        "verify: this clone is shallow; fetching its history for the audit's "
        "turn (the commit count): git fetch --unshallow",
        file=sys.stderr,
        flush=True,
    )
    fetched = git.run(pins.ROOT, "fetch", "--quiet", "--unshallow", check=False)
    if fetched.returncode != 0:
        said = (fetched.stderr.strip() or "no reason given").splitlines()[0]
        raise ForkError(
            f"this clone is shallow and `git fetch --unshallow` failed ({said}): "
            "the audit's turn is the commit count; deepen the clone, or give "
            "AUDIT_SEED=<turn>"
        )


def jobs_for(runs: list[BaseRun]) -> list[schedule.Job]:
    """Every test run, longest expected first. Each row's tests run in a
    session of their own, with every fix and without the row's: the same
    tests, only the tree differs; and one row's tests cannot leave another's
    a process-wide state (vLLM's logging changed, a config set)."""
    jobs = []
    for run in runs:
        for planned in run.rows():
            # A reused row's halves are in the ledger under its key: only
            # those audited run.
            if not planned.subject.tests:
                continue
            if planned.runs("with"):
                with_fix = functools.partial(_run_with_fix, run, planned)
                jobs.append(schedule.Job(_estimate(planned, "with"), with_fix))
            if planned.runs("without"):
                without = functools.partial(_run_without_fix, run, planned)
                jobs.append(schedule.Job(_estimate(planned), without))
    return schedule.ordered(jobs)


def _run_with_fix(run: BaseRun, planned: Planned) -> None:
    print(f"verify: {_label(run, planned, 'with')}: the whole queue", file=sys.stderr)
    planned.with_fix, planned.with_fix_seconds = _run(run, planned, "with")
    _keep_when_proved(run, planned)


def _run_without_fix(run: BaseRun, planned: Planned) -> None:
    doing = "auditing" if planned.audited else f"proving ({planned.why})"
    said = f"{doing}; {planned.subject.undone_by}"
    print(f"verify: {_label(run, planned, 'without')}: {said}", file=sys.stderr)
    tree_id = planned.subject.tree_without_fix
    planned.observed, planned.seconds = _run(run, planned, "without", tree_id)
    _keep_when_proved(run, planned)


_SAVING = threading.Lock()


def _keep_when_proved(run: BaseRun, planned: Planned) -> None:
    """Write a row to the ledger as soon as both its halves are proved, so
    that a run stopped later (killed, out of time) keeps it."""
    with _SAVING:
        if not planned.why or planned.with_fix is None or planned.observed is None:
            return
        _, proof = _conclude_row(run, planned, datetime.date.today().isoformat())
        if proof is not None:
            run.ledger.proofs[proof.patch] = proof
            ledger.save(run.base, run.ledger)


def _label(run: BaseRun, planned: Planned, half: str) -> str:
    return f"{run.base.name} {planned.subject.entry.name[:4]} {half}"


def _run(
    run: BaseRun, planned: Planned, half: str, tree_id: str | None = None
) -> tuple[Outcome, float]:
    """The row's tests in a checkout of ``tree_id`` (default: the whole
    queue), and the seconds they took."""
    started = time.monotonic()
    with checkouts.checkout(run.tree, tree_id) as worktree:
        outcome = runner.run_tests(
            run.python,
            worktree,
            planned.subject.tests,
            run.engine,
            _label(run, planned, half),
        )
    return outcome, time.monotonic() - started


def conclude(run: BaseRun, today: str) -> list[Row]:
    """The base's rows, judged; the ledger updated with what was proved."""
    rows, proofs = [], {}
    for planned in run.planned:
        if isinstance(planned, ForkError):
            rows.append(Row(run.base.name, "?", 0, None, None, str(planned)))
            continue
        row, proof = _conclude_row(run, planned, today)
        if row.without_fix and not symptoms.problems(row.without_fix, run.declared):
            row.symptoms = symptoms.summary(row.without_fix, run.declared)
        rows.append(row)
        if proof is not None:
            proofs[proof.patch] = proof
    run.ledger.proofs = proofs
    run.ledger.environments = run.environments
    run.ledger.problems = []
    return rows


def _conclude_row(
    run: BaseRun, planned: Planned, today: str
) -> tuple[Row, Proof | None]:
    subject = planned.subject
    row = Row(
        run.base.name,
        subject.entry.name,
        len(subject.tests),
        None,
        None,
        nodeids=subject.tests,
        undone_by=subject.undone_by,
    )
    if not subject.tests:
        row.problem = "adds no test functions"
        return row, None
    recorded = planned.recorded
    if planned.why:
        assert planned.with_fix is not None
        row.with_fix = planned.with_fix
        assert planned.observed is not None
        row.without_fix = planned.observed
        row.proof = f"proved in {planned.seconds:.0f} s"
        proof = Proof(
            subject.entry.name,
            planned.inputs,
            subject.undone_by,
            row.with_fix,
            planned.observed,
            today,
            planned.seconds,
            planned.with_fix_seconds,
            machine.fingerprint(),
        )
        row.problem = _judge(row.with_fix, row.without_fix, run.declared)
        # What the tests showed is kept whatever the declarations say: they
        # are judged on every run, and a fixed declaration proves nothing again.
        # A row whose tests fail with the fix proves nothing: never kept.
        observed_failing = bool(planned.observed.failed) and not planned.observed.errors
        with_fix_passing = not planned.with_fix.failed and not planned.with_fix.errors
        return row, proof if observed_failing and with_fix_passing else None
    assert recorded is not None
    row.with_fix = recorded.with_fix
    row.without_fix = recorded.without_fix
    row.proof = f"reused (key {recorded.key[: ledger.KEY_SHOWN]}, {recorded.proved})"
    row.problem = _judge(row.with_fix, row.without_fix, run.declared)
    if planned.audited:
        seconds = planned.with_fix_seconds + planned.seconds
        which = " and ".join(
            f"{half} the fix" for half in sorted(planned.audited, reverse=True)
        )
        row.proof = f"audited in {seconds:.0f} s ({which}): " + row.proof
        if found := _audit(planned, run.declared):
            row.problem = (
                f"audit of the row with key {recorded.key[: ledger.KEY_SHOWN]}: "
                f"{found}; find out why, then "
                f"`make verify FRESH=1 BASE={run.base.name}`"
            )
    return row, recorded


def _audit(planned: Planned, declared: symptoms.Declared) -> str:
    """How the row's halves, proved again, differ from its record, or how
    the fresh failures differ from their declared symptoms; "" if in no way."""
    recorded = planned.recorded
    assert recorded is not None
    with_fix = planned.with_fix
    if with_fix is not None and (differs := _differences(recorded.with_fix, with_fix)):
        return f"proved again with the fix, {differs}"
    if planned.observed is not None:
        if differs := _differences(recorded.without_fix, planned.observed):
            return f"proved again without the fix, {differs}"
        if found := symptoms.problems(planned.observed, declared):
            return f"proved again without the fix, {found[0]}"
    return ""


def _differences(recorded: Outcome, observed: Outcome) -> str:
    """How ``observed`` differs from ``recorded``, in words; "" if it does not."""
    then, now = recorded.facts(), observed.facts()
    for nodeid in sorted(set(then["calls"]) | set(now["calls"])):
        if _fact(then, nodeid) != _fact(now, nodeid):
            return (
                f"{nodeid} {_fact(now, nodeid)}, the ledger says {_fact(then, nodeid)}"
            )
    if then["errors"] != now["errors"]:
        return f"errors {now['errors']}, the ledger says {then['errors']}"
    return ""


def _fact(facts: dict, nodeid: str) -> str:
    outcome = facts["calls"].get(nodeid, "not run")
    kind = facts["failure_types"].get(nodeid)
    return f"{outcome} ({kind})" if kind else outcome


def _judge(
    with_fix: Outcome, without: Outcome, declared: symptoms.Declared | None = None
) -> str:
    return _judge_with(with_fix) or _judge_without(with_fix, without, declared)


def _judge_with(with_fix: Outcome) -> str:
    if with_fix.errors or with_fix.failed or not with_fix.passed:
        failed = ", ".join(
            f"{n}: {f.splitlines()[0][:200]}" for n, f in with_fix.failures.items()
        )
        return (
            f"with the fix: {with_fix.failed} failed{': ' + failed if failed else ''}"
            f"; {'; '.join(with_fix.errors)}"
        )
    return ""


def _judge_without(
    with_fix: Outcome, without: Outcome, declared: symptoms.Declared | None = None
) -> str:
    if without.errors:
        return f"without the fix: {'; '.join(without.errors)}"
    if not without.failed:
        return "without the fix every test still passes: the tests do not bite"
    found = symptoms.problems(without, declared or symptoms.Declared(symptoms.FILE, {}))
    if found:
        more = f"; and {len(found) - 3} more" if len(found) > 3 else ""
        return f"without the fix: {'; '.join(found[:3])}{more}"
    return _judge_variants(with_fix, without)


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
    lines = [
        ("base", "patch", "tests", "with fix", "without fix", "symptoms", "proof")
        + ("holds",)
    ]
    for row in rows:
        lines.append(
            (
                row.base,
                row.patch,
                str(row.tests),
                _ratio(row.with_fix, "passed"),
                _ratio(row.without_fix, "failed"),
                row.symptoms or "-",
                row.proof or "-",
                "yes" if row.holds else f"NO: {row.problem}",
            )
        )
        lines += _variant_lines(row)
        if row.undone_by.startswith("applied "):
            lines.append(("", f"  puts back: {_put_back(row.undone_by)}", *[""] * 6))
    return render(lines)


def _put_back(undone_by: str) -> str:
    """The sources a test-only row's without-fix diff changes."""
    diff = pins.ROOT / undone_by.removeprefix("applied ")
    return ", ".join(check.touched(diff)) if diff.exists() else "?"


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
                "",
                "yes" if passed and not failed and bitten else "no",
            )
        )
    return lines


def _ratio(outcome: Outcome | None, field: str) -> str:
    if outcome is None:
        return "-"
    return f"{getattr(outcome, field)}/{outcome.total} {field}"


def main(
    bases: list[Base],
    jobs: int | None = None,
    *,
    fresh: bool = False,
    audit: int | None = None,
    seed: int | None = None,
    audit_minutes: float = AUDIT_MINUTES,
) -> int:
    """Verify ``bases``: ``jobs`` test runs at a time, rows of every base side
    by side; the table keeps the bases' order. The audit takes the rotation's
    turn (``seed``, default the commit count) within ``audit_minutes``, or
    ``audit`` rows at random (``seed``, default a random one)."""
    # Refuse before anything runs, not once another base's rows are done.
    if audit is None and seed is None:
        seed = commit_count()  # the rotation's turn; a shallow clone deepened
    for base in bases:
        materialize.refuse_if_unexported(
            materialize.ensure(base), f"verify {base.name}"
        )
    runs = [prepare(base, fresh) for base in bases if series.entries(base)]
    for run in runs:
        for planned in run.rows():
            if planned.why:
                print(
                    f"verify: {run.base.name} {planned.subject.entry.name}: to "
                    f"prove ({planned.why})",
                    file=sys.stderr,
                )
    workers = jobs or schedule.default_jobs()
    if audit is not None:
        seed = seed if seed is not None else random.SystemRandom().randrange(2**32)
        audited = pick_audits(runs, audit, seed)
        how = f"at random (seed {seed}; AUDIT_SEED={seed} repeats it)"
    else:
        turn = seed
        audited, number, slots = pick_rotation(runs, audit_minutes, workers, turn)
        how = (
            f"rotation slot {number + 1} of {slots} (turn {turn}, the commit "
            f"count; AUDIT_SEED={turn} repeats it), slots sized for "
            f"{audit_minutes:g} min on {workers} CPU(s), so that any {slots} "
            "consecutive commits audit both halves of every row; then halves of "
            "rows proved on another kind of machine within what this run's own "
            "proofs leave of it"
            if slots
            else f"within {audit_minutes:g} min: no audit budget"
            if audit_minutes <= 0
            else "no row is reused to audit"
        )
    names = ", ".join(_audited_name(runs, planned) for planned in audited) or "no row"
    print(f"verify: auditing {names}, {how}", file=sys.stderr)
    print("\n".join(plan(runs, workers)), file=sys.stderr, flush=True)
    for run in runs:
        equip(run)
    started = time.monotonic()
    schedule.execute(jobs_for(runs), workers)
    wall = time.monotonic() - started
    today = datetime.date.today().isoformat()
    rows = []
    for run in runs:
        rows += conclude(run, today)
        ledger.save(run.base, run.ledger)
    print(table(rows) if rows else "verify: every queue is empty")
    print(timing(runs, wall, workers))
    return 0 if all(row.holds for row in rows) else 1


def _audited_name(runs: list[BaseRun], planned: Planned) -> str:
    """The row, and the half audited where it is one."""
    [half] = planned.audited if len(planned.audited) == 1 else [""]
    return f"{_name(runs, planned)} {half}".rstrip()


def _name(runs: list[BaseRun], planned: Planned) -> str:
    base = next(run.base.name for run in runs if planned in run.rows())
    return f"{base} {planned.subject.entry.name[:4]}"


def timing(runs: list[BaseRun], wall: float, workers: int) -> str:
    """Where the test runs' seconds went, and the wall time they took."""
    with_fix = ", ".join(
        f"{run.base.name} {run.with_fix_seconds:.0f} s" for run in runs
    )
    proved = [p.seconds for run in runs for p in run.rows() if p.runs("without")]
    return (
        f"time: with every fix {with_fix or '-'}; without a fix {len(proved)} "
        f"run(s), {sum(proved):.0f} s; {wall:.0f} s on {workers} CPU(s)"
    )
