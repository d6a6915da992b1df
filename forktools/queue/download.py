"""Fetch pinned artifacts through the user's installer, cache and verify them.

pip's index and link handling is used (rather than a plain HTTP client) so
that a user's index URL, extra indexes, ``--find-links`` wheelhouses,
certificates and proxies from their pip configuration apply unchanged.
``pip download`` itself cannot be used for the sdist: it would try to build
vLLM's metadata, which needs a full build toolchain.

Under uv (``uv pip install -e .``) the file is looked up by uv instead, with
the index settings the user gave uv: see ``uv_index``.
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from forktools.queue import file_locks, uv_index
from forktools.queue.pins import Artifact, ForkError, sha256_of


def cache_dir() -> Path:
    if root := os.environ.get("VLLM_FORK_CACHE"):
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "vllm-fork"


def lock_file(name: str) -> Path:
    """The lock file of the cache entry ``name``, shared by all runs."""
    return cache_dir() / "locks" / f"{name}.lock"


def fetch(artifact: Artifact) -> Path:
    """Return the verified cached file of ``artifact``, downloading it if needed."""
    with _download_lock(artifact.file):
        return _fetch(artifact)


def _download_lock(file: str):
    return file_locks.held(lock_file(f"download-{file}"), f"to download {file}")


def _fetch(artifact: Artifact) -> Path:
    target = cache_dir() / "downloads" / artifact.file
    if target.exists():
        actual = sha256_of(target)
        if actual == artifact.sha256:
            return target
        print(
            f"vllm-fork: cached {target} has sha256 {actual}, pinned "
            f"{artifact.sha256}; downloading it again",
            file=sys.stderr,
        )
        target.unlink()
    actual = _download_checked(find_url(artifact.file), target, artifact.sha256)
    if actual:
        raise ForkError(
            f"sha256 mismatch for {artifact.file}: pinned {artifact.sha256}, "
            f"downloaded {actual}. Nothing was installed. Check your package "
            "index or wheelhouse; if upstream really re-published the file, "
            "update upstream.toml after verifying the new file."
        )
    return target


def _download_checked(url: str, target: Path, expected: str | None) -> str | None:
    """Download ``url`` to ``target`` through a temporary file of this run's
    own. None once ``target`` holds it; if its sha256 is not ``expected`` (when
    one is given), that sha256, and nothing is kept. Call with the file's lock
    held."""
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(target)
    handle, name = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".part", dir=target.parent
    )
    os.close(handle)
    partial = Path(name)
    try:
        _download(url, partial, target.name)
        actual = sha256_of(partial)
        if expected not in (None, actual):
            return actual
        partial.chmod(0o644)
        partial.replace(target)
        return None
    finally:
        partial.unlink(missing_ok=True)


def _remove_leftovers(target: Path) -> None:
    """Temporary files of downloads that crashed (the lock says none runs)."""
    pattern = f".{glob.escape(target.name)}.*.part"
    for leftover in [
        target.with_name(target.name + ".part"),
        *target.parent.glob(pattern),
    ]:
        leftover.unlink(missing_ok=True)


def find_url(filename: str) -> str:
    """The URL under which the user's configured indexes offer ``filename``.

    uv's settings when uv runs this (its build backend or ``uv run``), else
    pip's.
    """
    project = filename.split("-", 1)[0]
    if uv := uv_index.running_uv():
        url = uv_index.find_url(uv, project, filename)
        if url is None:
            raise ForkError(
                f"{filename} is not offered by any package index or --find-links "
                "location that uv is configured with (command line, UV_* "
                "variables, uv.toml)"
            )
        return url
    return _find_url_with_pip(project, filename)


def _pip_candidates(project: str, target_python=None) -> list:
    """Every file of ``project`` that pip's configured indexes offer."""
    from pip._internal.commands import create_command

    command = create_command("download")
    options, _ = command.parse_args(["--no-deps", project])
    with command.main_context():
        session = command.get_default_session(options)
        finder = command._build_package_finder(
            options=options,
            session=session,
            target_python=target_python,
            ignore_requires_python=True,
        )
        return finder.find_all_candidates(project)


