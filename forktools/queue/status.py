"""``make status``: every queue's patches, their upstream status, and for each
newer pinned release whether it already contains the patch.

A release contains a patch when the patch reverse-applies on its pristine
tree. A backport rarely does (upstream wrote its own fix), so for a
``Backport`` the release its trailer names counts too. A patch the release
lacks is carried when that release's queue has a patch of the same subject
(what ``make rebase`` keeps) or one that creates the same test module (a fix
written again for newer code), read from the committed queues; a newer queue
may leave a fork-only test out on purpose ("not carried"), never a fix
("NEEDED"). Only pristine trees already here are read; ``fetch`` downloads
and builds the missing ones and asks the package index for releases newer
than the newest pin.

By default one base, in the terminal's width (80 columns when it is not a
terminal); ``wide`` gives every base with the full upstream status.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass

from forktools.queue import git, materialize, pins, series, upstream
from forktools.queue.pins import Base
from forktools.queue.table import render

HEADER = ("base", "#", "patch", "subject", "upstream status", "newer releases")


NOT_HERE = "not here (FETCH=1)"
CARRIED = "carried"
NOT_CARRIED = "not carried"
NEEDED = "NEEDED: not carried"
SHORT = {NOT_HERE: "not here", "in (reverse-applies)": "in release", NEEDED: "NEEDED"}
_TAGS = re.compile(r"^(\[[^\]]*\])+\s*")


def in_release(
    base: Base,
    entry: series.Entry,
    status: upstream.Status | None,
    newer: Base,
    fetch: bool = False,
) -> str:
    """Whether ``newer`` already holds ``entry`` of ``base``'s queue, whose
    trailer says ``status`` (None where it has no valid one)."""
    released = status.released_in if status and status.kind == "Backport" else None
    if released and pins.version_key(released) <= pins.version_key(newer.version):
        return f"upstream's own fix (v{released})"
    tree = materialize.pristine(newer) if fetch else materialize.pristine_here(newer)
    if tree is None:
        return NOT_HERE
    patch = base.patch_dir / entry.name
    if git.apply_check(tree, "base", patch, reverse=True).returncode == 0:
        return "in (reverse-applies)"
    return "needed"


@dataclass(frozen=True)
class Carried:
    """What a newer queue carries: its patches' subjects and the test
    modules they create."""

    subjects: frozenset[str]
    tests: frozenset[str]

    @classmethod
    def by(cls, newer: Base) -> Carried:
        entries = series.entries(newer)
        return cls(
            frozenset(entry.subject(newer) for entry in entries),
            frozenset(t for entry in entries for t in entry.new_test_modules(newer)),
        )


def in_newer(
    base: Base,
    entry: series.Entry,
    status: upstream.Status | None,
    newer: Base,
    carried: Carried,
    fetch: bool = False,
) -> str:
    """Whether ``newer``'s queue carries ``entry`` (read from the committed
    queues: nothing to download), else whether the release holds it
    (``in_release``). A queue carries only what its release lacks."""
    subject_carried = entry.subject(base) in carried.subjects
    if subject_carried or entry.new_test_modules(base) & carried.tests:
        return CARRIED
    held = in_release(base, entry, status, newer, fetch)
    if held != "needed":
        return held
    return NEEDED if entry.is_fix(base) else NOT_CARRIED


def newer_than(base: Base, pinned: pins.Pins) -> dict[Base, Carried]:
    """The releases pinned newer than ``base``, oldest first, each with what
    its queue carries."""
    return {
        other: Carried.by(other)
        for other in pinned.newest_first()[::-1]
        if pins.version_key(other.version) > pins.version_key(base.version)
    }


def _status(base: Base, entry: series.Entry) -> upstream.Status | None:
    try:
        return entry.upstream_status(base)
    except upstream.StatusError:
        return None


def rows(
    bases: list[Base], pinned: pins.Pins, fetch: bool = False
) -> list[tuple[str, ...]]:
    result = [HEADER]
    for base in bases:
        newer = newer_than(base, pinned)
        entries = series.entries(base)
        for number, entry in enumerate(entries, 1):
            status = _status(base, entry)
            releases = "; ".join(
                f"{other.name}: {in_newer(base, entry, status, other, held, fetch)}"
                for other, held in newer.items()
            )
            shown = str(status) if status else "MISSING (see make lint)"
            subject = entry.subject(base)
            result.append(
                (base.name, str(number), entry.name, subject, shown, releases or "-")
            )
        if not entries:
            result.append((base.name, "-", "(empty queue)", "", "", ""))
    return result


def kind(base: Base, entry: series.Entry, status: upstream.Status | None) -> str:
    """A fix (it changes vllm/) or a test, with its upstream status; a
    fork-only test is not for upstream."""
    said = status.kind if status else "MISSING"
    if entry.is_fix(base):
        return f"fix: {said}"
    return "fork-only test" if said == "Inappropriate" else f"test: {said}"


def narrow(base: Base, pinned: pins.Pins, fetch: bool = False, width: int = 0) -> str:
    """One base's queue in ``width`` columns (the terminal's): the subject,
    its tags left out, is cut to what is left."""
    width = width or shutil.get_terminal_size((80, 24)).columns
    newer = newer_than(base, pinned)
    table = [("#", "kind: upstream", *(b.name for b in newer), "subject")]
    entries = series.entries(base)
    for number, entry in enumerate(entries, 1):
        status = _status(base, entry)
        cells = [
            in_newer(base, entry, status, other, held, fetch)
            for other, held in newer.items()
        ]
        table.append(
            (
                str(number),
                kind(base, entry, status),
                *(_short(cell) for cell in cells),
                _TAGS.sub("", entry.subject(base)),
            )
        )
    used = max(map(len, render([row[:-1] for row in table]).splitlines()))
    room = width - used - 2
    if table[1:]:
        room = max(room, 20)
        table = [(*row[:-1], _cut(row[-1], room)) for row in table]
    fixes = sum(row[1].startswith("fix") for row in table[1:])
    default = " (the default)" if base.name == pinned.default else ""
    lines = [
        f"{base.name}{default}: {len(entries)} patches, {fixes} fixes "
        f"(make fixes BASE={base.name}), {len(entries) - fixes} tests",
        render(table) if entries else "(empty queue)",
    ]
    if any(_short(NOT_HERE) in row for row in table):
        lines.append(
            "not here: whether that release already holds the patch needs its "
            "pristine tree; make status FETCH=1 downloads its sdist and wheel "
            "(300 to 500 MB a release)"
        )
    return "\n".join(lines)


def _short(cell: str) -> str:
    released = re.fullmatch(r"upstream's own fix \(v(.*)\)", cell)
    return f"fixed {released[1]}" if released else SHORT.get(cell, cell)


def _cut(text: str, room: int) -> str:
    return text if len(text) <= room else text[: room - 1].rstrip() + "…"


def main(
    bases: list[Base],
    fetch: bool = False,
    wide: bool = True,
    lock_moves: Callable[[Base], list[str]] | None = None,
    wheel_lines: Callable[[list[Base], bool], list[str]] | None = None,
) -> int:
    """The status table; with ``fetch``, the newer releases the index offers
    and each lock's moves (``lock_moves``, ``make lock``'s); then the
    selected base and the fork wheels built (``wheel_lines``)."""
    pinned = pins.load()
    if wide:
        print(render(rows(bases, pinned, fetch)))
    else:
        print("\n\n".join(narrow(base, pinned, fetch) for base in bases))
        print("make status WIDE=1: every base, with the full upstream status")
    if fetch:
        print(newer_release_line(pinned))
        for base in bases:
            for line in lock_moves(base) if lock_moves else []:
                print(f"lock: {line}")
    current = materialize.selected()
    if current:
        selected = pinned.get(current)
        print(f"\nselected: {current} ({materialize.version(selected)})")
    for line in wheel_lines(bases, wide) if wheel_lines else []:
        print(line)
    return 0


def newer_release_line(pinned: pins.Pins) -> str:
    """Which releases the package index offers beyond the newest pin."""
    from forktools.queue import download

    newest = pinned.newest_first()[0].version
    try:
        offered = {str(c.version) for c in download._pip_candidates("vllm")}
    except Exception as error:  # an index that cannot be reached is no reason to fail
        return f"index: not asked for newer releases ({error})"
    newer = sorted((v for v in offered if _is_newer(v, newest)), key=pins.version_key)
    if not newer:
        return f"index: nothing newer than v{newest}, the newest pin"
    return (
        f"index: newer than v{newest}: {', '.join(newer)} (make rebase TO={newer[-1]})"
    )


def _is_newer(version: str, than: str) -> bool:
    try:
        return pins.version_key(version) > pins.version_key(than)
    except ValueError:  # dev or post releases
        return False
