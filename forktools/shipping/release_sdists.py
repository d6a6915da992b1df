"""A vLLM release's sdist as a git checkout of one commit, in the cache:
what ``make releases`` tries each fix on, and the blobs a port of a fix was
written against."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

from forktools.queue import download, file_locks, git


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
