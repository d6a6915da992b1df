"""Throwaway checkouts of a fork tree for test runs, from a pool of git
worktrees given back by earlier ones. Only reuse lives here: what a
checkout holds is ``runner.prepare``'s, which is keyed."""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

from forktools.proof import runner
from forktools.queue import git


@contextmanager
def checkout(tree: Path, tree_id: str | None = None):
    """A throwaway checkout of the fork tree's HEAD, or of the git tree
    ``tree_id``, as ``runner.prepare`` makes it: a worktree of ``tree`` that an
    earlier checkout gave back, or a new one."""
    revision = git.out(tree, "rev-parse", "HEAD")
    if tree_id is not None:
        revision = git.out(tree, "commit-tree", tree_id, "-p", "HEAD", "-m", "verify")
    path = _idle_worktree(tree)
    try:
        runner.prepare(tree, path, revision)
        yield path
    except BaseException:
        _remove_worktree(tree, path)
        raise
    with _WORKTREES_LOCK:
        _IDLE_WORKTREES.setdefault(tree, []).append(path)


# Worktrees given back by checkouts, per tree: a new one costs seconds of
# file writes (6,000 files and 2,000 links for a recent base), a switch
# rewrites only the files two revisions change.
_IDLE_WORKTREES: dict[Path, list[Path]] = {}


_WORKTREES_LOCK = threading.Lock()


def _idle_worktree(tree: Path) -> Path:
    """A worktree of ``tree`` given back earlier, or a new one. A tree built
    again in place (a new ``.git``) no longer knows its old worktrees: they
    are removed, not reused."""
    while True:
        with _WORKTREES_LOCK:
            idle = _IDLE_WORKTREES.get(tree)
            path = idle.pop() if idle else None
        if path is None:
            break
        if _known(path):
            return path
        _remove_worktree(tree, path)
    path = Path(tempfile.mkdtemp(prefix="vllm-fork-verify-"))
    shutil.rmtree(path)
    git.run(tree, "worktree", "prune")  # what a killed run left
    git.run(tree, "worktree", "add", "--detach", "--quiet", str(path), "HEAD")
    return path


def _known(path: Path) -> bool:
    """Whether the worktree ``path``'s repository still holds its record."""
    link = path / ".git"
    if not link.is_file():
        return False
    return Path(link.read_text().removeprefix("gitdir:").strip()).is_dir()


def _remove_worktree(tree: Path, path: Path) -> None:
    git.run(tree, "worktree", "remove", "--force", str(path), check=False)
    shutil.rmtree(path, ignore_errors=True)


@atexit.register
def remove_checkouts() -> None:
    """Remove the worktrees checkouts gave back."""
    with _WORKTREES_LOCK:
        idle = [
            (tree, path) for tree, paths in _IDLE_WORKTREES.items() for path in paths
        ]
        _IDLE_WORKTREES.clear()
    for tree, path in idle:
        _remove_worktree(tree, path)
