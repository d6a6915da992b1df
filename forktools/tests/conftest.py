"""A miniature upstream release, served from a local wheelhouse, per test."""

import hashlib
import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from forktools.queue import pins
from forktools.environments import venv
from forktools.queue.pins import ROOT

VERSION = "9.9.9"
BASE = f"v{VERSION}"
CORE = "".join(f"def layer_{i}():\n    return {i}\n\n\n" for i in range(20))
SDIST_FILES = {
    "vllm/__init__.py": "from vllm._version import __version__\n",
    "vllm/core.py": CORE,
    "tests/test_core.py": "def test_layer():\n    pass\n",
    "pyproject.toml": "[tool.ruff]\nline-length = 88\n",
    "setup.py": "raise SystemExit('never extracted')\n",
}
WHEEL_FILES = {
    "vllm/__init__.py": SDIST_FILES["vllm/__init__.py"],
    "vllm/core.py": CORE,
    "vllm/_version.py": f"__version__ = {VERSION!r}\n",
    "vllm/_C.abi3.so": "\x7fELF compiled kernels",
    f"vllm-{VERSION}.dist-info/METADATA": textwrap.dedent(
        f"""\
        Metadata-Version: 2.1
        Name: vllm
        Version: {VERSION}
        Requires-Python: >=3.10
        Requires-Dist: numpy
        Requires-Dist: six>=1.16.0; python_version > "3.11"
        Requires-Dist: scipy; extra == "audio"
        """
    ),
    f"vllm-{VERSION}.dist-info/entry_points.txt": (
        "[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n"
    ),
}


def _sdist(path: Path, version: str = VERSION, files: dict = SDIST_FILES) -> None:
    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def _wheel(path: Path, files: dict = WHEEL_FILES) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)


def installable_wheel(wheel, body: str = ""):
    """Write a wheel pip installs, named and versioned as its file says."""
    name, version = wheel.name.split("-")[:2]
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": body,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/RECORD": "",
    }
    with zipfile.ZipFile(wheel, "w") as archive:
        for file, text in files.items():
            archive.writestr(file, text)
    return wheel


def publish(index: Path, version: str, core: str, tests: str | None = None) -> None:
    """Put vLLM ``version`` with ``core`` as vllm/core.py (and ``tests`` as
    tests/test_core.py) in ``index``: its sdist and x86_64 and aarch64 wheels."""
    files = {**SDIST_FILES, "vllm/core.py": core}
    if tests is not None:
        files["tests/test_core.py"] = tests
    _sdist(index / f"vllm-{version}.tar.gz", version, files)
    wheel = {**WHEEL_FILES, "vllm/core.py": core}
    for arch in ("x86_64", "aarch64"):
        _wheel(index / f"vllm-{version}-py3-none-manylinux_2_17_{arch}.whl", wheel)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def copy_tooling(root: Path, *files: str) -> None:
    """This repository's ``files`` and forktools/ (without its tests) into
    ``root``, as a clone of the project holds them."""
    for name in files:
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(
        ROOT / "forktools",
        root / "forktools",
        ignore=shutil.ignore_patterns("tests", "__pycache__"),
    )


