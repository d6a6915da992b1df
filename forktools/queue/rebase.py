"""``make rebase TO=<version>``: carry the newest queue onto a new release.

1. Pin the release in ``upstream.toml`` (sdist, x86_64 and aarch64 wheels),
   hashing the files fetched through pip and checking the index's hashes.
2. Build its fork tree with history: the previous base's pristine sources
   (tag ``previous-base``), the previous queue on them (branch ``previous``),
   and the new release as a child of ``previous-base`` (tag ``base``). Every
   cherry-pick of a previous commit onto ``base`` is then a three-way merge
   with a real merge base.
3. Replay the previous queue patch by patch and classify each: applied as
   is, refreshed (context moved), conflict (left in the tree to resolve), or
   already upstream and dropped, with the evidence. With ``probe`` (the
   proof's ``probe_tests``), a fix's own tests also run on the new release
   without it first: when they all pass, upstream fixed the bug its own way
   and the patch is dropped.
4. Write ``patches/<new>/``: the series and patches, and the report in
   ``REBASE.md`` and ``rebase.json``.

A finished rebase is not redone; running it again changes nothing. After a
conflict, resolve it in the tree and run the command again to go on.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from forktools.queue import commits, download, git, materialize, pins, series
from forktools.queue.pins import Artifact, Base, ForkError
from forktools.queue.rebase_report import (
    REPORT_JSON,
    REPORT_MD,
    finished_report,
    previous_queue,
    queue_state,
)

PORTED_NOTE = "Later changes of"
STATE = "vllm-fork-rebase.json"
PREVIOUS = "previous"
OUTCOMES = {
    "applied": "applied as is",
    "refreshed": "applied after refresh",
    "conflict": "conflict",
    "resolved": "conflict, resolved by hand",
    "skipped": "conflict, dropped by hand",
    "upstream": "already upstream, dropped",
    "pending": "waits for the conflict above",
}
KEPT = ("applied", "refreshed", "resolved")
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")
_SCOPE = re.compile(r"^\s*(?:async\s+def|def|class)\s+(\w+)")


@dataclass
class Result:
    """A patch of the previous queue replayed on the new release."""

    patch: str
    commit: str
    outcome: str = "pending"
    evidence: list[str] = field(default_factory=list)
    new_patch: str = ""


# --- entry point -----------------------------------------------------------


Probe = Callable[[Base, Path, Result], None]


def rebase(version: str, probe: Probe | None = None, ported: bool = False) -> Path:
    """Rebase onto ``version``; returns the report. Idempotent once finished.

    With ``ported``, a finished rebase whose source queue changed since records
    that the new queue carries the change (ported by hand) instead of refusing.
    """
    version = _plain_version(version)
    pinned = pins.load()
    source = previous_queue(pinned, version)
    if ported:
        _record_port(source, f"v{version}")
    done = finished_report(source, f"v{version}")
    if done:
        print(f"rebase: {done.relative_to(pins.ROOT)} is up to date; nothing to do")
        return done
    target = ensure_pinned(version, source)
    tree = materialize.tree_dir(target)
    state = _read_state(tree)
    if state.get("from") == queue_state(source):
        results = _resume(tree, [Result(**r) for r in state["results"]])
    else:
        _refuse_existing_queue(target)
        build_tree(source, target)
        results = _previous_commits(tree, source)
    return _replay(source, target, tree, results, probe)


def is_complete(report: Path) -> bool:
    return json.loads(report.with_name(REPORT_JSON).read_text())["complete"]


def _plain_version(version: str) -> str:
    plain = version.removeprefix("v")
    try:
        pins.version_key(plain)
    except ValueError:
        raise ForkError(
            f"TO={version!r} is not a release version such as 0.34.0 or 0.35.0rc1"
        ) from None
    return plain


def _record_port(source: Base, name: str) -> None:
    """Note in the finished report that its queue carries ``source``'s queue now."""
    from forktools.queue import check

    path = pins.ROOT / "patches" / name / REPORT_JSON
    if not path.exists() or not json.loads(path.read_text())["complete"]:
        raise ForkError(
            f"PORTED=1 records a port into a finished rebase; patches/{name} has "
            f"none (no complete {REPORT_JSON}): run `make rebase TO="
            f"{name.removeprefix('v')}` first"
        )
    # The proof of the ported queue comes after, from `make verify`.
    problems = check.export_problems(pins.load().get(name))
    if problems:
        raise ForkError(
            f"PORTED=1: patches/{name} is not the exported tree yet, so it cannot "
            "carry the port:\n  " + "\n  ".join(problems)
        )
    report = json.loads(path.read_text())
    report["ported_from"] = queue_state(source)
    path.write_text(json.dumps(report, indent=2) + "\n")
    markdown_path = path.with_name(REPORT_MD)
    kept = markdown_path.read_text().split(PORTED_NOTE)[0].rstrip("\n")
    markdown_path.write_text(
        f"{kept}\n\n{PORTED_NOTE} `patches/{source.name}` (queue "
        f"{report['ported_from']['queue']}) were ported into this queue by hand.\n"
    )
    print(
        f"rebase: patches/{name} carries patches/{source.name} (queue "
        f"{report['ported_from']['queue']}) now, as ported by hand",
        file=sys.stderr,
    )


