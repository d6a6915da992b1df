"""Committed locks: the exact, hashed distribution set of each environment.

``locks/<base>/<role>.txt`` (role ``test`` or ``engine``) lists every
distribution of that environment's closure as ``name==version`` with the
sha256 of the one file that this Python and platform install, in pip's
requirements format: environments are built from it with ``pip install
--require-hashes --no-deps``, so a fresh machine gets the same bytes, and a
file whose hash differs is refused. The pinned vLLM wheel (and an engine's
CPU build) is not in the lock: ``upstream.toml`` pins it with its sha256.

The lock is also the environment input of every proof ledger key
(``forktools/proof/ledger.py``): the ``python X.Y.Z machine`` line of the
interpreter that makes the environment, then the lock's ``name==version``
lines and the pinned wheel's, sorted. So ``make check`` knows which rows a
lock change makes stale without building anything, and the package index
moving on changes nothing until ``make lock`` moves a lock.

``make lock`` is the one command that moves them. Its resolver is pip's own
(``pip install --dry-run --report``), run in a new environment of the Python
the environment is made by, under pip's own configuration (``pip config
list``: index, extra indexes, find-links, constraints), the same pip and
configuration that then installs the lock. pip rather than ``uv pip
compile``: uv reads neither pip's configuration nor its constraint files, so
it would lock a set that the installing pip might not serve.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from forktools.queue import pins
from forktools.queue.pins import Base, ForkError

_HEADER = re.compile(r"^# for Python (\d+\.\d+) on (\S+)$", re.MULTILINE)
_PINNED = re.compile(
    r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) +--hash=sha256:([0-9a-f]{64})"
)
_NOT_SERVED = re.compile(r"No matching distribution found for (\S+)")
_HASH_MISMATCH = re.compile(
    r"^\s+(\S+==\S+) from (\S+).*\n\s+Expected sha256 (\S+)\n\s+Got\s+(\S+)",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Pinned:
    name: str  # as the distribution's metadata spells it, lower case
    version: str
    sha256: str

    @property
    def line(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class Lock:
    path: Path
    python: str  # X.Y
    machine: str  # platform.machine()
    pinned: tuple[Pinned, ...]

    @classmethod
    def made(cls, path: Path, python_version: str, pinned: Iterable[Pinned]) -> Lock:
        """The lock of ``pinned`` for Python ``python_version`` on this machine."""
        return cls(path, minor(python_version), platform.machine(), tuple(pinned))

    @property
    def lines(self) -> list[str]:
        return [p.line for p in self.pinned]

    @property
    def shown(self) -> str:
        return str(self.path.relative_to(pins.ROOT))


def minor(python_version: str) -> str:
    """``X.Y`` of ``X.Y.Z``: the Python a lock is for."""
    return ".".join(python_version.split(".")[:2])


def path(base: Base, role: str) -> Path:
    return pins.ROOT / "locks" / base.name / f"{role}.txt"


def roles(base: Base) -> list[str]:
    """The environments the base builds on this machine."""
    return ["test", "engine"] if base.engine_wheel_for_this_machine() else ["test"]


def read(base: Base, role: str, python_version: str) -> Lock:
    """The base's lock of ``role``, which must be for ``python_version``."""
    file = path(base, role)
    if not file.exists():
        raise ForkError(
            f"{file.relative_to(pins.ROOT)}: no lock for {base.name}'s {role} "
            f"environment; `make lock BASE={base.name}` writes it from the "
            "package index"
        )
    return read_file(file, python_version, f"`make lock BASE={base.name}`")


def read_file(file: Path, python_version: str, run: str = "`make lock`") -> Lock:
    """The lock in ``file``, which must be for ``python_version`` (X.Y.Z or
    X.Y) on this machine; ``run`` is the command that writes it again."""
    text = file.read_text()
    header = _HEADER.search(text)
    if header is None:
        raise ForkError(
            f"{file.relative_to(pins.ROOT)}: not a lock `make lock` wrote (no "
            f"'# for Python X.Y on <machine>' line); restore it with git or run {run}"
        )
    lock = Lock(file, header[1], header[2], tuple(_pinned(file, text)))
    wanted = minor(python_version)
    if (lock.python, lock.machine) != (wanted, platform.machine()):
        raise ForkError(
            f"{lock.shown} is for Python {lock.python} on {lock.machine}; this "
            f"environment is made by Python {wanted} on {platform.machine()}. Run "
            f"with Python {lock.python}, or lock this one with {run}"
        )
    return lock


