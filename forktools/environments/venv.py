"""One cached virtual environment per base, for running its tests on CPU.

Each holds the base's locked set (``locks/<base>/test.txt``, installed with
hashes and without dependencies: see ``forktools/environments/lockfiles.py``) and the
upstream wheel; the fork tree shadows the installed ``vllm`` through
PYTHONPATH when tests run. The lock is made from the wheel's requirements and
the base's test requirements; a base may name requirements to leave out here,
each with its reason (``cpu-test-exclude`` in ``upstream.toml``: GPU kernel
packages the CPU tests never import, which the package index may lack). GPU
nodes (``pip install -e .``) always get the exact requirements. Environments
live in the cache, keyed by base and lock, so that fresh clones reuse them.
Each is about 10 GB, so a stale one is removed: one of the same base, made by
the same Python (clones on other Pythons keep theirs), that no run is using
(runs hold a shared lock on the environment they use until they exit).

A base may also pin an engine (``[bases."<base>".engine]``): a CPU build of
vLLM, whose compiled kernels run the fork tree's sources in a real engine
(``LLM(...)``) on this machine. Its environment (``<base>-engine-<key>``) is
made by the Python version the pin names, holds its lock
(``locks/<base>/engine.txt``: the wheel's requirements with the pin's
substitutions) and that wheel installed without its dependencies, and is
built, shared and replaced like the test environments. In it, the fork tree
on PYTHONPATH gives ``vllm``'s Python files and the harness loads the compiled
extensions from the CPU build (``forktools/engine/harness/vllm_engine_kernels.py``).
A kernels-only engine (a CPU build of another release, whose requirements are
not the base's) is a small environment over the base's test environment: the
wheel alone, and a ``.pth`` that adds the test environment's packages after it.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from forktools.environments import lockfiles
from forktools.queue import download, file_locks, metadata
from forktools.queue.pins import Base, ForkError

COMPLETE_MARKER = ".vllm-fork-complete"
ENGINE_PYTHON_ENV = "VLLM_FORK_ENGINE_INTERPRETER"
_KEY = "[0-9a-f]{12}"
_in_use: dict[Path, file_locks.Lock] = {}  # held until this run exits


def _key(base: Base, wheel: Path) -> str:
    lock = lock_of(base, "test")
    return _digest(
        "\n".join([base.name, wheel.name, sys.version, lock.path.read_text()])
    )


# What an environment takes on disk, as measured here (x86_64, 2026-12):
# v0.19.1's test 11 GB, engine 8.2 GB; v0.33.0's kernels-only engine layer
# 0.5 GB. Only the plan of a run that must build one uses them.
TYPICAL_GB = {"test": 10.0, "engine": 8.2, "engine layer": 0.5}


def cache_root() -> Path:
    return download.cache_dir() / "venvs"


def test_path(base: Base) -> Path:
    """Where the base's test environment is (or will be), downloading nothing."""
    wheel = Path(base.wheel_for_this_machine().file)
    return cache_root() / f"{base.name}-{_key(base, wheel)}"


def missing(base: Base) -> list[str]:
    """The base's environments not built yet: "test", "engine" (one of its
    own) or "engine layer" (kernels only, over the test environment). An
    engine counts as built when one of this base is complete."""
    found = [] if (test_path(base) / COMPLETE_MARKER).exists() else ["test"]
    if base.engine and base.engine_wheel_for_this_machine() is not None:
        role = "engine layer" if base.engine.kernels_only else "engine"
        engines = cache_root().glob(f"{base.name}-engine-*/{COMPLETE_MARKER}")
        rebuilt_with_test = "test" in found and role == "engine layer"
        if rebuilt_with_test or not any(engines):
            found.append(role)
    return found


def ensure(base: Base) -> Path:
    """The base's virtual environment, built if missing, and marked in use
    until this run exits. Returns its python."""
    wheel = download.fetch(base.wheel_for_this_machine())
    path = test_path(base)
    if path not in _in_use:

        def build() -> None:
            _remove_stale(path, f"{base.name}-", _made_by(THIS_PYTHON))
            _build(base, path, wheel)

        _in_use[path] = _use(path, build)
        _check_locked_set(base, "test", path)
    return path / "bin" / "python"


