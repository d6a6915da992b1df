"""``make wheel``: the fork as one wheel that every node of a fleet installs.

The fork wheel is the pinned upstream wheel (kernels, tags, requirements,
entry points) with the queue's files under ``vllm/`` in place of upstream's,
the fork's ``vllm/_version.py``, and the fork version in its ``.dist-info``.
Upstream's entries are copied without recompressing them; ours are stored.
With a fixed date and order, the same upstream wheel and queue always give
the same bytes, whatever the machine or its zlib.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import platform
import re
import struct
import sys
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from forktools.environments import lockfiles
from forktools.queue import download, git, materialize, metadata, pins, series
from forktools.queue.pins import Artifact, Base, ForkError

PACKAGE = "vllm/"
MANIFEST_SUFFIX = ".json"
GIT_MODES = {"100644": 0o100644, "100755": 0o100755}


@dataclass(frozen=True)
class Change:
    """A file under ``vllm/`` that the queue changes, adds or removes."""

    path: str
    data: bytes | None  # None: the queue removes the file
    mode: int | None  # None: keep upstream's


@dataclass(frozen=True)
class Built:
    path: Path
    sha256: str
    manifest: dict


def default_out() -> Path:
    return pins.ROOT / "dist"


def fork_wheel_name(upstream_file: str, version: str) -> str:
    """``vllm-0.33.0-cp38-abi3-….whl`` as ``vllm-<version>-cp38-abi3-….whl``."""
    name, _, tags = upstream_file.split("-", 2)
    return f"{name}-{version}-{tags}"


def build(base: Base, artifact: Artifact, out: Path) -> Built:
    """Write the fork wheel of ``base`` made from the upstream ``artifact``
    into ``out``, atomically, replacing any earlier build."""
    upstream = fetch(base, artifact)
    version = materialize.version(base, artifact)
    changes = queue_changes(base)
    out.mkdir(parents=True, exist_ok=True)
    target = out / fork_wheel_name(artifact.file, version)
    partial = target.with_name(f".{target.name}.partial")
    try:
        with partial.open("wb") as sink:
            label = materialize._version_module(version, series.queue_id(base))
            _assemble(upstream, version, label, changes, _ZipWriter(sink))
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    sha256 = pins.sha256_of(target)
    return Built(target, sha256, _manifest(base, artifact, target, sha256, changes))


def fetch(base: Base, artifact: Artifact) -> Path:
    """The verified upstream wheel ``artifact``, for any pinned platform.

    ``download.fetch`` looks a file up among those pip would install here;
    another platform's wheel is looked up the way ``make rebase`` pins it.
    """
    cached = download.cache_dir() / "downloads" / artifact.file
    if cached.exists() and pins.sha256_of(cached) == artifact.sha256:
        return cached
    if artifact.file.endswith(f"_{platform.machine()}.whl"):
        return download.fetch(artifact)
    project = artifact.file.split("-", 1)[0]
    offer = next(
        (o for o in download.offers(project, base.version) if o.file == artifact.file),
        None,
    )
    if offer is None:
        raise ForkError(
            f"{artifact.file} is not offered by any configured package index or "
            "--find-links location; check your pip configuration (pip config list)"
        )
    path = download.fetch_offer(offer)
    actual = pins.sha256_of(path)
    if actual != artifact.sha256:
        path.unlink()
        raise ForkError(
            f"sha256 mismatch for {artifact.file}: pinned {artifact.sha256}, "
            f"downloaded {actual}. Nothing was built. Check your package index "
            "or wheelhouse."
        )
    return path


def write_locks(base: Base, built: Built, artifact: Artifact) -> tuple[Path, Path]:
    """Beside the wheel: the hashed set a GPU node installs with it (the
    upstream wheel's requirements as pip, run by this Python, resolves them
    here) and the same versions as a constraints file, for ``pip install
    -e .`` on a development node."""
    if not artifact.file.endswith(f"_{platform.machine()}.whl"):
        raise ForkError(
            f"no lock for {built.path.name}: pip resolves environment markers "
            "for the machine it runs on; run `make wheel` on an "
            f"{artifact.file.rsplit('_', 1)[-1].removesuffix('.whl')} machine"
        )
    required = metadata.read(fetch(base, artifact)).install_requires
    try:
        pinned = lockfiles.resolve(sys.executable, required)
    except ForkError as error:
        raise ForkError(f"no lock for {built.path.name}: {error}") from None
    python = lockfiles.minor(platform.python_version())
    stem = f"{built.path.name}.python{python}"
    hashed = built.path.with_name(f"{stem}.lock.txt")
    lock = lockfiles.Lock.made(hashed, python, pinned)
    what = f"GPU node set for {built.path.name}"
    hashed.write_text(lockfiles.render(lock, what, written_by="make wheel"))
    plain = built.path.with_name(f"{stem}.constraints.txt")
    plain.write_text(lockfiles.constraints(lock))
    return hashed, plain


def write_manifest(built: Built) -> Path:
    path = built.path.with_name(built.path.name + MANIFEST_SUFFIX)
    path.write_text(json.dumps(built.manifest, indent=2) + "\n")
    return path


def manifests(base: Base, out: Path | None = None) -> list[dict]:
    """The manifests of ``base``'s fork wheels found in ``out``."""
    found = []
    for path in sorted((out or default_out()).glob(f"*.whl{MANIFEST_SUFFIX}")):
        manifest = json.loads(path.read_text())
        wheel = path.with_name(manifest["wheel"])
        if manifest.get("base") == base.name and wheel.exists():
            found.append(manifest)
    return found


