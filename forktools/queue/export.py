"""Write a tree's commits back into its queue."""

from __future__ import annotations

import tempfile
from pathlib import Path

from forktools.queue import git, materialize, series
from forktools.queue.pins import Base, ForkError, sha256_of


def export(base: Base) -> list[str]:
    with materialize.tree_lock(base):
        return _export(base, materialize.tree_dir(base))


def _export(base: Base, tree: Path) -> list[str]:
    if not (tree / ".git").exists():
        raise ForkError(f"no {base.name} tree to export; run `make fork` first")
    dirty = "\n".join(materialize.uncommitted(tree))
    if dirty:
        raise ForkError(
            f"{tree} has uncommitted changes:\n{dirty}\nCommit them in the tree "
            "(`cd vllm && git commit -s`, one commit per patch), then export."
        )
    edited = materialize.wheel_edits(tree)
    if edited:
        problem = materialize.wheel_edits_problem(tree, edited)
        raise ForkError(f"refusing to export {base.name}: {problem}")
    refuse_if_changed_since_built(base, tree)
    names = series.write(base, tree, "base")
    materialize.record(tree, base)
    return names


def refuse_if_changed_since_built(base: Base, tree: Path) -> None:
    """Exporting a tree built before a pull would undo what the pull brought."""
    state = materialize.read_state(tree)
    if state.get("queue") == series.queue_id(base):
        return
    changes = changed_since_built(base, tree, state)
    if not changes:
        return
    listed = "\n  ".join(changes)
    raise ForkError(
        f"refusing to export {base.name}: since the {tree} tree was built, "
        f"these changed (a pull?):\n  {listed}\nExporting the tree would undo "
        f"them. {_how_to_catch_up(base, tree, state.get('head', 'base'))}"
    )


def _how_to_catch_up(base: Base, tree: Path, head: str) -> str:
    if git.out(tree, "rev-parse", "HEAD") == head:
        return (
            f"The tree has no commits of its own: run `make fork BASE={base.name}` "
            "to rebuild it with them."
        )
    mine = Path(tempfile.gettempdir()) / f"vllm-fork-{base.name}-{head[:12]}"
    return (
        "Carry your commits over to the new queue: "
        f"`git -C {tree} format-patch -o {mine} {head[:12]}..HEAD`, "
        f"`git -C {tree} reset --hard {head[:12]}`, `make fork BASE={base.name}`, "
        f"`git -C {tree} am --keep-non-patch {mine}/*.patch`, then `make export`."
    )


def changed_since_built(base: Base, tree: Path, state: dict) -> list[str]:
    """Each queue file and pin that differs from what ``tree`` was built with."""
    if "patches" not in state:
        return _changed_since_built_by_old_tooling(base, tree, state)
    now = series.digests(base)
    built = state["patches"]
    changes = [
        f"patches/{base.name}/{name} ({_change(built.get(name), now.get(name))})"
        for name in [*now, *(name for name in built if name not in now)]
        if built.get(name) != now.get(name)
    ]
    pinned = {artifact.file: artifact.sha256 for artifact in base.artifacts}
    changes += [
        f"upstream.toml: {file} ({_change(state['pins'].get(file), sha256)})"
        for file, sha256 in pinned.items()
        if state["pins"].get(file) != sha256
    ]
    return changes


def _change(before: str | None, after: str | None) -> str:
    if before is None:
        return "new"
    return "removed" if after is None else "changed"


def _changed_since_built_by_old_tooling(
    base: Base, tree: Path, state: dict
) -> list[str]:
    """The patches that a tree whose state names no files does not reproduce."""
    if state.get("queue") == series.patches_id(base):
        return []
    with tempfile.TemporaryDirectory() as tmp:
        built = {
            patch.name: sha256_of(patch)
            for patch in series.export_to(
                tree, "base", Path(tmp), state.get("head", "HEAD")
            )
        }
    now = series.digests(base)
    now.pop("series", None)
    changed = [name for name, sha256 in now.items() if built.get(name) != sha256]
    return [f"patches/{base.name}/{name}" for name in changed or ["series"]]