def _refuse_existing_queue(target: Base) -> None:
    if (target.patch_dir / "series").exists():
        raise ForkError(
            f"patches/{target.name} already holds a queue that `make rebase` did "
            "not make (no rebase.json); move it away and run again"
        )


# --- pinning ---------------------------------------------------------------


def ensure_pinned(version: str, source: Base) -> Base:
    """The pinned base of ``version``, pinning it first if needed."""
    name = f"v{version}"
    if name not in pins.load().bases:
        artifacts = [_pin(offer) for offer in release_files(version)]
        pins.append_base(
            Base(
                name,
                version,
                artifacts[0],
                tuple(artifacts[1:]),
                source.test_requirements,
            ),
            note=f"Pinned by `make rebase`; test requirements as for {source.name}.",
        )
        print(f"rebase: pinned {name} in {pins.PIN_FILE.name}", file=sys.stderr)
    return pins.load().get(name)


def release_files(version: str) -> list[download.Offer]:
    """The release's sdist, then one wheel per architecture, as the index has them."""
    offered = download.offers("vllm", version)
    if not offered:
        raise ForkError(
            f"vllm {version} is not offered by any configured package index; "
            "check the version and your pip configuration (pip config list)"
        )
    names = ", ".join(offer.file for offer in offered)
    sdists = [o for o in offered if o.file == f"vllm-{version}.tar.gz"]
    if not sdists:
        raise ForkError(f"no sdist vllm-{version}.tar.gz among: {names}")
    wheels = []
    for arch in download.ARCHES:
        found = [o for o in offered if o.file.endswith(f"_{arch}.whl")]
        if not found:
            raise ForkError(f"no {arch} wheel of vllm {version} among: {names}")
        wheels.append(found[0])
    return [sdists[0], *wheels]


def _pin(offer: download.Offer) -> Artifact:
    path = download.fetch_offer(offer)
    return Artifact(offer.file, pins.sha256_of(path))


# --- the tree --------------------------------------------------------------


def build_tree(source: Base, target: Base) -> Path:
    """The target's tree: previous release and queue, then the new release."""
    with materialize.tree_lock(target):
        return _build_tree(source, target, materialize.tree_dir(target))


