"""The tooling's modules import one another without a circle."""

import ast
from pathlib import Path

FORKTOOLS = Path(__file__).resolve().parents[1]


def _name(path: Path) -> str:
    return ".".join(path.relative_to(FORKTOOLS.parent).with_suffix("").parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The forktools modules ``path`` imports, at its top or in a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        if node.module.startswith("forktools"):
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return (found & modules) - {_name(path)}


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
    paths = [
        path
        for path in FORKTOOLS.rglob("*.py")
        if path.name != "__init__.py" and "tests" not in path.parts
    ]
    modules = {_name(path) for path in paths}
    graph = {_name(path): _imports(path, modules) for path in paths}
    assert _circle(graph) == []


def test_a_circle_is_found():
    assert _circle({"check": {"rebase"}, "rebase": {"check"}}) == [
        "check",
        "rebase",
        "check",
    ]