def _pinned(file: Path, text: str) -> list[Pinned]:
    """Each ``name==version --hash=sha256:<hex>`` requirement of ``text``."""
    found = []
    logical = re.sub(r"\s*\\\n\s*", " ", text)  # continuation lines joined
    for line in logical.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        pinned = _PINNED.fullmatch(line.strip())
        if pinned is None:
            raise ForkError(
                f"{file}: {line.strip()!r} is not `name==version "
                "--hash=sha256:<hex>`; restore the file with git or run `make lock`"
            )
        name, version, sha256 = pinned.groups()
        found.append(Pinned(name.lower(), version, sha256))
    return found


def render(lock: Lock, what: str, written_by: str = "make lock") -> str:
    lines = [
        f"# The {what}: every distribution, with the sha256 of its file.",
        f"# for Python {lock.python} on {lock.machine}",
        f"# Written by `{written_by}` (pip's resolver and configuration); review, "
        "do not edit.",
    ]
    for pinned in sorted(lock.pinned, key=_by_name):
        lines += [f"{pinned.line} \\", f"    --hash=sha256:{pinned.sha256}"]
    return "\n".join(lines) + "\n"


def constraints(lock: Lock) -> str:
    """The lock as a pip constraints file (``pip install -c``): versions
    only, since pip takes a hashed constraint as hash-checking mode for all."""
    return "".join(f"{line}\n" for line in sorted(lock.lines))


def wheel_line(file: str) -> str:
    """``name==version`` of a wheel file, as its metadata names it."""
    name, version = file.split("-")[:2]
    return f"{name.replace('_', '-').lower()}=={version}"


def environment(lines: list[str], python_version: str) -> list[str]:
    """The ledger's text of an environment of ``lines``, made by Python
    ``python_version``: the form ``installed_set`` measures."""
    return [f"python {python_version} {platform.machine()}", *sorted(set(lines))]


_INSTALLED_SET = (
    "import importlib.metadata as m, json, platform\n"
    "names = {f\"{d.metadata['Name'].lower()}=={d.version}\"\n"
    "         for d in m.distributions() if d.metadata['Name']}\n"
    "print(json.dumps([f'python {platform.python_version()} {platform.machine()}',"
    " *sorted(names)]))"
)