def queue_changes(base: Base) -> dict[str, Change]:
    """The queue's files under ``vllm/``, read from the commit of the fork tree
    that the exported queue produced (later, unexported edits stay out)."""
    tree = materialize.ensure(base)
    head = materialize.read_state(tree)["head"]
    if materialize.unexported(tree):
        print(
            f"vllm-fork: {tree} has edits that are not exported; the wheel "
            f"holds patches/{base.name} only",
            file=sys.stderr,
        )
    raw = ("diff", "--raw", "-z", "--no-renames", "--no-abbrev")
    diff = git.run(tree, *raw, "base", head, "--", PACKAGE).stdout.split("\0")
    changes = {}
    for meta, path in zip(diff[0::2], diff[1::2], strict=False):  # a trailing ""
        old_mode, new_mode, _, blob, status = meta.lstrip(":").split()
        if status == "D":
            changes[path] = Change(path, None, None)
            continue
        if new_mode not in GIT_MODES:
            raise ForkError(
                f"{tree / path}: git mode {new_mode} (a link or submodule) cannot "
                "go into a wheel; make it a regular file in the tree and export"
            )
        mode = GIT_MODES[new_mode] if new_mode != old_mode else None
        changes[path] = Change(path, git.blob(tree, blob), mode)
    return changes


@dataclass(frozen=True)
class _Entry:
    name: str
    copied: zipfile.ZipInfo | None = None  # an upstream entry, copied as is
    data: bytes = b""  # else these bytes
    external_attr: int = 0o100644 << 16


def _assemble(
    upstream: Path,
    version: str,
    version_module: str,
    changes: dict[str, Change],
    sink: _ZipWriter,
) -> None:
    with zipfile.ZipFile(upstream) as source, upstream.open("rb") as raw:
        old = _dist_info(source, upstream)
        new = f"{old.rsplit('-', 1)[0]}-{version}"
        entries = _entries(
            source, upstream, (old, new), version, version_module, changes
        )
        record = f"{new}.dist-info/RECORD"
        hashes = _upstream_record(source, f"{old}.dist-info/RECORD")
        rows = []
        # The spec's order: the .dist-info directory last, RECORD at its end.
        last = f"{new}.dist-info/"
        for entry in sorted(entries, key=lambda e: (e.name.startswith(last), e.name)):
            if entry.copied:
                sink.copy(entry.name, raw, entry.copied)
                name = entry.copied.filename
                hashed = hashes.get(name) or _hash(source.read(name))
                rows.append([entry.name, *hashed])
            else:
                sink.add(entry.name, entry.data, entry.external_attr)
                rows.append([entry.name, *_hash(entry.data)])
        rows.append([record, "", ""])
        sink.add(record, _csv(rows), 0o100644 << 16)
        sink.close()