class Project:
    """A scratch fork project: pin file, patches/, cache and wheelhouse."""

    def __init__(self, root: Path, index: Path, publish: bool = True):
        """With ``publish`` false, the project already in ``root`` and ``index``."""
        self.root, self.index = root, index
        self.sdist = index / f"vllm-{VERSION}.tar.gz"
        self.wheel = index / f"vllm-{VERSION}-py3-none-manylinux_2_17_{platform.machine()}.whl"
        if publish:
            _sdist(self.sdist)
            _wheel(self.wheel)
            self.pin()
            self.lock("test")

    def pin(
        self, sdist_sha: str | None = None, wheels: list[Path] | None = None
    ) -> None:
        """Pin the sdist and ``wheels`` (default: this machine's wheel)."""
        pinned = ", ".join(
            f'{{ file = "{wheel.name}", sha256 = "{sha256(wheel)}" }}'
            for wheel in wheels or [self.wheel]
        )
        (self.root / "upstream.toml").write_text(
            textwrap.dedent(
                f"""\
                default = "{BASE}"
                [bases."{BASE}"]
                version = "{VERSION}"
                sdist = {{ file = "{self.sdist.name}", sha256 = "{sdist_sha or sha256(self.sdist)}" }}
                wheels = [{pinned}]
                """
            )
        )

    def lock(self, role: str, *pinned: str) -> Path:
        """Write the base's lock of ``role``: ``pinned`` lines
        (``name==version --hash=sha256:...``) for this Python."""
        path = self.root / "locks" / BASE / f"{role}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        python = ".".join(platform.python_version_tuple()[:2])
        header = f"# for Python {python} on {platform.machine()}\n"
        path.write_text(header + "".join(f"{line}\n" for line in pinned))
        return path

    @property
    def base(self) -> pins.Base:
        return pins.load().get(BASE)

    @property
    def tree(self) -> Path:
        return self.root / ".fork" / "trees" / BASE

    def commit(self, path: str, text: str, message: str) -> None:
        (self.tree / path).write_text(text)
        git(self.tree, "add", path)
        git(self.tree, "commit", "-q", "-s", "-m", message)


def git(tree: Path, *args: str) -> str:
    identity = ["-c", "user.name=Test Author", "-c", "user.email=author@example.com"]
    return subprocess.run(
        ["git", "-C", str(tree), *identity, *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


@pytest.fixture
def project(tmp_path, monkeypatch) -> Project:
    return open_project(tmp_path, monkeypatch)


def open_project(
    path: Path, monkeypatch: pytest.MonkeyPatch, publish: bool = True
) -> Project:
    """The project in ``path`` (made there unless ``publish`` is false), with
    the tooling pointed at it."""
    root, index = path / "root", path / "index"
    root.mkdir(exist_ok=not publish)
    index.mkdir(exist_ok=not publish)
    monkeypatch.setattr(pins, "ROOT", root)
    monkeypatch.setenv("VLLM_FORK_CACHE", str(path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.delenv("VLLM_FORK_BASE", raising=False)
    return Project(root, index, publish)


THIS_PYTHON = (
    platform.python_version(),
    os.path.dirname(os.path.abspath(sys._base_executable)),
)


def _environment(path: Path, version: str, home: str) -> Path:
    (path / "bin").mkdir(parents=True, exist_ok=True)
    (path / "pyvenv.cfg").write_text(f"home = {home}\nversion = {version}\n")
    return path


def tool_lock(name: str, *requirements: str) -> Path:
    """Lock the tool environment ``name`` to ``requirements``, each with a
    made-up hash, in the project ``pins.ROOT`` points at."""
    from forktools.environments import tools

    lock = tools.lock_path(name)
    lock.parent.mkdir(parents=True, exist_ok=True)
    python = ".".join(platform.python_version_tuple()[:2])
    pinned = "".join(f"{r} --hash=sha256:{'0' * 64}\n" for r in requirements)
    lock.write_text(f"# for Python {python} on {platform.machine()}\n{pinned}")
    return lock


@pytest.fixture
def builds(monkeypatch) -> list[Path]:
    """Environment builds that take a moment and install nothing: the
    environments made, in order."""
    made, run = [], subprocess.run

    def build_slowly(command, *args, **kwargs):
        if command[1:3] == ["-m", "venv"]:
            made.append(Path(command[3]))
            time.sleep(0.5)
            _environment(Path(command[3]), *THIS_PYTHON)
        elif command[1:4] == ["-m", "pip", "install"]:
            lock = command[-1] if command[-2] == "-r" else None
            for line in Path(lock).read_text().splitlines() if lock else []:
                if "==" in line and not line.startswith("#"):
                    (Path(command[0]).parent / line.split("==")[0]).touch()
        elif command[1] == "-c" and Path(command[0]).parent.parent in made:
            pass  # a step run by an environment's Python, which is not made here
        else:
            return run(command, *args, **kwargs)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", build_slowly)
    # What such an environment holds is not what its lock says.
    monkeypatch.setattr(venv, "_check_locked_set", lambda *args: None)
    return made
