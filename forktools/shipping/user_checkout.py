"""A patch applied onto a user's vLLM checkout: the one place ``make pr
ONTO=`` and ``make apply ONTO=`` do it.

The checkout is the user's: git runs there with their own configuration and
identity (they are the committer), a checkout with changes or an operation in
progress is refused, and a patch goes on a branch of its own, three-way, with
the preimage blobs it names brought in from the fork tree where the checkout
lacks them (a clone of vLLM has them; a tree made from an sdist may not). A
conflict stops naming the file, the conflicted lines and the commands that
finish or abandon it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from forktools.queue import git
from forktools.queue.pins import ForkError


def git_in(
    checkout: Path, *args: str, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """git in the user's checkout with the user's own configuration and
    identity (they are the committer), unlike the fork tree's."""
    result = subprocess.run(
        ["git", "-C", str(checkout), *args], capture_output=True, text=True
    )
    if check and result.returncode != 0:
        raise ForkError(
            f"git {' '.join(args)} failed in {checkout}:\n{result.stderr.strip()}"
        )
    return result


def require_checkout(checkout: Path) -> None:
    """Refuse ``checkout`` unless it is the top of a git checkout."""
    top = git_in(checkout, "rev-parse", "--show-toplevel")
    if not checkout.is_dir() or top.returncode != 0:
        raise ForkError(
            f"ONTO={checkout}: not a git checkout (git clone "
            "https://github.com/vllm-project/vllm, then ONTO=<that path>)"
        )
    if Path(top.stdout.strip()).resolve() != checkout.resolve():
        raise ForkError(
            f"ONTO={checkout}: name the checkout's top, {top.stdout.strip()}"
        )


def require_clean(checkout: Path, command: str) -> None:
    """Refuse a checkout with changes or an operation in progress: the
    patch goes on a branch of its own, and nothing of the user's moves."""
    for state in ("rebase-apply", "rebase-merge", "MERGE_HEAD", "CHERRY_PICK_HEAD"):
        path = git_in(checkout, "rev-parse", "--git-path", state).stdout.strip()
        if (checkout / path).exists():
            raise ForkError(
                f"{checkout}: a git operation is in progress ({state}); finish or "
                "abort it first"
            )
    changed = git_in(checkout, "status", "--porcelain", "--untracked-files=no")
    if changed.stdout.strip():
        files = ", ".join(line[3:] for line in changed.stdout.splitlines()[:5])
        raise ForkError(
            f"{checkout} has uncommitted changes ({files}); commit or stash them, "
            f"then run {command} again"
        )


def describe(checkout: Path, commit: str) -> str:
    said = git_in(checkout, "log", "-1", "--format=%h %s", "--abbrev=12", commit)
    return said.stdout.strip()


_PREIMAGE = re.compile(r"^index ([0-9a-f]{7,})\.\.", re.MULTILINE)


def bring_blobs(tree: Path, patch: Path, checkout: Path) -> int:
    """Copy each preimage blob the patch names into ``checkout`` where it
    lacks it, so that ``git am --3way`` can build the merge base."""
    brought = 0
    for short in _PREIMAGE.findall(patch.read_text()):
        if set(short) == {"0"}:
            continue  # a new file
        if git_in(checkout, "cat-file", "-e", f"{short}^{{blob}}").returncode == 0:
            continue
        data = git.blob(tree, short)
        subprocess.run(
            ["git", "-C", str(checkout), "hash-object", "-w", "--stdin"],
            input=data,
            capture_output=True,
            check=True,
        )
        brought += 1
    return brought


def conflict(
    shown: str,
    patch: Path,
    checkout: Path,
    branch: str,
    previous: str,
    applied: subprocess.CompletedProcess[str],
    command: str,
) -> str:
    """Where the three-way apply stopped, and the commands to finish it."""
    unmerged = git_in(checkout, "diff", "--name-only", "--diff-filter=U")
    files = unmerged.stdout.split()
    where = [
        f"  {name}: {_conflict_lines(checkout / name)} (the patch's "
        f"{', '.join(_hunks(patch, name)) or 'hunks'})"
        for name in files
    ]
    if not where:
        where = [f"  {applied.stderr.strip() or applied.stdout.strip()}"]
    return "\n".join(
        [
            f"{shown} does not apply onto "
            f"{describe(checkout, 'HEAD')} in {checkout} (branch {branch}), "
            "three-way:",
            *where,
            "Nothing but this patch was changed in the checkout.",
            "To finish by hand there:",
            "  edit the lines between <<<<<<< and >>>>>>>, then",
            f"  git add {' '.join(files) or '<files>'} && git am --continue",
            f"  and run {command} again (it goes on from the branch).",
            f"To give up: git am --abort && git switch {previous} && git branch -D "
            f"{branch}",
        ]
    )


def _hunks(patch: Path, name: str) -> list[str]:
    """The ``@@`` headers of the patch's hunks in file ``name``."""
    section = patch.read_text().partition(f"diff --git a/{name} b/{name}\n")[2]
    section = section.split("\ndiff --git ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("@@ ")]


def _conflict_lines(path: Path) -> str:
    """The lines of each conflict in ``path``: ``lines 12-30`` (hunks)."""
    spans, start = [], None
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if line.startswith("<<<<<<<"):
            start = number
        elif line.startswith(">>>>>>>") and start is not None:
            spans.append(f"{start}-{number}")
            start = None
    return f"conflict at lines {', '.join(spans)}" if spans else "conflict"
