"""What ``make rebase`` leaves beside a queue it made: its report, and the
source queue it was made from, which ``make check`` compares with that
queue as it is now. Apart from ``rebase`` so that ``check`` reads it
without importing the rebase, which checks the exported queue itself.
"""

from __future__ import annotations

import json
from pathlib import Path

from forktools.queue import pins, series
from forktools.queue.pins import Base, ForkError

REPORT_MD = "REBASE.md"
REPORT_JSON = "rebase.json"


def previous_queue(pinned: pins.Pins, version: str) -> Base:
    """The newest pinned base older than ``version`` that has a queue."""
    for base in pinned.newest_first():
        older = pins.version_key(base.version) < pins.version_key(version)
        if older and (base.patch_dir / "series").exists():
            return base
    raise ForkError(f"no pinned base older than {version} has a queue to rebase")


def finished_report(source: Base, name: str) -> Path | None:
    """The finished report of a rebase from ``source``'s current queue, if any."""
    path = pins.ROOT / "patches" / name / REPORT_JSON
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    if not report["complete"]:
        return None
    made_from = report.get("ported_from", report["from"])
    if made_from == queue_state(source):
        return path.with_name(REPORT_MD)
    version = name.removeprefix("v")
    raise ForkError(
        f"patches/{name} was rebased from patches/{made_from['base']} (queue "
        f"{made_from['queue']}), which has changed since (now "
        f"{source.name}, queue {series.patches_id(source)}). Port the change into "
        f"the {name} tree, `make export BASE={name}`, then `make rebase "
        f"TO={version} PORTED=1` to record it; or `git rm -r patches/{name}` "
        "and run the rebase again to replay it from scratch."
    )


def queue_state(source: Base) -> dict[str, str]:
    return {"base": source.name, "queue": series.patches_id(source)}