def interpreter(base: Base, role: str) -> Interpreter:
    """The Python that makes the base's ``role`` environment."""
    if role == "engine" and base.engine and not base.engine.kernels_only:
        return engine_interpreter(base)
    return THIS_PYTHON


def lock_of(base: Base, role: str) -> lockfiles.Lock:
    return lockfiles.read(base, role, interpreter(base, role).version)


def environments(base: Base) -> dict[str, list[str]]:
    """What each environment the base builds here holds, read from its lock
    (nothing is built): the proof ledger's environment input."""
    return {role: environment(base, role) for role in lockfiles.roles(base)}


def environment(base: Base, role: str) -> list[str]:
    """What the base's ``role`` environment holds, read from its lock."""
    python = interpreter(base, role)  # the engine's: a subprocess, asked once
    lock = lockfiles.read(base, role, python.version)
    lines = [*lock.lines, lockfiles.wheel_line(wheel_file(base, role))]
    if role == "engine" and base.engine and base.engine.kernels_only:
        lines += environment(base, "test")[1:]  # layered over the test environment
    return lockfiles.environment(lines, python.version)


def wheel_file(base: Base, role: str) -> str:
    """The file name of the pinned wheel the ``role`` environment installs."""
    artifact = base.engine_wheel_for_this_machine() if role == "engine" else None
    return (artifact or base.wheel_for_this_machine()).file


def _check_locked_set(base: Base, role: str, env: Path) -> None:
    """Refuse an environment that does not hold exactly what its lock says
    (installed into by hand, or a lock that misses a distribution)."""
    expected = environment(base, role)
    found = lockfiles.installed_set(env / "bin" / "python")
    extra = sorted(set(found) - set(expected))
    missing = sorted(set(expected) - set(found))
    if extra or missing:
        said = [f"holds {', '.join(extra)}"] if extra else []
        said += [f"lacks {', '.join(missing)}"] if missing else []
        raise ForkError(
            f"{env} is not what {lock_of(base, role).shown} locks: "
            f"{'; '.join(said)}. Remove {env} and run again; if it was just "
            f"built, the lock is incomplete: `make lock BASE={base.name}`"
        )


def lock_requirements(base: Base, role: str) -> list[str]:
    """What the lock of ``role`` is resolved from: the wheel's requirements
    (less the CPU exclusions, or substituted) and the test requirements."""
    if role == "test":
        wheel = download.fetch(base.wheel_for_this_machine())
        required = metadata.read(wheel).install_requires
        return [*requirements_without(base, required), *base.test_requirements]
    assert base.engine is not None
    if base.engine.kernels_only:
        return []  # the wheel alone, over the test environment
    engine = base.engine_wheel_for_this_machine()
    assert engine is not None
    required = metadata.read(download.fetch(engine)).install_requires
    return [*substituted(base, required), *base.engine.test_requirements]


def _use(path: Path, build: Callable[[], None]) -> file_locks.Lock:
    """The environment's lock, held shared once ``path`` is complete.

    Builders take a separate build lock first: a run that waits for another
    run's build must not wait on the lock that run then holds shared until it
    exits (nor, two threads of one run, on each other)."""
    lock = file_locks.Lock(lock_file(path), f"to build {path}")
    try:
        lock.shared()
        if not (path / COMPLETE_MARKER).exists():
            lock.unlock()
            with file_locks.held(build_lock_file(path), f"to build {path}"):
                lock.shared()
                if not (path / COMPLETE_MARKER).exists():
                    lock.exclusive()
                    build()
                    lock.shared()
    except BaseException:
        lock.close()
        raise
    return lock


def lock_file(env: Path) -> Path:
    """Shared by the runs that use ``env``; exclusive to its builder or remover."""
    return download.lock_file(f"venv-{env.name}")


def build_lock_file(env: Path) -> Path:
    """Held by the one run that checks for ``env`` and builds it if missing."""
    return download.lock_file(f"venv-build-{env.name}")


def _build(base: Base, path: Path, wheel: Path) -> None:
    _fill(
        path,
        f"{base.name} test environment",
        sys.executable,
        lambda python: install_commands(base, python, wheel),
        _explainer(base, "test"),
    )