def installed_set(python: Path) -> list[str]:
    """What ``python`` has installed, in the form of ``environment``. Run
    isolated (``-I``): the working directory, which may hold the
    ``vllm.egg-info`` of a ``pip install -e .``, and ``PYTHONPATH`` are not
    the environment's."""
    result = subprocess.run(
        [str(python), "-I", "-c", _INSTALLED_SET], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise ForkError(
            f"could not list the distributions of {python}: {result.stderr.strip()}"
        )
    return json.loads(result.stdout)


def install_command(pip: list[str], lock: Lock) -> list[str]:
    return [*pip, "--require-hashes", "--no-deps", "-r", str(lock.path)]


def explain(pip_output: str, lock: Lock, base: Base) -> str | None:
    """One line for a failed install from ``lock`` where pip said why."""
    refused = _HASH_MISMATCH.search(pip_output)
    if refused:
        pinned, url, expected, got = refused.groups()
        return (
            f"{pinned}: the file the index serves ({url.split('#')[0]}) has sha256 "
            f"{got}, {lock.shown} pins {expected}: refused. A file that changed "
            "under a released version is suspect; if the lock is wrong, "
            f"`make lock BASE={base.name}` writes it again"
        )
    missing = _NOT_SERVED.search(pip_output)
    if missing:
        return (
            f"the package index no longer serves {missing[1]}, which {lock.shown} "
            f"pins; `make lock BASE={base.name}` moves the lock to what it serves "
            "(then review the moves and prove the ledger again)"
        )
    return None


def resolve(
    python: str,
    requirements: list[str],
    *,
    no_deps: bool = False,
    ignore_installed: bool = True,
) -> list[Pinned]:
    """What pip, run by ``python`` under its configuration, would install for
    ``requirements`` (into an empty environment, or with ``ignore_installed``
    false beside what ``python`` has), each with its file's sha256."""
    if not requirements:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        options = ["--no-deps"] if no_deps else []
        options += ["--ignore-installed"] if ignore_installed else []
        command = [
            python, "-m", "pip", "install", "--dry-run", "--quiet",
            "--report", str(report), *options,
        ]  # fmt: skip
        done = subprocess.run(
            [*command, *requirements], stderr=subprocess.PIPE, text=True
        )
        if done.returncode != 0:
            missing = _NOT_SERVED.search(done.stderr)
            if missing:
                raise ForkError(f"the package index serves no {missing[1]}")
            said = [line for line in done.stderr.splitlines() if "ERROR" in line]
            raise ForkError(
                f"pip ({python}) could not resolve the requirements: "
                f"{(said or ['no error line'])[-1]}"
            )
        installs = json.loads(report.read_text())["install"]
    return [
        Pinned(
            item["metadata"]["name"].lower(),
            item["metadata"]["version"],
            _sha256(python, item),
        )
        for item in installs
    ]


def _sha256(python: str, item: dict) -> str:
    """The file's sha256, as the index gave it, else of the file downloaded."""
    hashes = item["download_info"].get("archive_info", {}).get("hashes", {})
    if "sha256" in hashes:
        return hashes["sha256"]
    line = f"{item['metadata']['name']}=={item['metadata']['version']}"
    with tempfile.TemporaryDirectory() as tmp:
        fetch = [python, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, line]
        if subprocess.run(fetch).returncode != 0:
            raise ForkError(f"could not download {line} to hash it (pip output above)")
        [file] = Path(tmp).iterdir()
        return hashlib.sha256(file.read_bytes()).hexdigest()


def locked(
    python: str, requirements: list[str], *, no_deps: bool = False
) -> tuple[Pinned, ...]:
    """The set a new environment made by ``python`` gets for
    ``requirements``: what ``python -m venv`` seeds it with (pip, and
    setuptools before Python 3.12), less what pip then installs over them,
    and what pip installs, as resolved in such an environment."""
    with tempfile.TemporaryDirectory() as tmp:
        if subprocess.run([python, "-m", "venv", tmp]).returncode != 0:
            raise ForkError(f"`{python} -m venv` failed (output above)")
        fresh = str(Path(tmp) / "bin" / "python")
        seeds = installed_set(Path(fresh))[1:]
        installed = resolve(
            fresh, requirements, no_deps=no_deps, ignore_installed=False
        )
        names = {p.name for p in installed}
        kept = [seed for seed in seeds if seed.split("==")[0] not in names]
        installed += resolve(fresh, kept, no_deps=True)
    return tuple(sorted(installed, key=_by_name))


def moves(old: Lock | None, new: Lock) -> list[str]:
    """``name old -> new`` for each distribution that differs."""
    if old is None:
        return [f"(no lock before) -> {len(new.pinned)} distributions"]
    before = {p.name: p for p in old.pinned}
    after = {p.name: p for p in new.pinned}
    found = []
    for name in sorted(before.keys() | after.keys()):
        was, now = before.get(name), after.get(name)
        if was is None:
            found.append(f"{name} (none) -> {now.version}")
        elif now is None:
            found.append(f"{name} {was.version} -> (gone)")
        elif was.version != now.version:
            found.append(f"{name} {was.version} -> {now.version}")
        elif was.sha256 != now.sha256:
            found.append(
                f"{name} {was.version}: another file (sha256 {now.sha256[:12]})"
            )
    return found


def _by_name(pinned: Pinned) -> str:
    return pinned.name
