"""``make status``: every queue's patches, their upstream status, and for each
newer pinned release whether it already contains the patch.

A release contains a patch when the patch reverse-applies on its pristine
tree. A backport rarely does (upstream wrote its own fix), so for a
``Backport`` the release its trailer names counts too. Only pristine trees
already here are read; ``fetch`` downloads and builds the missing ones and
asks the package index for releases newer than the newest pin.
"""

from __future__ import annotations

from forktools import git, materialize, pins, queue, upstream, wheel
from forktools.pins import Base
from forktools.table import render

HEADER = ("base", "#", "patch", "subject", "upstream status", "newer releases")


NOT_HERE = "not here (FETCH=1)"


def in_release(
    base: Base,
    entry: queue.Entry,
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


def rows(
    bases: list[Base], pinned: pins.Pins, fetch: bool = False
) -> list[tuple[str, ...]]:
    result = [HEADER]
    for base in bases:
        newer = [
            other
            for other in pinned.newest_first()[::-1]
            if pins.version_key(other.version) > pins.version_key(base.version)
        ]
        entries = queue.entries(base)
        for number, entry in enumerate(entries, 1):
            try:
                status = entry.upstream_status(base)
            except upstream.StatusError:
                status = None
            releases = "; ".join(
                f"{other.name}: {in_release(base, entry, status, other, fetch)}"
                for other in newer
            )
            shown = str(status) if status else "MISSING (see make lint)"
            subject = entry.subject(base)
            result.append(
                (base.name, str(number), entry.name, subject, shown, releases or "-")
            )
        if not entries:
            result.append((base.name, "-", "(empty queue)", "", "", ""))
    return result


def main(bases: list[Base], fetch: bool = False) -> int:
    pinned = pins.load()
    print(render(rows(bases, pinned, fetch)))
    if fetch:
        from forktools import relock

        print(newer_release_line(pinned))
        for base in bases:
            for line in relock.moves(base):
                print(f"lock: {line}")
    current = materialize.selected()
    if current:
        selected = pinned.get(current)
        print(f"\nselected: {current} ({materialize.version(selected)})")
    for line in wheel_lines(bases):
        print(line)
    return 0


def wheel_lines(bases: list[Base]) -> list[str]:
    """One line per fork wheel in dist/: its sha256 and the upstream wheel's."""
    lines = []
    for base in bases:
        for built in wheel.manifests(base):
            upstream_wheel = built["upstream_wheel"]
            stale = built["version"] != materialize.version(base)
            lines.append(
                f"wheel: dist/{built['wheel']} sha256 {built['sha256']}, from "
                f"{upstream_wheel['file']} sha256 {upstream_wheel['sha256']}"
                + (" (stale: the queue changed; run make wheel)" if stale else "")
            )
    return lines


def newer_release_line(pinned: pins.Pins) -> str:
    """Which releases the package index offers beyond the newest pin."""
    from forktools import download

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
