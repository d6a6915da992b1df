"""Locks that make concurrent runs wait for each other instead of racing.

Runs that share the download cache (``~/.cache/vllm-fork``: downloads,
pristine trees, test environments) or one clone's fork trees take a
``flock`` on a lock file beside them. The kernel drops a lock when its
holder exits, however it exits: a crashed run leaves none behind.
"""

from __future__ import annotations

import fcntl
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Lock:
    """One open lock file; ``waiting_for`` completes "waiting for another run …"."""

    def __init__(self, path: Path, waiting_for: str):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.waiting_for = path, waiting_for
        self.file = path.open("a")

    def exclusive(self) -> None:
        self._take(fcntl.LOCK_EX)

    def shared(self) -> None:
        self._take(fcntl.LOCK_SH)

    def exclusive_if_free(self) -> bool:
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def unlock(self) -> None:
        fcntl.flock(self.file, fcntl.LOCK_UN)

    def close(self) -> None:
        self.file.close()

    def _take(self, mode: int) -> None:
        try:
            fcntl.flock(self.file, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"vllm-fork: waiting for another run {self.waiting_for} "
                f"(lock: {self.path})",
                file=sys.stderr,
                flush=True,
            )
            fcntl.flock(self.file, mode)


@contextmanager
def held(path: Path, waiting_for: str) -> Iterator[None]:
    """Hold the lock file ``path`` exclusively for the ``with`` block."""
    lock = Lock(path, waiting_for)
    try:
        lock.exclusive()
        yield
    finally:
        lock.close()
