"""``make releases``: every vLLM release from the oldest pinned base to the
newest, against every fix, as ``make apply`` would take it: written to
``docs/releases.md``.

The releases are the latest patch release of each minor that the package
index offers between the oldest and the newest pin. Each one's sdist (its
published sha256 checked) becomes a git checkout in the cache, one commit,
and each fix of the oldest base's queue (the one that carries them all) is
tried alone on it (``apply.try_alone``): in the version of the nearest base
at or below the release where that queue carries it, else the oldest's, then
any other queue's. A cell says "has it" (with the upstream release that
fixed it, or "code" where its source changes reverse-apply), "applies",
"applies as <base>'s", "no code" (none of the files it fixes is there) or
"port needed" (the release has the bug and no queue's version applies).
"""

from __future__ import annotations

import shutil
import sys
import tarfile
from pathlib import Path

from forktools.queue import download, file_locks, git, pins, series
from forktools.queue.pins import Base
from forktools.shipping import apply

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


def checkout_of(version: str) -> Path:
    """A git checkout of the release's sdist, one commit, in the cache;
    unpacked once, one run at a time."""
    path = download.cache_dir() / "releases" / f"vllm-{version}"
    with file_locks.held(
        download.lock_file(f"release-{version}"), f"to unpack {version}"
    ):
        if not (path / ".git").exists():
            _unpack(version, path)
    return path


def _unpack(version: str, path: Path) -> None:
    [sdist] = [
        o for o in download.offers("vllm", version) if o.file.endswith(".tar.gz")
    ]
    archive = download.fetch_offer(sdist)
    extract = path.with_name(f"{path.name}.extract")
    for leftover in (extract, path):
        shutil.rmtree(leftover, ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(extract, filter="data")
    unpacked = extract / f"vllm-{version}"
    git.run(unpacked, "init", "--quiet")
    git.run(unpacked, "add", "--all")
    git.run(unpacked, "commit", "--quiet", "-m", f"vLLM {version} (sdist)")
    unpacked.rename(path)
    shutil.rmtree(extract)


def row(
    version: str, fixes: list[series.Entry], oldest: Base, pinned: pins.Pins
) -> list[str]:
    """Each fix on the release, alone."""
    checkout = checkout_of(version)
    nearest = apply.base_for(version, pinned)
    cells = []
    for entry in fixes:
        base, own = oldest, entry
        for candidate in series.fixes(nearest):
            if apply.same_fix(oldest, entry, nearest, candidate):
                base, own = nearest, candidate
        cells.append(apply.try_alone(checkout, base, own, version, pinned))
    return cells


def main() -> int:
    pinned = pins.load()
    oldest = pinned.newest_first()[-1]
    fixes = series.fixes(oldest)
    lines = [("release", *(entry.name[:4] for entry in fixes))]
    for version in releases(pinned):
        print(f"releases: {version}", file=sys.stderr, flush=True)
        lines.append((version, *row(version, fixes, oldest, pinned)))
    legend = [f"- {entry.name[:4]}: {entry.subject(oldest)}" for entry in fixes]
    page = pins.ROOT / PAGE
    page.write_text(
        "# The fixes on every release\n\n"
        "Written by `make releases` from the package index's sdists (do not "
        "edit): each fix of the "
        f"{oldest.name} queue, alone, on the latest patch release of each "
        "minor from the oldest pin to the newest, as `make apply` takes it "
        "(see `forktools/shipping/releases.py` for what a cell means).\n\n"
        + _markdown(lines)
        + "\n\n"
        + "\n".join(legend)
        + "\n"
    )
    print(f"releases: {page}")
    return 0


def _markdown(rows: list[tuple[str, ...]]) -> str:
    header, *body = rows
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])
