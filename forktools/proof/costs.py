"""``make costs``: where the proof's test-seconds go, from the ledgers.

Each ledger row keeps the seconds of each case in both halves (setup and
teardown included); summed per test file, they show which tests a cheaper
proof starts with, and the costliest cases of each, without running a test;
and the audit's rotation, the rows each of the next commits proves again.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from forktools.proof import ledger, schedule
from forktools.queue.pins import Base
from forktools.queue.table import render

CASES_SHOWN = 3


@dataclass
class FileCost:
    with_fix: float = 0.0
    without_fix: float = 0.0
    # Both halves of each case, by its id within the file.
    cases: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    @property
    def both(self) -> float:
        return self.with_fix + self.without_fix


def per_file(bases: list[Base]) -> dict[tuple[str, str], FileCost]:
    """The seconds of each (base, test file)."""
    found: dict[tuple[str, str], FileCost] = defaultdict(FileCost)

    def spent(base: Base, nodeid: str, seconds: float) -> FileCost:
        """The file's cost, with ``seconds`` counted for its case."""
        file, _, case = nodeid.partition("::")
        cost = found[(base.name, file)]
        cost.cases[case] += seconds
        return cost

    for base in bases:
        for proof in ledger.load(base).proofs.values():
            for nodeid, seconds in proof.with_fix.seconds.items():
                spent(base, nodeid, seconds).with_fix += seconds
            for nodeid, seconds in proof.without_fix.seconds.items():
                spent(base, nodeid, seconds).without_fix += seconds
    return found


def table(bases: list[Base]) -> str:
    files = per_file(bases)
    total = sum(cost.both for cost in files.values())
    if not files:
        return (
            "costs: no ledger row records its cases' seconds; "
            "`make verify FRESH=1` records them"
        )
    lines = [("base", "test file", "with fix", "without", "share", "costliest cases")]
    for (base, file), cost in sorted(files.items(), key=lambda item: -item[1].both):
        cases = sorted(cost.cases.items(), key=lambda item: -item[1])
        shown = ", ".join(f"{case} {s:.0f} s" for case, s in cases[:CASES_SHOWN])
        lines.append(
            (
                base,
                file,
                f"{cost.with_fix:.0f} s",
                f"{cost.without_fix:.0f} s",
                f"{cost.both / total:.0%}" if total else "-",
                shown,
            )
        )
    workers = schedule.default_jobs()
    minutes = total / 60 / workers
    return render(lines) + (
        f"\ntotal: {total:.0f} test-seconds, at best {minutes:.0f} min on "
        f"{workers} CPU(s)"
    )


def rotation_table(bases: list[Base], turns: int = 10) -> str:
    """The audit's rotation slots, and those the next ``turns`` commits
    take (a commit's turn is its commit count)."""
    from forktools.proof import verify

    workers = schedule.default_jobs()
    slots = verify.rotation(bases, verify.AUDIT_MINUTES, workers)
    if not slots:
        return "audit rotation: no reused row to audit"
    turn = verify.commit_count() + 1
    taken = [verify.turn_slot(turn + k, len(slots)) for k in range(turns)]
    lines = [("slot", "halves audited", f"minutes on {workers} CPU(s)", "next commits")]
    for number, (rows, minutes) in enumerate(slots):
        nth = [str(k + 1) for k, slot in enumerate(taken) if slot == number]
        lines.append(
            (str(number + 1), ", ".join(rows) or "-", f"{minutes:.1f}", ", ".join(nth))
        )
    return (
        f"audit rotation ({verify.AUDIT_MINUTES:g} min on {workers} CPU(s)): "
        f"{len(slots)} slots, so any {len(slots)} consecutive commits audit both "
        f"halves of every row; the next {turns} commits (turns {turn} to "
        f"{turn + turns - 1}) take the slots marked\n" + render(lines)
    )


def main(bases: list[Base]) -> int:
    print(table(bases))
    print()
    print(rotation_table(bases))
    return 0
