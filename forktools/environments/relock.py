"""``make lock``: write each environment's lock from the package index.

The one command that moves a lock (``lockfiles`` says what a lock is and why
pip resolves it). It prints each move as ``name old -> new`` and
leaves the rest to review: a moved lock re-keys the base's proof ledger rows,
which ``make verify`` then proves again. ``moves`` is the same resolution
without writing, for ``make status FETCH=1``.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable

from forktools.environments import lockfiles, tools, venv
from forktools.queue.pins import Base, ForkError

WHAT = {"test": "test environment", "engine": "CPU engine environment"}


def resolved(base: Base, role: str) -> lockfiles.Lock:
    """The lock of ``role`` as the index serves it today."""
    python = venv.interpreter(base, role)
    print(
        f"lock: {base.name} {role}: resolving with {python.executable} "
        f"(Python {python.version})",
        file=sys.stderr,
        flush=True,
    )
    pinned = lockfiles.locked(python.executable, venv.lock_requirements(base, role))
    return lockfiles.Lock.made(lockfiles.path(base, role), python.version, pinned)


def recorded(base: Base, role: str, sets: dict[str, list[str]]) -> lockfiles.Lock:
    """The lock of ``role`` made from ``sets``, the environments the proof
    ledger recorded, so that every row's key holds (how the first locks were
    made)."""
    if role not in sets:
        raise ForkError(f"patches/{base.name}/proof.json records no {role} environment")
    if role == "engine" and base.engine and base.engine.kernels_only:
        return resolved(base, role)  # its new venv's seeds: nothing to record
    python = venv.interpreter(base, role)
    wheel = lockfiles.wheel_line(venv.wheel_file(base, role))
    own = sorted(set(sets[role][1:]) - {wheel})
    pinned = lockfiles.locked(python.executable, own, no_deps=True)
    return lockfiles.Lock.made(lockfiles.path(base, role), python.version, pinned)


RecordedSets = Callable[[Base], dict[str, list[str]]]
ToolEnvironments = dict[str, tuple[list[str], bool]]


def main(
    bases: list[Base],
    recorded_sets: RecordedSets | None = None,
    hook_tools: ToolEnvironments | None = None,
) -> int:
    """Lock each base's environments from the index, or from the sets
    ``recorded_sets`` reads (the proof ledger's); then every tool
    environment: ours, and ``hook_tools`` (each base's upstream lint hooks,
    as ``precommit.tool_environments`` names them)."""
    for base in bases:
        sets = recorded_sets(base) if recorded_sets else None
        for role in lockfiles.roles(base):
            new = (
                recorded(base, role, sets) if sets is not None else resolved(base, role)
            )
            _write(new, _current(base, role), f"{base.name} {WHAT[role]}")
        if sets is not None:
            _same_as_recorded(base, sets)
    for name, (requirements, target) in tool_environments(hook_tools or {}).items():
        what = f"tool environment {name} ({' '.join(requirements)})"
        _write(_tool_lock(name, requirements, target), _tool_current(name), what)
    return 0


def _write(new: lockfiles.Lock, old: lockfiles.Lock | None, what: str) -> None:
    new.path.parent.mkdir(parents=True, exist_ok=True)
    new.path.write_text(lockfiles.render(new, what))
    changes = lockfiles.moves(old, new)
    said = f"{len(changes)} move(s)" if changes else "unchanged"
    print(f"{new.shown}: {len(new.pinned)} distributions, {said}")
    for change in changes:
        print(f"  {change}")


def tool_environments(hook_tools: ToolEnvironments) -> ToolEnvironments:
    """The tool environments the tooling installs on first use, ours and
    ``hook_tools``, by name: their requirements, and whether they are a
    ``--target`` folder rather than an environment."""
    found = {
        tools.environment_name(tool): ([tool], False)
        for tool in (tools.RUFF, tools.PYYAML, tools.UV, tools.IMPORT_LINTER)
    }
    for packages in (tools.XDIST, tools.BUILD):
        found[tools.packages_name(packages)] = (list(packages), True)
    return found | hook_tools


def _tool_lock(name: str, requirements: list[str], target: bool) -> lockfiles.Lock:
    print(f"lock: tool {name}: resolving", file=sys.stderr, flush=True)
    if target:  # packages alone, no environment of their own
        pinned = lockfiles.resolve(sys.executable, requirements, no_deps=True)
    else:
        pinned = lockfiles.locked(sys.executable, requirements)
    return lockfiles.Lock.made(tools.lock_path(name), platform.python_version(), pinned)


def _tool_current(name: str) -> lockfiles.Lock | None:
    path = tools.lock_path(name)
    if not path.exists():
        return None
    return lockfiles.read_file(path, platform.python_version())


def _same_as_recorded(base: Base, recorded_sets: dict[str, list[str]]) -> None:
    for role, lines in venv.environments(base).items():
        if recorded_sets.get(role) != lines:
            differ = set(lines) ^ set(recorded_sets.get(role, []))
            raise ForkError(
                f"{lockfiles.path(base, role)}: the lock's set is not the one "
                f"patches/{base.name}/proof.json records: {', '.join(sorted(differ))}"
            )


def _current(base: Base, role: str) -> lockfiles.Lock | None:
    try:
        return venv.lock_of(base, role)
    except ForkError:
        return None


def moves(base: Base) -> list[str]:
    """For ``make status FETCH=1``: per lock, what the index serves that
    differs from it."""
    lines = []
    for role in lockfiles.roles(base):
        current = _current(base, role)
        changes = lockfiles.moves(current, resolved(base, role))
        where = current.shown if current else f"locks/{base.name}/{role}.txt"
        said = "; ".join(changes) or "the index serves the locked set"
        lines.append(f"{where}: {said}")
    return lines
