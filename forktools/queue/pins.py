"""The pinned upstream bases of ``upstream.toml``."""

from __future__ import annotations

import hashlib
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PIN_FILE = ROOT / "upstream.toml"
BASE_ENV = "VLLM_FORK_BASE"


class ForkError(Exception):
    """A failure the user can act on; the message says what to do."""


@dataclass(frozen=True)
class Artifact:
    file: str
    sha256: str


@dataclass(frozen=True)
class Exclusion:
    """A wheel requirement left out of the CPU test environment, and why."""

    requirement: str
    reason: str


@dataclass(frozen=True)
class Substitution:
    """A requirement of the engine wheel installed as another, and why."""

    requirement: str
    replacement: str
    reason: str


@dataclass(frozen=True)
class Engine:
    """A CPU build of vLLM whose compiled kernels run the fork tree's sources
    in a real engine (``LLM(...)``) on this machine. ``kernels_only``: a build
    of another release, whose requirements are not the base's, so only its
    wheel is installed, over the base's test environment."""

    wheels: tuple[Artifact, ...]
    python: str
    substitutions: tuple[Substitution, ...]
    test_requirements: tuple[str, ...]
    kernels_only: bool = False


@dataclass(frozen=True)
class Base:
    name: str
    version: str
    sdist: Artifact
    wheels: tuple[Artifact, ...]
    test_requirements: tuple[str, ...]
    cpu_test_exclude: tuple[Exclusion, ...] = ()
    engine: Engine | None = None

    def wheel_for_this_machine(self) -> Artifact:
        return for_this_machine(self.name, "wheel", self.wheels)

    def engine_wheel_for_this_machine(self) -> Artifact | None:
        """The engine's wheel; None when the base pins no engine."""
        if self.engine is None:
            return None
        return for_this_machine(self.name, "engine wheel", self.engine.wheels)

    @property
    def artifacts(self) -> tuple[Artifact, ...]:
        return (self.sdist, *self.wheels)

    @property
    def patch_dir(self) -> Path:
        return ROOT / "patches" / self.name


@dataclass(frozen=True)
class Pins:
    default: str
    bases: dict[str, Base]

    def get(self, name: str | None = None) -> Base:
        source = ""
        if not name:
            name = os.environ.get(BASE_ENV)
            source = f" (from {BASE_ENV})" if name else " (the default)"
        name = name or self.default
        if name not in self.bases and f"v{name}" in self.bases:
            name = f"v{name}"  # BASE=0.33.0 names v0.33.0
        if name not in self.bases:
            known = ", ".join(self.bases)
            raise ForkError(
                f"unknown base {name!r}{source}: {PIN_FILE.name} pins {known}"
            )
        return self.bases[name]

    def newest_first(self) -> list[Base]:
        return sorted(self.bases.values(), key=_version_key, reverse=True)


def for_this_machine(base: str, what: str, wheels: tuple[Artifact, ...]) -> Artifact:
    arch = platform.machine()
    for wheel in wheels:
        if wheel.file.endswith(f"_{arch}.whl"):
            return wheel
    names = ", ".join(w.file for w in wheels)
    raise ForkError(
        f"{base}: no pinned {what} for this machine ({arch}); "
        f"pinned: {names}. Add one to {PIN_FILE.name}."
    )


def _version_key(base: Base) -> tuple[int, ...]:
    return version_key(base.version)


_VERSION = re.compile(r"(?P<release>\d+(?:\.\d+)*)(?:(?P<pre>a|b|rc)(?P<n>\d+))?")
_PRE = {"a": 0, "b": 1, "rc": 2, None: 3}  # a final release sorts after its rcs


def is_release(version: str) -> bool:
    try:
        version_key(version)
    except ValueError:
        return False
    return True


def version_key(version: str) -> tuple[int, ...]:
    """Sortable form of a release version: ``0.34.0``, ``0.35.0rc1``."""
    found = _VERSION.fullmatch(version)
    if not found:
        raise ValueError(
            f"version {version!r} is not a release version (such as 0.34.0 or "
            "0.35.0rc1)"
        )
    release = [int(part) for part in found["release"].split(".")]
    release += [0] * (3 - len(release))
    return (*release, _PRE[found["pre"]], int(found["n"] or 0))


def _artifact(entry: dict) -> Artifact:
    return Artifact(file=entry["file"], sha256=entry["sha256"].lower())


