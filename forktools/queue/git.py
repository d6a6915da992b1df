"""Run git in a fork tree with settings that make its output reproducible.

The user's own git configuration is ignored for the commands the tooling
runs, so that ``format-patch`` output, and therefore the exported patches,
are byte-identical on every machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from forktools.queue.pins import ForkError

IDENTITY = ("vllm-fork", "vllm-fork@localhost")
BASE_DATE = "2000-01-01T00:00:00+0000"
MIN_VERSION = (2, 28)  # git init --initial-branch


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for key in list(env):
        if key.startswith("GIT_"):
            del env[key]
    env.update(
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME=IDENTITY[0],
        GIT_AUTHOR_EMAIL=IDENTITY[1],
        GIT_COMMITTER_NAME=IDENTITY[0],
        GIT_COMMITTER_EMAIL=IDENTITY[1],
        LC_ALL="C",
    )
    env.update(extra or {})
    return env


def run(
    tree: Path,
    *args: str,
    check: bool = True,
    env: dict[str, str] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    _require_git(shutil.which("git"))
    worktrees = args[:1] == ("worktree",)
    with _worktrees_locked(tree) if worktrees else contextlib.nullcontext():
        result = subprocess.run(
            ["git", "-C", str(tree), "-c", "core.abbrev=12", *args],
            env=_env(env),
            input=input,
            capture_output=True,
            text=True,
        )
    if check and result.returncode != 0:
        raise ForkError(
            f"git {' '.join(args)} failed in {tree}:\n{result.stderr.strip()}"
        )
    return result


@contextlib.contextmanager
def _worktrees_locked(tree: Path):
    """One ``git worktree`` command at a time per repository: a prune run
    beside another thread's add deletes the worktree that add is making."""
    common = tree / out(tree, "rev-parse", "--git-common-dir")
    with open(common / "vllm-fork-worktrees.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@functools.cache
def _require_git(executable: str | None) -> None:
    """Refuse a missing or too old git before it fails on an option."""
    if executable is None:
        raise ForkError(
            "git is not installed (not found on PATH); the fork tree is a git "
            f"repository. Install git >= {'.'.join(map(str, MIN_VERSION))} and "
            "run again."
        )
    said = subprocess.run(
        [executable, "--version"], capture_output=True, text=True
    ).stdout.strip()
    found = re.search(r"(\d+)\.(\d+)", said)
    if not found or tuple(map(int, found.groups())) < MIN_VERSION:
        raise ForkError(
            f"`{executable} --version` says {said!r}: the fork tree needs git >= "
            f"{'.'.join(map(str, MIN_VERSION))} (`git init --initial-branch`). "
            "Install a newer git (put it first on PATH) and run again."
        )


def out(tree: Path, *args: str) -> str:
    return run(tree, *args).stdout.strip()


def apply_check(
    tree: Path, rev: str, patch: Path, *, reverse: bool = False, verbose: bool = False
) -> subprocess.CompletedProcess[str]:
    """``git apply --check`` of ``patch`` on ``rev``'s tree, leaving HEAD alone;
    ``verbose`` reports each hunk's offset on stderr."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        run(tree, "read-tree", rev, env=env)
        flags = ["--reverse"] * reverse + ["--verbose"] * verbose
        return run(
            tree,
            "apply",
            "--cached",
            "--check",
            *flags,
            str(patch),
            check=False,
            env=env,
        )


def blob(tree: Path, name: str) -> bytes:
    """The bytes of the blob ``name`` (a sha or ``rev:path``), as stored."""
    result = subprocess.run(
        ["git", "-C", str(tree), "cat-file", "blob", name],
        env=_env(),
        capture_output=True,
    )
    if result.returncode != 0:
        raise ForkError(
            f"git cat-file blob {name} failed in {tree}:\n"
            f"{result.stderr.decode(errors='replace').strip()}"
        )
    return result.stdout
