"""Write a tree's commits back into its queue."""

from __future__ import annotations

from forktools import git, materialize, queue
from forktools.pins import Base, ForkError


def export(base: Base) -> list[str]:
    tree = materialize.tree_dir(base)
    if not (tree / ".git").exists():
        raise ForkError(f"no {base.name} tree to export; run `make fork` first")
    dirty = git.out(tree, "status", "--porcelain", "--untracked-files=all")
    if dirty:
        raise ForkError(
            f"{tree} has uncommitted changes:\n{dirty}\nCommit them in the tree "
            "(`cd vllm && git commit -s`, one commit per patch), then export."
        )
    state = materialize.read_state(tree)
    head = git.out(tree, "rev-parse", "HEAD")
    if state.get("queue") != queue.queue_id(base) and head != state.get("head"):
        raise ForkError(
            f"patches/{base.name} changed since the tree was built (a pull?) and "
            "the tree has new commits too; exporting would overwrite the "
            "incoming patches. Rebase the tree's commits onto the new queue "
            "first (see README)."
        )
    names = queue.write(base, tree, "base")
    materialize.record(tree, base)
    return names