def _find_url_with_pip(project: str, filename: str) -> str:
    for candidate in _pip_candidates(project):
        if candidate.link.filename == filename:
            return candidate.link.url
    raise ForkError(
        f"{filename} is not offered by any configured package index or "
        "--find-links location; check your pip configuration (pip config list). "
        "Index options on pip's command line (-i, --find-links) do not reach "
        "setup.py: set PIP_INDEX_URL, PIP_FIND_LINKS or pip.conf instead."
    )


ARCHES = ("x86_64", "aarch64")
_MANYLINUX = range(17, 41)  # glibc 2.17 (manylinux2014) .. 2.40


@dataclass(frozen=True)
class Offer:
    """A file an index offers, with the sha256 it publishes (None if it does not)."""

    file: str
    url: str
    published_sha256: str | None


def offers(project: str, version: str) -> list[Offer]:
    """The sdist and Linux x86_64/aarch64 wheels of ``project`` ``version``.

    Wheels are looked up for every manylinux platform of both architectures,
    not only for this machine, so that all pins come from one query.
    """
    from pip._internal.models.target_python import TargetPython

    platforms = [
        f"manylinux_2_{minor}_{arch}" for arch in ARCHES for minor in _MANYLINUX
    ]
    found = {
        c.link.filename: Offer(
            c.link.filename,
            c.link.url,
            c.link.hash if c.link.hash_name == "sha256" else None,
        )
        for c in _pip_candidates(project, TargetPython(platforms=platforms))
        if str(c.version) == version
    }
    return sorted(found.values(), key=lambda offer: offer.file)


def fetch_offer(offer: Offer) -> Path:
    """Download ``offer`` into the cache, checked against the published sha256.

    Used to pin a new release: the pinned sha256 is then computed from the
    returned file. A mismatch with what the index publishes keeps nothing.
    """
    target = cache_dir() / "downloads" / offer.file
    with _download_lock(offer.file):
        if target.exists() and offer.published_sha256 in (None, sha256_of(target)):
            return target
        actual = _download_checked(offer.url, target, offer.published_sha256)
    if actual:
        raise ForkError(
            f"sha256 mismatch for {offer.file}: the index publishes "
            f"{offer.published_sha256}, the downloaded file has {actual}. "
            "Nothing was pinned. Check your package index or wheelhouse."
        )
    return target


def _download(url: str, dest: Path, name: str) -> None:
    from pip._internal.commands import create_command
    from pip._vendor.requests import RequestException

    command = create_command("download")
    options, _ = command.parse_args([])
    with command.main_context():
        session = command.get_default_session(options)
        try:
            _stream(session, url, dest, name)
        except RequestException as e:
            raise ForkError(
                f"downloading {name} failed: {e}. Check that your package index "
                "or wheelhouse serves it (pip: PIP_INDEX_URL, PIP_FIND_LINKS, "
                "pip.conf; uv: UV_INDEX_URL, UV_FIND_LINKS, uv.toml), and your "
                "network, proxy and certificate settings; then run again."
            ) from e


def _stream(session, url: str, dest: Path, name: str) -> None:
    response = session.get(url, stream=True, headers={"Accept-Encoding": "identity"})
    response.raise_for_status()
    total = int(response.headers.get("content-length") or 0)
    progress = _Progress(name, total)
    with dest.open("wb") as f:
        for chunk in response.iter_content(chunk_size=1 << 20):
            f.write(chunk)
            progress.advance(len(chunk))
    progress.done()


class _Progress:
    """Download progress on stderr, a line at most every few seconds."""

    def __init__(self, name: str, total: int):
        self.name, self.total, self.seen = name, total, 0
        self.started = self.shown = time.monotonic()
        size = f" ({total / 1e6:.1f} MB)" if total else ""
        print(f"vllm-fork: downloading {name}{size}", file=sys.stderr, flush=True)

    def advance(self, n: int) -> None:
        self.seen += n
        now = time.monotonic()
        if now - self.shown >= 2:
            self.shown = now
            share = f"{100 * self.seen / self.total:.0f}% " if self.total else ""
            print(
                f"vllm-fork:   {self.name}: {share}{self.seen / 1e6:.1f} MB",
                file=sys.stderr,
                flush=True,
            )

    def done(self) -> None:
        seconds = time.monotonic() - self.started
        print(
            f"vllm-fork:   {self.name}: {self.seen / 1e6:.1f} MB in {seconds:.1f} s",
            file=sys.stderr,
            flush=True,
        )