def _explainer(base: Base, role: str) -> Callable[[str], str | None]:
    return lambda output: lockfiles.explain(output, lock_of(base, role), base)


def _fill(
    path: Path,
    what: str,
    python: str,
    commands_for: Callable,
    explain: Callable[[str], str | None],
) -> None:
    """Make the environment ``path`` with ``python`` and install into it;
    marked complete only once every install succeeded."""
    shutil.rmtree(path, ignore_errors=True)
    print(f"vllm-fork: building the {what} in {path}", file=sys.stderr, flush=True)
    make_venv(path, python)
    commands = commands_for(path / "bin" / "python")
    log = download.cache_dir() / "logs" / f"{path.name}.install.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    for install in commands:
        returncode, output = _install(install, what, log)
        if returncode != 0:
            shutil.rmtree(path, ignore_errors=True)
            said = explain(output)
            if said:
                raise ForkError(
                    f"installing the {what} failed: {said}; nothing was kept "
                    f"(pip's log: {log})"
                )
            tail = "".join(output.splitlines(keepends=True)[-25:]).rstrip()
            raise ForkError(
                f"installing the {what} failed; nothing was kept. pip's last "
                f"lines (the whole log: {log}):\n{tail}\nFix the cause and run "
                "the command again."
            )
    log.unlink(missing_ok=True)
    (path / COMPLETE_MARKER).write_text("".join(" ".join(c) + "\n" for c in commands))


PROGRESS_SECONDS = 20.0