def _exclusion(base: str, entry: dict) -> Exclusion:
    if not entry.get("requirement") or not entry.get("reason"):
        raise ForkError(
            f"{PIN_FILE.name}: [bases.{base!r}] cpu-test-exclude entry {entry} "
            "needs both a requirement and a reason"
        )
    return Exclusion(entry["requirement"], entry["reason"])


def _substitution(base: str, entry: dict) -> Substitution:
    if not all(entry.get(key) for key in ("requirement", "with", "reason")):
        raise ForkError(
            f"{PIN_FILE.name}: [bases.{base!r}.engine] substitution {entry} "
            "needs a requirement, what to install `with` instead, and a reason"
        )
    return Substitution(entry["requirement"], entry["with"], entry["reason"])


def _engine(base: str, entry: dict | None) -> Engine | None:
    if entry is None:
        return None
    if entry.get("kernels-only"):
        return _kernels_only_engine(base, entry)
    return Engine(
        wheels=tuple(_artifact(w) for w in entry["wheels"]),
        python=entry["python"],
        substitutions=tuple(
            _substitution(base, item) for item in entry.get("substitutions", ())
        ),
        test_requirements=tuple(entry.get("test-requirements", ())),
    )


def _kernels_only_engine(base: str, entry: dict) -> Engine:
    """An engine that installs its wheel alone over the base's test
    environment, so it has that environment's Python and requirements."""
    extra = {"python", "substitutions", "test-requirements"}.intersection(entry)
    if extra:
        raise ForkError(
            f"{PIN_FILE.name}: [bases.{base!r}.engine] is kernels-only, so it "
            "takes its Python and requirements from the base's test environment; "
            f"remove {', '.join(sorted(extra))}"
        )
    wheels = tuple(_artifact(w) for w in entry["wheels"])
    return Engine(
        wheels, python="", substitutions=(), test_requirements=(), kernels_only=True
    )


LAYOUT = (
    'It needs `default = "<base>"` and, per base, a [bases."<base>"] table with '
    "`version`, `sdist = { file = …, sha256 = … }` and `wheels = [{ file = …, "
    "sha256 = … }, …]`; compare with the file in git (`git diff upstream.toml`)."
)
_MALFORMED = (KeyError, TypeError, AttributeError, ValueError)


def load(path: Path | None = None) -> Pins:
    path = path or ROOT / PIN_FILE.name
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ForkError(f"{path}: cannot read the pin file: {e}") from e
    try:
        bases = {
            name: _base(path, name, entry) for name, entry in data["bases"].items()
        }
        return Pins(default=data["default"], bases=bases)
    except _MALFORMED as e:
        raise _malformed(path, "", e) from e


def _base(path: Path, name: str, entry: dict) -> Base:
    try:
        version_key(entry["version"])
        return Base(
            name=name,
            version=entry["version"],
            sdist=_artifact(entry["sdist"]),
            wheels=tuple(_artifact(w) for w in entry["wheels"]),
            test_requirements=tuple(entry.get("test-requirements", ())),
            cpu_test_exclude=tuple(
                _exclusion(name, item) for item in entry.get("cpu-test-exclude", ())
            ),
            engine=_engine(name, entry.get("engine")),
        )
    except _MALFORMED as e:
        raise _malformed(path, f"[bases.{name!r}]: ", e) from e


def _malformed(path: Path, where: str, error: Exception) -> ForkError:
    what = f"no {error.args[0]!r}" if isinstance(error, KeyError) else str(error)
    return ForkError(f"{path}: malformed pin file ({where}{what}). {LAYOUT}")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def append_base(base: Base, note: str) -> None:
    """Add ``base`` to the pin file as a new table, keeping the rest as written."""
    path = ROOT / PIN_FILE.name
    wheels = "".join(f"    {_inline(wheel)},\n" for wheel in base.wheels)
    requirements = ", ".join(f'"{r}"' for r in base.test_requirements)
    block = (
        f'\n[bases."{base.name}"]\n'
        f'version = "{base.version}"\n'
        f"sdist = {_inline(base.sdist)}\n"
        f"wheels = [\n{wheels}]\n"
        f"# {note}\n"
        f"test-requirements = [{requirements}]\n"
    )
    text = path.read_text()
    path.write_text(text.rstrip("\n") + "\n" + block)


def _inline(artifact: Artifact) -> str:
    return f'{{ file = "{artifact.file}", sha256 = "{artifact.sha256}" }}'
