"""``make lint``: our code under our ruff settings, each queue under its base's.

Every file a queue touches must pass the checks upstream's pre-commit runs on
a pull request to that release, as its sdist configures them (ruff, typos,
mypy, upstream's hook scripts; see `forktools.shipping.precommit`); every patch needs a
vLLM-style subject and a Signed-off-by line, and new Python files an SPDX
header.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from forktools.environments import tools
from forktools.queue import git, materialize, series, upstream
from forktools.queue.pins import ROOT, Base
from forktools.shipping import precommit

SUBJECT = re.compile(r"^(\[[A-Za-z][\w./ -]*\])+ \S")
SPDX = "# SPDX-License-Identifier:"
OUR_CODE = ["forktools", "setup.py"]
NOT_CONFIGURED = "the release's .pre-commit-config.yaml has no such CI hook"


def _ruff(cwd: Path, config: Path, files: list[str], version: str) -> list[str]:
    found = []
    for args in (["check"], ["format", "--check"]):
        ruff = tools.installed(version)
        command = [str(ruff), *args, "--config", str(config), *files]
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
        if result.returncode != 0:
            found.append(
                f"ruff {' '.join(args)} in {cwd}:\n{result.stdout}{result.stderr}"
            )
    return found


def our_code() -> list[str]:
    return _ruff(ROOT, ROOT / "pyproject.toml", OUR_CODE, tools.RUFF) + layering()


def layering(root: Path = ROOT) -> list[str]:
    """import-linter's contracts in ``root``'s pyproject.toml: each package
    of forktools/ imports only those below it, the proof only through its
    ``__init__`` (docs/layout.md)."""
    lint_imports = tools.installed(tools.IMPORT_LINTER).with_name("lint-imports")
    result = subprocess.run(
        [str(lint_imports), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
    )
    if result.returncode == 0:
        return []
    broken = result.stdout.partition("Broken contracts")[2].strip("-\n ")
    return [f"import-linter in {root} (docs/layout.md):\n{broken or result.stdout}"]


def queue_problems(base: Base) -> list[str]:
    tree = materialize.ensure(base)
    touched = git.out(tree, "diff", "--name-only", "--diff-filter=d", "base", "HEAD")
    hooks = precommit.hooks(base)
    files = precommit.checked_files(hooks, touched.splitlines())
    python = [name for name in files if name.endswith(".py")]
    found = []
    if python and hooks.ruff:
        found += _ruff(tree, tree / "pyproject.toml", python, hooks.ruff)
    found += [
        f"{base.name}: {problem}"
        for problem in precommit.queue_problems(base, tree, files, hooks)
    ]
    for entry in series.entries(base):
        found += [
            f"patches/{base.name}/{entry.name}: {p}"
            for p in patch_problems(base.patch_dir / entry.name, entry.subject(base))
        ]
    return found


def patch_problems(patch: Path, subject: str) -> list[str]:
    text = patch.read_text()
    found = []
    if not SUBJECT.match(subject):
        found.append(
            f"subject {subject!r} is not vLLM style ('[Bugfix][Area] Summary')"
        )
    message = upstream.message_of(text)
    if not re.search(r"^Signed-off-by: .+ <.+@.+>$", message, re.MULTILINE):
        found.append("no Signed-off-by: line (DCO); commit with `git commit -s`")
    try:
        upstream.read(message)
    except upstream.StatusError as e:
        found.append(str(e))
    for path, body in _new_files(text):
        if path.endswith(".py") and SPDX not in "".join(body[:3]):
            found.append(f"new file {path} lacks the SPDX header")
    return found


def _new_files(text: str) -> list[tuple[str, list[str]]]:
    files = []
    for block in text.split("\ndiff --git ")[1:]:
        if "\nnew file mode" in block.split("@@", 1)[0]:
            path = block.split(" b/", 1)[1].split("\n", 1)[0]
            added = [line[1:] for line in block.splitlines() if line.startswith("+")]
            files.append((path, added[1:]))
    return files


def main(bases: list[Base]) -> int:
    found = our_code()
    for base in bases:
        for check in precommit.not_configured(precommit.hooks(base)):
            print(f"lint: {base.name}: {check} not run: {NOT_CONFIGURED}")
        found += queue_problems(base)
    for problem in found:
        print(f"lint: {problem}", file=sys.stderr)
    if not found:
        print("lint: clean")
    return 1 if found else 0
