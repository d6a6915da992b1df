"""The one scheduler of the proof's test runs: ``make verify``'s halves,
``HUNKS=1``'s reverted hunks and ``make read-only``'s runs, each a job, one
per CPU at a time (a pytest session keeps about one core busy), the longest
expected first so that the last to end is a short one."""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Job:
    estimate: float  # expected seconds
    run: Callable[[], None]


def default_jobs() -> int:
    """One test run per CPU."""
    return os.cpu_count() or 1


def ordered(jobs: list[Job]) -> list[Job]:
    return sorted(jobs, key=lambda job: -job.estimate)


def execute(jobs: list[Job], workers: int | None = None) -> None:
    """Run ``jobs``, ``workers`` at a time, longest expected first; the first
    exception a job raised is raised once every job has ended."""
    with concurrent.futures.ThreadPoolExecutor(workers or default_jobs()) as pool:
        for future in [pool.submit(job.run) for job in ordered(jobs)]:
            future.result()