def _install(command: list[str], what: str, log: Path) -> tuple[int, str]:
    """Run one pip command, its whole output into ``log``; on stderr a line
    of progress every ``PROGRESS_SECONDS`` (how many distributions pip has
    collected, of how many a lock lists) instead of pip's log."""
    total = _locked_count(command)
    started = time.monotonic()
    done = threading.Event()

    def report() -> None:
        while not done.wait(PROGRESS_SECONDS):
            text = log.read_text(errors="replace") if log.exists() else ""
            collected = len(re.findall(r"^(?:Collecting|Processing) ", text, re.M))
            doing = "installing" if "\nInstalling collected" in text else "collected"
            print(
                f"vllm-fork: {what}: {doing} {collected}"
                f"{f'/{total}' if total else ''} distributions, "
                f"{time.monotonic() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    try:
        with open(log, "a") as kept:
            result = subprocess.run(command, stdout=kept, stderr=subprocess.STDOUT)
    finally:
        done.set()
        reporter.join()
    return result.returncode, log.read_text(errors="replace") if log.exists() else ""


def _locked_count(command: list[str]) -> int:
    """How many distributions the lock a ``pip install -r`` reads lists."""
    if "-r" not in command:
        return 0
    lock = Path(command[command.index("-r") + 1])
    return sum(1 for line in lock.read_text().splitlines() if line[:1].isalnum())


def make_venv(path: Path, python: str = sys.executable) -> None:
    if subprocess.run([python, "-m", "venv", str(path)]).returncode != 0:
        shutil.rmtree(path, ignore_errors=True)
        raise ForkError(
            f"`{python} -m venv {path}` failed (output above). On Debian and "
            "Ubuntu install python3-venv (for that Python X.Y: pythonX.Y-venv), "
            "then run again."
        )


def pip_install(python: Path) -> list[str]:
    """``pip install`` run by ``python``, as every environment here is filled."""
    return [str(python), "-m", "pip", "install", "--progress-bar", "off"]


def install_commands(base: Base, python: Path, wheel: Path) -> list[list[str]]:
    """The pip commands that fill the environment: the lock, then the wheel."""
    pip = pip_install(python)
    lock = lockfiles.install_command(pip, lock_of(base, "test"))
    return [lock, [*pip, "--no-deps", str(wheel)]]


def requirements_without(base: Base, requirements: list[str]) -> list[str]:
    """``requirements`` less the base's CPU test exclusions, each of which must
    be one of them exactly (so that a new pin gets looked at again)."""
    excluded = {e.requirement for e in base.cpu_test_exclude}
    unknown = excluded.difference(requirements)
    if unknown:
        raise ForkError(
            f"{base.name}: cpu-test-exclude names {', '.join(sorted(unknown))}, "
            "which the wheel does not require (as written); update upstream.toml"
        )
    return [r for r in requirements if r not in excluded]


@dataclass(frozen=True)
class Interpreter:
    """A Python that makes environments: where it is and what it reports."""

    executable: str
    version: str  # platform.python_version()
    home: str  # the directory of its base executable, as pyvenv.cfg records
    build: str  # sys.version, which tells builds of one version apart


THIS_PYTHON = Interpreter(
    sys.executable,
    platform.python_version(),
    os.path.dirname(os.path.abspath(sys._base_executable)),
    sys.version,
)
_DESCRIBE = (
    "import json, os, platform, sys; print(json.dumps([platform.python_version(), "
    "os.path.dirname(os.path.abspath(sys._base_executable)), sys.version]))"
)


def _remove_stale(keep: Path, prefix: str, ours: Callable[[Path], bool]) -> None:
    """Remove the environments named ``prefix<key>`` beside ``keep`` that
    ``ours`` claims and no run uses."""
    for old in sorted(keep.parent.glob(f"{glob.escape(prefix)}*")):
        if old == keep or not re.fullmatch(_KEY, old.name[len(prefix) :]):
            continue
        if not ours(old):
            continue
        lock = file_locks.Lock(lock_file(old), "")
        try:
            if lock.exclusive_if_free():
                print(f"vllm-fork: removing stale environment {old}", file=sys.stderr)
                shutil.rmtree(old, ignore_errors=True)
            else:
                print(
                    f"vllm-fork: keeping stale environment {old}: a run is using it",
                    file=sys.stderr,
                )
        finally:
            lock.close()


def _made_by(python: Interpreter) -> Callable[[Path], bool]:
    """Whether an environment was made by ``python`` (an unfinished one, with
    no pyvenv.cfg, counts as anyone's)."""

    def made(env: Path) -> bool:
        config = env / "pyvenv.cfg"
        if not config.exists():
            return True
        settings = dict(
            (part.strip() for part in line.split("=", 1))
            for line in config.read_text().splitlines()
            if "=" in line
        )
        version = settings.get("version") or settings.get("version_info")
        return version == python.version and settings.get("home") == python.home

    return made


def ensure_engine(base: Base) -> Path | None:
    """The base's engine environment, built if missing, and marked in use
    until this run exits. Returns its python; None when the base pins no
    engine."""
    artifact = base.engine_wheel_for_this_machine()
    if artifact is None:
        return None
    wheel = download.fetch(artifact)
    assert base.engine is not None
    lock = lock_of(base, "engine")
    if base.engine.kernels_only:
        # Keyed by the test environment below, so a new one gets a new engine.
        below = ensure(base).parent.parent
        spec = [
            base.name,
            "kernels-only",
            wheel.name,
            below.name,
            lock.path.read_text(),
        ]
        return _ensure_engine_env(
            base,
            _digest("\n".join(spec)),
            THIS_PYTHON,
            f"kernels only, over {below.name}",
            lambda env_python: kernels_engine_commands(env_python, wheel, below, lock),
        )
    python = engine_interpreter(base)
    return _ensure_engine_env(
        base,
        _engine_key(base, wheel, python, lock),
        python,
        f"Python {python.version}",
        lambda env_python: engine_install_commands(base, env_python, wheel),
    )


def _ensure_engine_env(
    base: Base, key: str, python: Interpreter, kind: str, commands_for: Callable
) -> Path:
    prefix = f"{base.name}-engine-"
    path = cache_root() / (prefix + key)
    if path not in _in_use:

        def build() -> None:
            _remove_stale(path, prefix, _made_by(python))
            _fill(
                path,
                f"{base.name} engine environment ({kind})",
                python.executable,
                commands_for,
                _explainer(base, "engine"),
            )

        _in_use[path] = _use(path, build)
        _check_locked_set(base, "engine", path)
    return path / "bin" / "python"


# Run by the engine environment's Python: a .pth in its site-packages that
# adds the site-packages of the environment below (argv[1]) after its own.
_LAYER_OVER = (
    "import pathlib, sys, sysconfig; "
    "below = sysconfig.get_paths(vars={'base': sys.argv[1], "
    "'platbase': sys.argv[1]})['purelib']; "
    "pathlib.Path(sysconfig.get_paths()['purelib'], 'vllm_fork_below.pth')"
    ".write_text(f'import site; site.addsitedir({below!r})\\n')"
)


def kernels_engine_commands(
    python: Path, wheel: Path, below: Path, lock: lockfiles.Lock
) -> list[list[str]]:
    """The commands that fill a kernels-only engine environment: its own
    lock (the seeds of a new environment), the wheel without its
    requirements, then the test environment ``below`` layered under it."""
    pip = pip_install(python)
    return [
        lockfiles.install_command(pip, lock),
        [*pip, "--no-deps", str(wheel)],
        [str(python), "-c", _LAYER_OVER, str(below)],
    ]


def _digest(spec: str) -> str:
    return hashlib.sha256(spec.encode()).hexdigest()[:12]


def _engine_key(
    base: Base, wheel: Path, python: Interpreter, lock: lockfiles.Lock
) -> str:
    return _digest(
        "\n".join(
            [base.name, "engine", wheel.name, python.build, lock.path.read_text()]
        )
    )


def engine_install_commands(base: Base, python: Path, wheel: Path) -> list[list[str]]:
    """The pip commands that fill the engine environment: its lock (the
    wheel's requirements, substituted, with the engine's test requirements);
    then the wheel without its own (unsatisfiable as written) requirements."""
    pip = pip_install(python)
    lock = lockfiles.install_command(pip, lock_of(base, "engine"))
    return [lock, [*pip, "--no-deps", str(wheel)]]


def substituted(base: Base, requirements: list[str]) -> list[str]:
    """``requirements`` with the engine's substitutions made, each of which
    must name one of them exactly (so that a new pin gets looked at again)."""
    assert base.engine is not None
    replacements = {s.requirement: s.replacement for s in base.engine.substitutions}
    unknown = set(replacements).difference(requirements)
    if unknown:
        raise ForkError(
            f"{base.name}: the engine's substitutions name "
            f"{', '.join(sorted(unknown))}, which its wheel does not require (as "
            "written); update upstream.toml"
        )
    return [replacements.get(r, r) for r in requirements]


def engine_interpreter(base: Base) -> Interpreter:
    """The Python of the version the base's engine names: the one
    ``VLLM_FORK_ENGINE_PYTHON`` names if set, else ``pythonX.Y`` on PATH or a
    pyenv installation of that version."""
    assert base.engine is not None
    wanted = base.engine.python
    if chosen := os.environ.get(ENGINE_PYTHON_ENV):
        candidates = [chosen]
    else:
        candidates = [shutil.which(f"python{wanted}"), *_pyenv_pythons(wanted)]
    tried = []
    for candidate in filter(None, candidates):
        python = _describe(candidate)
        if python and python.version.rsplit(".", 1)[0] == wanted:
            return python
        found = f"Python {python.version}" if python else "does not run"
        tried.append(f"{candidate} ({found})")
    raise ForkError(
        f"{base.name}: the engine environment needs Python {wanted} (see "
        f"upstream.toml); tried: {', '.join(tried) or 'none found'}. Install "
        f"it (Debian and Ubuntu: python{wanted} python{wanted}-venv) or set "
        f"{ENGINE_PYTHON_ENV} to its executable, then run again."
    )


def _pyenv_pythons(wanted: str) -> list[str]:
    """pyenv's installations of ``wanted`` (``3.12``), newest first; its
    shims run only the version selected, so they are skipped."""
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    found = root.glob(f"versions/{glob.escape(wanted)}.*/bin/python{wanted}")
    return sorted((str(p) for p in found), key=_patch_level, reverse=True)


def _patch_level(executable: str) -> tuple[int, ...]:
    version = Path(executable).parent.parent.name
    return tuple(int(n) if n.isdigit() else -1 for n in version.split("."))


def _describe(executable: str) -> Interpreter | None:
    try:
        result = subprocess.run(
            [executable, "-c", _DESCRIBE], capture_output=True, text=True
        )
    except OSError:
        return None
    if result.returncode != 0:
        return None
    version, home, build = json.loads(result.stdout)
    return Interpreter(executable, version, home, build)