def _build_tree(source: Base, target: Base, tree: Path) -> Path:
    if tree.exists():
        materialize.refuse_if_unexported(tree, f"rebuild the {target.name} tree")
    staging = tree.with_name(f".{target.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        materialize.extract_sdist(download.fetch(source.sdist), staging)
        git.run(staging, "init", "--quiet", f"--initial-branch={PREVIOUS}")
        materialize.commit_pristine(source, staging, tag="previous-base")
        series.apply(source, staging)
        git.run(staging, "checkout", "--quiet", "-b", "fork", "previous-base")
        for part in materialize.SDIST_PARTS:
            _remove(staging / part.rstrip("/"))
        materialize.extract_sdist(download.fetch(target.sdist), staging)
        materialize.commit_pristine(target, staging)
        wheel = download.fetch(target.wheel_for_this_machine())
        materialize.overlay_wheel(wheel, staging)
        materialize.record(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    materialize.swap_in(staging, tree)
    return tree


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _previous_commits(tree: Path, source: Base) -> list[Result]:
    """One pending result per previous patch, with its commit in ``tree``."""
    commit_ids = git.out(tree, "rev-list", "--reverse", f"previous-base..{PREVIOUS}")
    entries = series.entries(source)
    return [
        Result(entry.name, commit)
        for entry, commit in zip(entries, commit_ids.split(), strict=True)
    ]


def _read_state(tree: Path) -> dict:
    path = tree / ".git" / STATE
    return json.loads(path.read_text()) if path.exists() else {}


def _write_state(tree: Path, source: Base, results: list[Result]) -> None:
    state = {
        "from": queue_state(source),
        "results": [asdict(r) for r in results],
    }
    (tree / ".git" / STATE).write_text(json.dumps(state, indent=2) + "\n")


def _resume(tree: Path, results: list[Result]) -> list[Result]:
    """Take up a rebase stopped at a conflict that the maintainer resolved."""
    stopped = next((r for r in results if r.outcome == "conflict"), None)
    dirty = git.out(tree, "status", "--porcelain", "--untracked-files=all")
    picking = (tree / ".git" / "CHERRY_PICK_HEAD").exists()
    if picking or dirty:
        name = stopped.patch if stopped else "a patch"
        raise ForkError(
            f"{name} is still being resolved in {tree}:\n{dirty}\nResolve the "
            "conflicts, `git add` the files and `git cherry-pick --continue` "
            "there (or `git cherry-pick --skip` to drop the patch), then run the "
            "rebase again."
        )
    if stopped:
        subject = git.out(tree, "log", "-1", "--format=%s", stopped.commit)
        if git.out(tree, "log", "-1", "--format=%s", "HEAD") == subject:
            stopped.outcome = "resolved"
        else:
            stopped.outcome = "skipped"
    return results


# --- replay ----------------------------------------------------------------


def _replay(
    source: Base, target: Base, tree: Path, results: list[Result], probe: Probe | None
) -> Path:
    for result in results:
        if result.outcome != "pending":
            continue
        _replay_one(source, target, tree, result, probe)
        _write_state(tree, source, results)
        if result.outcome == "conflict":
            return _write_report(source, target, results, complete=False)
    _finish(source, target, tree, results)
    _write_state(tree, source, results)
    return _write_report(source, target, results, complete=True)


def _replay_one(
    source: Base, target: Base, tree: Path, result: Result, probe: Probe | None
) -> None:
    print(f"rebase: {result.patch}", file=sys.stderr, flush=True)
    patch = source.patch_dir / result.patch
    if git.apply_check(tree, "base", patch, reverse=True).returncode == 0:
        result.outcome = "upstream"
        result.evidence = [
            f"the patch reverse-applies on pristine {target.version}: the release "
            "already holds every hunk"
        ]
        return
    if probe and _is_fix(source, tree, result):
        probe(target, tree, result)
        if result.outcome == "upstream":
            return
    probed, result.evidence = result.evidence, []
    _pick(target, tree, result)
    result.evidence += probed


def _pick(target: Base, tree: Path, result: Result) -> None:
    picked = git.run(
        tree, "cherry-pick", "--keep-redundant-commits", result.commit, check=False
    )
    if picked.returncode == 0:
        _classify_pick(tree, target, result)
        return
    unmerged = git.out(tree, "diff", "--name-only", "--diff-filter=U").split()
    if not unmerged:
        git.run(tree, "cherry-pick", "--abort", check=False)
        raise ForkError(
            f"replaying {result.patch} failed in {tree} (the tree is back where "
            f"it was):\n{picked.stderr.strip()}"
        )
    result.outcome = "conflict"
    result.evidence = [c for path in unmerged for c in conflicts(tree, path)]


def _is_fix(source: Base, tree: Path, result: Result) -> bool:
    """Whether the patch changes sources, not only tests (which a probe needs)."""
    test_only = commits.without_fix_diff(source, result.patch).exists()
    return bool(commits.changed_sources(tree, result.commit)) and not test_only


def _classify_pick(tree: Path, target: Base, result: Result) -> None:
    before = hunks(git.out(tree, "show", "--format=", result.commit))
    after = hunks(git.out(tree, "show", "--format=", "HEAD"))
    emptied = sorted(path for path in before if path not in after)
    source_files = [path for path in before if not path.startswith("tests/")]
    if not after or (source_files and set(source_files) <= set(emptied)):
        git.run(tree, "reset", "--hard", "--quiet", "HEAD^")
        result.outcome = "upstream"
        result.evidence = _emptied_evidence(target, before, emptied, after)
        return
    moved = [note for path in after for note in _refresh_notes(path, before, after)]
    already = [f"{path}: already upstream, hunks dropped" for path in emptied]
    result.outcome = "refreshed" if moved or already else "applied"
    result.evidence = already + moved or ["every hunk applies unchanged, same lines"]


def _emptied_evidence(target, before, emptied, after) -> list[str]:
    if not after:
        return [
            f"the three-way merge onto {target.version} leaves nothing: every hunk "
            f"is already upstream ({', '.join(sorted(before))})"
        ]
    sources = [path for path in emptied if not path.startswith("tests/")]
    tests = sorted(after)
    return [
        f"its source hunks empty out in the merge onto {target.version}: upstream "
        f"made the same change to {', '.join(sources)}",
        f"its tests are not upstream ({', '.join(tests)}): to keep them, carry "
        "them as a Test-only patch with a verify/*.without-fix.diff",
    ]


def hunks(diff: str) -> dict[str, list[tuple[int, list[str]]]]:
    """Per file, each hunk's new start line and body, from a ``git diff``."""
    files: dict[str, list[tuple[int, list[str]]]] = {}
    current = None
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            current = files.setdefault(line.split(" b/", 1)[1], [])
        elif (match := _HUNK.match(line)) and current is not None:
            current.append((int(match[2]), []))
        elif current and line[:1] in (" ", "+", "-", "\\"):
            current[-1][1].append(line)
    return files


def _refresh_notes(path: str, before: dict, after: dict) -> list[str]:
    old, new = before.get(path, []), after[path]
    if len(old) != len(new):
        return [f"{path}: {len(old)} hunks became {len(new)} in the merge"]
    notes = []
    for number, ((old_start, old_body), (new_start, new_body)) in enumerate(
        zip(old, new, strict=True), 1
    ):
        if _changes(old_body) != _changes(new_body):
            notes.append(f"{path}: hunk {number} changed in the merge")
        elif old_body != new_body:
            notes.append(f"{path}: hunk {number} context changed")
        elif old_start != new_start:
            notes.append(
                f"{path}: hunk {number} moved {new_start - old_start:+d} lines"
            )
    return notes


def _changes(body: list[str]) -> list[str]:
    return [line for line in body if line[:1] in ("+", "-")]


def conflicts(tree: Path, path: str) -> list[str]:
    """Each conflict region of ``path``: its lines and the def/class it is in."""
    lines = (tree / path).read_text(errors="replace").splitlines()
    found, start = [], None
    for number, line in enumerate(lines, 1):
        if line.startswith("<<<<<<< "):
            start = number
        elif line.startswith(">>>>>>> ") and start:
            found.append(
                f"{path}: conflict at lines {start}-{number} ({_scope(lines, start)})"
            )
            start = None
    return found or [f"{path}: conflict (no text markers: a deleted or binary file)"]


def _scope(lines: list[str], line: int) -> str:
    for text in reversed(lines[: line - 1]):
        if match := _SCOPE.match(text):
            kind = "class" if text.lstrip().startswith("class") else "def"
            return f"in {kind} {match[1]}"
    return "at module level"


# --- the new queue and the report -------------------------------------------


def _finish(source: Base, target: Base, tree: Path, results: list[Result]) -> None:
    names = series.write(target, tree, "base")
    kept = [r for r in results if r.outcome in KEPT]
    if len(kept) == len(names):
        for result, name in zip(kept, names, strict=True):
            result.new_patch = name
            _carry_verify_diff(source, target, tree, result)
    materialize.record(tree, target)


def _carry_verify_diff(source: Base, target: Base, tree: Path, result: Result) -> None:
    """Bring a test-only patch's without-fix diff along, and check it applies."""
    old = commits.without_fix_diff(source, result.patch)
    if not old.exists():
        return
    new = commits.without_fix_diff(target, result.new_patch)
    new.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(old, new)
    if git.apply_check(tree, "HEAD", new).returncode == 0:
        result.evidence.append(f"verify/{new.name} carried over; it applies")
    else:
        result.evidence.append(
            f"verify/{new.name} carried over but no longer applies on "
            f"{target.version}: refresh it before `make verify`"
        )


def _write_report(
    source: Base, target: Base, results: list[Result], complete: bool
) -> Path:
    target.patch_dir.mkdir(parents=True, exist_ok=True)
    data = {
        "from": queue_state(source),
        "to": {"base": target.name, "sdist": target.sdist.file},
        "complete": complete,
        "patches": [
            {key: value for key, value in asdict(r).items() if key != "commit"}
            for r in results
        ],
    }
    (target.patch_dir / REPORT_JSON).write_text(json.dumps(data, indent=2) + "\n")
    report = target.patch_dir / REPORT_MD
    report.write_text(markdown(source, target, results, complete))
    return report


def markdown(source: Base, target: Base, results: list[Result], complete: bool) -> str:
    lines = [
        f"# Rebase of the {source.name} queue onto vLLM {target.version}",
        "",
        f"`make rebase TO={target.version}` replayed `patches/{source.name}` "
        f"(queue {series.patches_id(source)}) on the pristine `{target.sdist.file}`, "
        f"each patch a three-way merge whose base is the {source.name} source it "
        "was written on. `rebase.json` holds the same in JSON.",
        "",
        f"| # | patch in {source.name} | outcome | patch in {target.name} |",
        "|---|---|---|---|",
    ]
    for number, r in enumerate(results, 1):
        now = f"`{r.new_patch}`" if r.new_patch else "-"
        lines.append(f"| {number} | `{r.patch}` | {OUTCOMES[r.outcome]} | {now} |")
    lines += ["", "## Evidence", ""]
    for r in results:
        lines.append(f"- `{r.patch}`: {OUTCOMES[r.outcome]}")
        lines += [f"  - {note}" for note in r.evidence]
    lines += ["", "## Next", "", *_next_steps(source, target, results, complete)]
    return "\n".join(lines) + "\n"


def _next_steps(source, target, results, complete) -> list[str]:
    tree = materialize.tree_dir(target).relative_to(pins.ROOT)
    if not complete:
        stopped = next(r for r in results if r.outcome == "conflict")
        return [
            f"Stopped at a conflict: `{tree}` is in the middle of `git cherry-pick`"
            f" of `{stopped.patch}`. Resolve the conflicts named above there, "
            "`git add` the files and `git cherry-pick --continue` (or `git "
            "cherry-pick --skip` to drop the patch), then run `make rebase "
            f"TO={target.version}` again: it replays the remaining patches and "
            f"writes the queue. Nothing is lost: `patches/{source.name}` is "
            "untouched and the tree's branch `previous` holds its commits.",
        ]
    dropped = [r for r in results if r.outcome in ("upstream", "skipped")]
    return [
        f"The queue `patches/{target.name}` holds "
        f"{len(results) - len(dropped)} patch(es); {len(dropped)} dropped. "
        f"Check each Upstream-Status trailer, then `make verify lint check "
        f"BASE={target.name}`; make it the default in `upstream.toml` once "
        "verify holds.",
    ]
