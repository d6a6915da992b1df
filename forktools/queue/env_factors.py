"""The environment half of the compile cache key on each base: which of
vLLM's variables ``envs.compile_factors()`` hashes, read from the fork
tree's ``vllm/envs.py`` without importing it.

A variable a newer base leaves out of the key while an older queue still
hashes it is a false miss on the older base that upstream has since fixed:
``make check`` names each, so that a rebase finds the next one.
"""

from __future__ import annotations

import ast
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from forktools.queue import pins
from forktools.queue.pins import Base, ForkError

ENVS = Path("vllm") / "envs.py"


@dataclass(frozen=True)
class Factors:
    declared: frozenset[str]  # the keys of envs.environment_variables
    ignored: frozenset[str]  # compile_factors()'s ignored_factors

    @property
    def hashed(self) -> frozenset[str]:
        return self.declared - self.ignored


def read(envs_py: Path) -> Factors:
    """The declared and ignored variables of one ``vllm/envs.py``."""
    module = ast.parse(envs_py.read_text(), filename=str(envs_py))
    declared = _string_keys(_assigned(module, "environment_variables"), envs_py)
    function = next(
        (
            node
            for node in module.body
            if isinstance(node, ast.FunctionDef) and node.name == "compile_factors"
        ),
        None,
    )
    if function is None:
        raise ForkError(f"{envs_py}: no compile_factors() to read the key from")
    ignored = _string_items(_assigned(function, "ignored_factors"), envs_py)
    return Factors(frozenset(declared), frozenset(ignored))


def _assigned(scope: ast.AST, name: str) -> ast.expr | None:
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node.value
    return None


def _string_keys(value: ast.expr | None, where: Path) -> list[str]:
    if not isinstance(value, ast.Dict):
        raise ForkError(f"{where}: environment_variables is not a dict literal")
    return [k.value for k in value.keys if isinstance(k, ast.Constant)]


def _string_items(value: ast.expr | None, where: Path) -> list[str]:
    if isinstance(value, ast.Dict) and not value.keys:
        return []  # ``{}``: nothing ignored
    if not isinstance(value, ast.Set | ast.List | ast.Tuple):
        raise ForkError(
            f"{where}: compile_factors()'s ignored_factors is not a literal"
        )
    return [e.value for e in value.elts if isinstance(e, ast.Constant)]


def hashed_but_ignored_later(
    trees: dict[Base, Path], checked: Collection[Base]
) -> list[str]:
    """For each base of ``checked``, the variables its key hashes that a
    newer base of ``trees`` leaves out, by the first newer base that does."""
    # A tree without vllm/envs.py (a made-up base) has no key to compare.
    having = [base for base in trees if (trees[base] / ENVS).exists()]
    ordered = sorted(having, key=lambda base: pins.version_key(base.version))
    factors = {base: read(trees[base] / ENVS) for base in ordered}
    found = []
    for at, older in enumerate(ordered):
        if older not in checked:
            continue
        left_in = set(factors[older].hashed)
        for newer in ordered[at + 1 :]:
            ignored_there = sorted(left_in & factors[newer].ignored)
            left_in -= factors[newer].ignored
            if ignored_there:
                found.append(
                    f"{older.name}: the compile key hashes "
                    f"{', '.join(ignored_there)}, which {newer.name} leaves out "
                    f"of it (compile_factors() in {ENVS}): a false miss; "
                    f"backport the change that ignores it to {older.name}'s queue"
                )
    return found
