"""``make releases``: every vLLM release from the oldest pinned base to the
newest, against every fix, as ``make apply`` would take it: written to
``docs/releases.md``.

The releases are the latest patch release of each minor that the package
index offers between the oldest and the newest pin. Each one's sdist (its
published sha256 checked) becomes a git checkout in the cache, one commit,
and each fix ``make apply`` takes from the oldest base (its queue's, then
those only a newer queue carries) is tried alone on it
(``apply.try_alone``): in the version of the nearest base at or below the
release where that queue carries it, else its own queue's, then any other
queue's, then its ports. A cell says "has it" (with the upstream
release that fixed it, or "code" where its source changes reverse-apply),
"applies", "applies as <base>'s", "applies as the <release> port" (a port
kept in ``patches/<base>/ports/<release>/``), "no code" (none of the files
it fixes is there), "no bug (came in <release>)" (the queue's
``bugs_since.toml`` says the bug came with a later release) or "port
needed" (the release has the bug and neither a queue's version nor a port
applies).
"""

from __future__ import annotations

import datetime
import sys

from forktools.queue import download, pins, series
from forktools.queue.pins import Base
from forktools.shipping import apply, release_sdists

PAGE = "docs/releases.md"


def releases(pinned: pins.Pins) -> list[str]:
    """The latest patch release of each minor, from the oldest pin to the
    newest, as the index offers them."""
    oldest, newest = (pinned.newest_first()[i].version for i in (-1, 0))
    latest: dict[tuple[int, ...], str] = {}
    for candidate in download._pip_candidates("vllm"):
        version = str(candidate.version)
        try:
            key = pins.version_key(version)
        except ValueError:
            continue  # dev and post releases
        if key[3] != 3 or not pins.version_key(oldest) <= key <= pins.version_key(
            newest
        ):
            continue  # a pre-release, or out of range
        minor = key[:2]
        if minor not in latest or pins.version_key(latest[minor]) < key:
            latest[minor] = version
    return [latest[minor] for minor in sorted(latest)]


def row(version: str, fixes: list[apply.Fix], pinned: pins.Pins) -> list[str]:
    """Each fix on the release, alone."""
    checkout = release_sdists.checkout_of(version)
    nearest = apply.base_for(version, pinned)
    cells = []
    for fix in fixes:
        base, own = fix.base, fix.entry
        for candidate in series.fixes(nearest):
            if apply.same_fix(fix.base, fix.entry, nearest, candidate):
                base, own = nearest, candidate
        cells.append(apply.try_alone(checkout, base, own, version, pinned))
    return cells


def _column(fix: apply.Fix, oldest: Base) -> str:
    number = fix.entry.name[:4]
    return number if fix.base is oldest else f"{fix.base.name} {number}"


def main() -> int:
    pinned = pins.load()
    oldest = pinned.newest_first()[-1]
    fixes = apply.needed(oldest, pinned)
    lines = [("release", *(_column(fix, oldest) for fix in fixes))]
    for version in releases(pinned):
        print(f"releases: {version}", file=sys.stderr, flush=True)
        lines.append((version, *row(version, fixes, pinned)))
    legend = [
        f"- {_column(fix, oldest)}: {fix.entry.subject(fix.base)}" for fix in fixes
    ]
    page = pins.ROOT / PAGE
    page.write_text(
        "# The fixes on every release\n\n"
        "Written by `make releases` from the package index's sdists, as it "
        f"offered them on {datetime.date.today().isoformat()} (do not "
        "edit): each fix of the "
        f"{oldest.name} queue, then each that only a newer queue carries, "
        "alone, on the latest patch release of each "
        "minor from the oldest pin to the newest, as `make apply` takes it "
        "(see `forktools/shipping/releases.py` for what a cell means). A fix "
        "that applies is not yet proved there: `make apply ONTO=<a checkout of "
        "the release> PYTHON=<its environment>` runs its tests with and "
        "without it.\n\n" + _markdown(lines) + "\n\n" + "\n".join(legend) + "\n"
    )
    print(f"releases: {page}")
    return 0


def _markdown(rows: list[tuple[str, ...]]) -> str:
    header, *body = rows
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])
