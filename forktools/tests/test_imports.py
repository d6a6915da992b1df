"""The tooling's modules import one another without a circle."""

import ast
from pathlib import Path

FORKTOOLS = Path(__file__).resolve().parents[1]


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The forktools modules ``path`` imports, at its top or in a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        if node.module == "forktools":
            found |= {alias.name for alias in node.names}
        elif node.module.startswith("forktools."):
            found.add(node.module.split(".")[1])
    return (found & modules) - {path.stem}


def _circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph``, or []."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str]:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return []
        for imported in sorted(graph[module]):
            if circle := visit(imported, [*path, module]):
                return circle
        done.add(module)
        return []

    for module in sorted(graph):
        if circle := visit(module, []):
            return circle
    return []


def test_the_tooling_has_no_import_circle():
    paths = list(FORKTOOLS.glob("*.py"))
    modules = {path.stem for path in paths}
    graph = {path.stem: _imports(path, modules) for path in paths}
    assert _circle(graph) == []


def test_a_circle_is_found():
    assert _circle({"check": {"rebase"}, "rebase": {"check"}}) == [
        "check",
        "rebase",
        "check",
    ]