def _entries(
    source: zipfile.ZipFile,
    upstream: Path,
    names: tuple[str, str],
    version: str,
    version_module: str,
    changes: dict[str, Change],
) -> list[_Entry]:
    """Every entry of the fork wheel but its RECORD; ``names`` are the
    upstream and fork ``<name>-<version>`` of the .dist-info."""
    old, new = names
    pending, entries = dict(changes), []
    for info in source.infolist():
        name = info.filename
        if info.is_dir() or name == f"{old}.dist-info/RECORD":
            continue
        if name == f"{old}.dist-info/METADATA":
            text = _metadata(source.read(name).decode(), version, upstream, name)
            entries.append(_Entry(f"{new}{name[len(old) :]}", data=text.encode()))
        elif name.startswith((f"{old}.dist-info/", f"{old}.data/")):
            entries.append(_Entry(f"{new}{name[len(old) :]}", copied=info))
        elif name == materialize.VERSION_FILE:
            entries.append(_Entry(name, data=version_module.encode()))
        elif name in pending:
            change = pending.pop(name)
            if change.data is not None:
                attr = change.mode << 16 if change.mode else info.external_attr
                entries.append(_Entry(name, data=change.data, external_attr=attr))
        else:
            entries.append(_Entry(name, copied=info))
    for change in pending.values():
        if change.data is not None:
            attr = (change.mode or 0o100644) << 16
            entries.append(_Entry(change.path, data=change.data, external_attr=attr))
    return entries


def _dist_info(source: zipfile.ZipFile, upstream: Path) -> str:
    """``vllm-0.33.0`` of the wheel's ``vllm-0.33.0.dist-info/``."""
    found = {
        name.split("/", 1)[0].removesuffix(".dist-info")
        for name in source.namelist()
        if name.split("/", 1)[0].endswith(".dist-info")
    }
    if len(found) != 1:
        raise ForkError(
            f"{upstream}: expected one .dist-info directory, found {sorted(found)}; "
            "is the pinned file really a wheel?"
        )
    return found.pop()


def _metadata(text: str, version: str, upstream: Path, name: str) -> str:
    headers, blank, body = text.partition("\n\n")
    headers, count = re.subn(
        r"^Version: .*$", f"Version: {version}", headers, count=1, flags=re.M
    )
    if count != 1:
        raise ForkError(f"{upstream}: {name} has no Version: header")
    return headers + blank + body


def _upstream_record(source: zipfile.ZipFile, name: str) -> dict[str, list[str]]:
    """Upstream's sha256 and size of each file (the wheel itself is pinned)."""
    if name not in source.namelist():
        return {}
    rows = csv.reader(io.StringIO(source.read(name).decode()))
    return {
        row[0]: row[1:3]
        for row in rows
        if len(row) >= 3 and row[1].startswith("sha256=")
    }


