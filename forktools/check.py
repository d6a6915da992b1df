"""Does ``patches/`` say exactly what the fork trees hold?"""

from __future__ import annotations

import tempfile
from pathlib import Path

from forktools import git, materialize, queue
from forktools.pins import Base


def problems(base: Base) -> list[str]:
    """Every way in which the base's tree and queue disagree; empty if none."""
    unlisted = _unlisted(base)
    if unlisted:
        return unlisted
    tree = materialize.ensure(base)
    from_wheel = materialize.wheel_edits(tree)
    found = [
        f"{base.name}: unexported edit in {path} (commit it in the tree, then "
        "`make export`)"
        for path in materialize.unexported(tree)
        if path not in from_wheel
    ]
    found += [
        f"{base.name}: {materialize.wheel_edits_problem(tree, [path])}"
        for path in from_wheel
    ]
    if not found:
        found += _round_trip(base, tree)
    found += _applies_alone(base, tree)
    return found


def _round_trip(base: Base, tree: Path) -> list[str]:
    """Exporting the tree must reproduce the queue byte for byte."""
    listed = [entry.name for entry in queue.entries(base)]
    with tempfile.TemporaryDirectory() as tmp:
        exported = queue.export_to(tree, "base", Path(tmp))
        if [p.name for p in exported] != listed:
            return [
                f"{base.name}: series lists {listed}, the tree exports "
                f"{[p.name for p in exported]}; run `make export`"
            ]
        return [
            f"patches/{base.name}/{patch.name}: not what `make export` writes "
            "(edited by hand?); run `make export` and review the diff"
            for patch in exported
            if patch.read_bytes() != (base.patch_dir / patch.name).read_bytes()
        ]


def _applies_alone(base: Base, tree: Path) -> list[str]:
    """Each patch must apply on the pristine base by itself."""
    found = []
    for entry in queue.entries(base):
        result = git.apply_check(tree, "base", base.patch_dir / entry.name)
        if result.returncode != 0:
            found.append(
                f"patches/{base.name}/{entry.name}: does not apply alone on "
                f"pristine {base.version}: {result.stderr.strip()}"
            )
    return found


def _unlisted(base: Base) -> list[str]:
    """Patch files that ``series`` does not list (or a missing ``series``):
    the queue would be built without them."""
    series = base.patch_dir / "series"
    listed = {entry.name for entry in queue.entries(base)}
    files = sorted(p.name for p in base.patch_dir.glob("*.patch"))
    unlisted = [name for name in files if name not in listed]
    if not unlisted:
        return []
    if not series.exists():
        return [
            f"patches/{base.name}/series is missing, and {len(unlisted)} "
            f"patch(es) are there: {', '.join(unlisted)}; restore it (git "
            "checkout) or write it, one patch per line in order"
        ]
    return [
        f"patches/{base.name}/{name} is not listed in series; list it, or "
        "remove the file"
        for name in unlisted
    ]
