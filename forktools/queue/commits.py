"""What a commit of a fork tree changes, read from git: the tests it adds
or changes, the sources it changes, and the git trees of the queue with a
fix undone or a diff applied (made in a scratch index, no work tree
touched)."""

from __future__ import annotations

import ast
import os
import re
import tempfile
from pathlib import Path

from forktools.queue import git, series
from forktools.queue.pins import Base, ForkError

_HUNK = re.compile(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", re.MULTILINE)


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def added_tests(tree: Path, commit: str) -> list[str]:
    """Node ids of the tests ``commit`` adds or changes: test functions,
    ``async`` ones included, and test methods of ``Test*`` classes, whose
    lines (decorators included) the commit touches, in file order."""
    nodeids = []
    for path in _changed(tree, commit, "tests"):
        if not Path(path).name.startswith("test_") or not path.endswith(".py"):
            continue
        source = git.run(tree, "show", f"{commit}:{path}", check=False).stdout
        touched = _touched_lines(tree, commit, path)
        nodeids += [
            f"{path}::{name}"
            for name, lines in _test_spans(source)
            if touched.intersection(lines)
        ]
    return nodeids


def _touched_lines(tree: Path, commit: str, path: str) -> set[int]:
    """Lines of ``path`` at ``commit`` that it adds or changes; a deletion
    counts for the two lines around it."""
    diff = git.out(tree, "diff", "--unified=0", f"{commit}^", commit, "--", path)
    touched: set[int] = set()
    for start, count in _HUNK.findall(diff):
        first, length = int(start), int(count or 1)
        touched.update(range(first, first + length) if length else (first, first + 1))
    return touched


def _test_spans(source: str) -> list[tuple[str, range]]:
    """Each test of a module and the lines it spans: ``name`` of a function,
    ``Class::name`` of a method of a test class."""
    try:
        module = ast.parse(source)
    except SyntaxError:
        return []
    spans = []
    for node in module.body:
        if isinstance(node, _FUNCTIONS) and node.name.startswith("test"):
            spans.append((node.name, _span(node)))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            spans += [
                (f"{node.name}::{method.name}", _span(method))
                for method in node.body
                if isinstance(method, _FUNCTIONS) and method.name.startswith("test")
            ]
    return spans


def _span(node: ast.FunctionDef | ast.AsyncFunctionDef) -> range:
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return range(first, (node.end_lineno or node.lineno) + 1)


def _changed(tree: Path, commit: str, *pathspec: str) -> list[str]:
    names = git.out(tree, "diff", "--name-only", f"{commit}^", commit, "--", *pathspec)
    return names.splitlines()


def changed_sources(tree: Path, commit: str) -> list[str]:
    """The files other than tests that ``commit`` changes."""
    return [p for p in _changed(tree, commit) if not p.startswith("tests/")]


def without_fix_diff(base: Base, patch: str) -> Path:
    """Where a test-only patch keeps the diff that puts its bug back."""
    return base.patch_dir / "verify" / f"{patch}.without-fix.diff"


def tree_with_fix(tree: Path) -> str:
    """The git tree id of the whole queue: what every row's tests pass on."""
    return git.out(tree, "rev-parse", "HEAD^{tree}")


def tree_without_fix(
    base: Base, entry: series.Entry, tree: Path, commit: str
) -> tuple[str, str]:
    """The git tree id of the whole queue with ``commit``'s fix undone (its
    source hunks reverted, or its without-fix diff applied), and how it was
    undone. Made in a scratch index: no work tree is touched."""
    bug = without_fix_diff(base, entry.name)
    named = f"patches/{base.name}/verify/{bug.name}"
    if bug.exists():
        diff, reverse, how = bug.read_text(), False, f"applied {named}"
    else:
        sources = changed_sources(tree, commit)
        if not sources:
            raise ForkError(
                f"patches/{base.name}/{entry.name} changes only tests; add "
                f"{named} that puts the bug back, so verify can "
                "show the tests fail without the fix"
            )
        diff = git.run(tree, "diff", f"{commit}^", commit, "--", *sources).stdout
        reverse, how = True, f"reverted {', '.join(sources)}"
    try:
        return tree_with_diff(tree, "HEAD", diff, reverse), how
    except ForkError as error:
        raise ForkError(
            f"patches/{base.name}/{entry.name}: {how.split(' ')[0]} "
            f"{how.split(' ', 1)[1]} does not apply on the whole queue: "
            f"{error}; update it, then run verify again"
        ) from None


def tree_with_diff(tree: Path, start: str, diff: str, reverse: bool = False) -> str:
    """The git tree id of revision ``start`` with ``diff`` applied (or
    reverted), made in a scratch index: no work tree is touched. Raises
    ForkError with git's reason when the diff does not apply."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        git.run(tree, "read-tree", start, env=env)
        if diff:
            direction = ["--reverse"] if reverse else []
            applied = git.run(
                tree, "apply", "--cached", *direction, check=False, env=env, input=diff
            )
            if applied.returncode != 0:
                raise ForkError(applied.stderr.strip())
        return git.run(tree, "write-tree", env=env).stdout.strip()