def _hash(data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return [f"sha256={digest.decode()}", str(len(data))]


def _csv(rows: list[list[str]]) -> bytes:
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(rows)
    return text.getvalue().encode()


def _manifest(
    base: Base, artifact: Artifact, wheel: Path, sha256: str, changes: dict
) -> dict:
    def paths(kind):
        return sorted(path for path, change in changes.items() if kind(change))

    return {
        "wheel": wheel.name,
        "sha256": sha256,
        "version": materialize.version(base, artifact),
        "base": base.name,
        "upstream_wheel": {"file": artifact.file, "sha256": artifact.sha256},
        "queue": {
            "id": series.queue_id(base),
            "patches": [entry.name for entry in series.entries(base)],
        },
        "changed": paths(lambda change: change.data is not None),
        "removed": paths(lambda change: change.data is None),
    }


_LIMIT = 0xFFFFFFFF  # beyond this ZIP needs its ZIP64 records, which we do not write
_DOS_DATE = (1 << 5) | 1  # 1980-01-01, the earliest date a ZIP entry can hold
_VERSION = 20  # ZIP 2.0: deflate


class _ZipWriter:
    """A ZIP archive written entry by entry, with one fixed date and no extra
    fields; deflated data of another archive is copied without inflating it."""

    def __init__(self, sink: BinaryIO):
        self.sink = sink
        self.central: list[bytes] = []

    def copy(self, name: str, source: BinaryIO, info: zipfile.ZipInfo) -> None:
        if info.flag_bits & 1 or info.compress_type not in (
            zipfile.ZIP_STORED,
            zipfile.ZIP_DEFLATED,
        ):
            raise ForkError(
                f"{source.name}: {info.filename} is encrypted or compressed with "
                f"method {info.compress_type}; a wheel holds stored or deflated "
                "files only"
            )
        source.seek(info.header_offset)
        header = source.read(30)
        if header[:4] != b"PK\x03\x04":
            raise ForkError(f"{source.name}: no ZIP header for {info.filename}")
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        source.seek(name_length + extra_length, io.SEEK_CUR)
        self._header(
            name,
            info.compress_type,
            info.CRC,
            info.compress_size,
            info.file_size,
            info.external_attr,
        )
        left = info.compress_size
        while left:
            chunk = source.read(min(left, 1 << 20))
            if not chunk:
                raise ForkError(f"{source.name}: ends inside {info.filename}")
            self.sink.write(chunk)
            left -= len(chunk)

    def add(self, name: str, data: bytes, external_attr: int) -> None:
        crc = zlib.crc32(data)
        self._header(name, zipfile.ZIP_STORED, crc, len(data), len(data), external_attr)
        self.sink.write(data)

    def _header(self, name, method, crc, compressed, size, external_attr) -> None:
        offset = self.sink.tell()
        if max(offset, compressed, size) >= _LIMIT:
            raise ForkError(f"{name}: the wheel passes 4 GiB, which needs ZIP64")
        encoded = name.encode()
        flags = 0 if name.isascii() else 0x800  # UTF-8 name
        fields = struct.pack("<5H", _VERSION, flags, method, 0, _DOS_DATE)
        fields += struct.pack("<3LH", crc, compressed, size, len(encoded))
        self.sink.write(b"PK\x03\x04" + fields + b"\0\0" + encoded)
        made_by = struct.pack("<H", 3 << 8 | _VERSION)  # Unix: modes hold
        rest = struct.pack("<4H2L", 0, 0, 0, 0, external_attr, offset)
        self.central.append(b"PK\x01\x02" + made_by + fields + rest + encoded)

    def close(self) -> None:
        start = self.sink.tell()
        for entry in self.central:
            self.sink.write(entry)
        count, size = len(self.central), self.sink.tell() - start
        if count >= 0xFFFF or start >= _LIMIT:
            raise ForkError("the wheel holds too much for a ZIP without ZIP64")
        end = struct.pack("<4H2LH", 0, 0, count, count, size, start, 0)
        self.sink.write(b"PK\x05\x06" + end)


def status_lines(bases: list[Base], wide: bool = True) -> list[str]:
    """One line per fork wheel in dist/ (``wide``: its sha256 and the
    upstream wheel's)."""
    lines = []
    for base in bases:
        for built in manifests(base):
            upstream_wheel = built["upstream_wheel"]
            stale = built["queue"]["id"] != series.queue_id(base)
            line = f"wheel: dist/{built['wheel']}"
            if wide:
                line += (
                    f" sha256 {built['sha256']}, from {upstream_wheel['file']} "
                    f"sha256 {upstream_wheel['sha256']}"
                )
            lines.append(
                line + (" (stale: the queue changed; run make wheel)" if stale else "")
            )
    return lines
