"""The g++ output cache the proof's sessions share (``VLLM_FORK_CXX_CACHE``,
served by ``harness/vllm_cxx_cache.py``), kept under a size.

Outside every ledger key: a file removed here is compiled again by the next
session that needs it, with the same bytes.
"""

from __future__ import annotations

import stat
import sys
import time
from pathlib import Path

from forktools.proof import runner
from forktools.queue import download

LIMIT_BYTES = 4 * 2**30
# A file named with a leading dot is a store or a dependency list still being
# written; one this old was left by a compile that was killed.
LEFT_BEHIND_SECONDS = 3600


def folder() -> Path:
    return download.cache_dir() / runner.COMPILER_CACHE


def trim(root: Path | None = None, limit: int = LIMIT_BYTES) -> int:
    """Removes what killed compiles left behind, then the least recently used
    files until the cache holds at most ``limit`` bytes; the bytes removed."""
    root = folder() if root is None else root
    now = time.time()
    files = []
    for path in root.rglob("*") if root.is_dir() else []:
        try:
            found = path.stat()
        except OSError:
            continue
        if stat.S_ISREG(found.st_mode):
            files.append((found.st_mtime, found.st_size, path))
    left_behind = [
        f
        for f in files
        if f[2].name.startswith(".") and now - f[0] > LEFT_BEHIND_SECONDS
    ]
    kept = sorted(set(files) - set(left_behind))
    total = sum(size for _, size, _ in kept)
    doomed = list(left_behind)
    for entry in kept:
        if total <= limit:
            break
        doomed.append(entry)
        total -= entry[1]
    removed = 0
    for _, size, path in doomed:
        try:
            path.unlink()
            removed += size
        except OSError:
            continue
    if removed:
        print(
            f"vllm-fork: compiler cache {root}: removed {removed / 2**20:.0f} MB "
            f"(least recently used first), {total / 2**20:.0f} MB kept",
            file=sys.stderr,
            flush=True,
        )
    return removed
