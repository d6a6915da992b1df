"""Does ``patches/`` say exactly what the fork trees hold?"""

from __future__ import annotations

import tempfile
from pathlib import Path

from forktools.queue import git, materialize, pins, series
from forktools.queue.pins import Base, ForkError


def problems(base: Base) -> list[str]:
    """Every way in which the base's tree and queue disagree; empty if none.
    The symptoms a ledger records are the proof's to judge
    (``proof.symptom_problems``)."""
    return export_problems(base) + rebased_from_current(base)


def export_problems(base: Base) -> list[str]:
    """Every way in which ``patches/<base>`` is not the exported tree."""
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
    found += _fixes_apply_in_order(base, tree)
    found += _without_fix_diffs(base)
    found += _ports(base)
    found += _bugs_since(base)
    return found


def _ports(base: Base) -> list[str]:
    """Each port sits under the release it was written on and is named for
    the fix it ports, whose subject it carries (``make apply`` takes it as
    that fix)."""
    fixes = {entry.name: entry for entry in series.fixes(base)}
    found = [
        f"patches/{base.name}/{path.relative_to(base.patch_dir)} is neither a "
        "port (<the fix's patch file>) nor its symptoms.toml; remove it"
        for path in sorted((base.patch_dir / series.PORTS).glob("*/*"))
        if path.suffix != ".patch" and path.name != "symptoms.toml"
    ]
    for release, port in series.ports(base):
        shown = f"patches/{base.name}/{port.name}"
        fix = fixes.get(Path(port.name).name)
        if not pins.is_release(release):
            found.append(
                f"{shown}: {release} is not a release version; a port goes in "
                f"patches/{base.name}/{series.PORTS}/<the release it was written on>/"
            )
        elif fix is None:
            found.append(
                f"{shown} ports no fix of the {base.name} queue: name it as the "
                "fix's patch file"
            )
        elif port.subject(base) != fix.subject(base):
            found.append(
                f"{shown}: its subject is not its fix's ({fix.subject(base)!r}); "
                "a port keeps the fix's subject and message"
            )
    return found


def _bugs_since(base: Base) -> list[str]:
    """Each declared release a bug came in with names a fix of the queue
    and a release, and says why."""
    shown = f"patches/{base.name}/{series.BUGS_SINCE}"
    try:
        declared = series.bugs_since(base)
    except (KeyError, ValueError) as error:
        return [f"{shown}: unreadable ({error}); each fix gives since and why"]
    fixes = {entry.name for entry in series.fixes(base)}
    found = []
    for name, (since, why) in declared.items():
        if name not in fixes:
            found.append(f"{shown}: {name} is no fix of the {base.name} queue")
        elif not pins.is_release(since) or not why.strip():
            found.append(
                f"{shown}: {name}: since must be a release version and why "
                "must say what code the bug needs"
            )
    return found


def rebased_from_current(base: Base) -> list[str]:
    """A queue that ``make rebase`` made must carry its source queue as it is
    now: a change there is ported, and recorded with ``PORTED=1``."""
    from forktools.queue import rebase_report

    if not (base.patch_dir / rebase_report.REPORT_JSON).exists():
        return []
    try:
        source = rebase_report.previous_queue(pins.load(), base.version)
        rebase_report.finished_report(source, base.name)
    except ForkError as e:
        return [f"{base.name}: {e}"]
    return []


def _without_fix_diffs(base: Base) -> list[str]:
    """A without-fix diff puts a listed patch's bug back in the sources; the
    tests it is to fail stay as the patch has them."""
    listed = {entry.name for entry in series.entries(base)}
    found = []
    for diff in sorted((base.patch_dir / "verify").glob("*.without-fix.diff")):
        where = f"patches/{base.name}/verify/{diff.name}"
        patch = diff.name.removesuffix(".without-fix.diff")
        if patch not in listed:
            found.append(
                f"{where}: series lists no {patch}; rename the diff after the "
                "patch whose bug it puts back, or remove it"
            )
        tests = sorted(path for path in touched(diff) if path.startswith("tests/"))
        if tests:
            found.append(
                f"{where} changes tests ({', '.join(tests)}): it must put the "
                "bug back in the sources and leave the tests as the patch has them"
            )
    return found


def touched(diff: Path) -> list[str]:
    """The files a unified diff changes, by their new (or old) path."""
    paths: dict[str, None] = {}
    for line in diff.read_text().splitlines():
        if line.startswith(("--- a/", "+++ b/")):
            paths[line[6:].split("\t")[0]] = None
    return list(paths)


def _round_trip(base: Base, tree: Path) -> list[str]:
    """Exporting the tree must reproduce the queue byte for byte."""
    listed = [entry.name for entry in series.entries(base)]
    with tempfile.TemporaryDirectory() as tmp:
        exported = series.export_to(tree, "base", Path(tmp))
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
    for entry in series.entries(base):
        result = git.apply_check(tree, "base", base.patch_dir / entry.name)
        if result.returncode != 0:
            found.append(
                f"patches/{base.name}/{entry.name}: does not apply alone on "
                f"pristine {base.version}: {result.stderr.strip()}"
            )
    return found


def _fixes_apply_in_order(base: Base, tree: Path) -> list[str]:
    """The fixes alone (``make fixes``), one after another on the pristine
    base, as an internal build cherry-picks them."""
    with tempfile.TemporaryDirectory() as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git.run(tree, "read-tree", "base", env=index)
        for entry in series.fixes(base):
            patch = base.patch_dir / entry.name
            result = git.run(
                tree, "apply", "--cached", str(patch), check=False, env=index
            )
            if result.returncode != 0:
                return [
                    f"patches/{base.name}/{entry.name}: does not apply on pristine "
                    f"{base.version} after the fixes before it (make fixes), "
                    f"without the test patches: {result.stderr.strip()}"
                ]
    return []


def _unlisted(base: Base) -> list[str]:
    """Patch files that ``series`` does not list (or a missing ``series``):
    the queue would be built without them."""
    series_file = base.patch_dir / "series"
    listed = {entry.name for entry in series.entries(base)}
    files = sorted(p.name for p in base.patch_dir.glob("*.patch"))
    unlisted = [name for name in files if name not in listed]
    if not unlisted:
        return []
    if not series_file.exists():
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
