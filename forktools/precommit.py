"""Upstream's own pre-commit checks on the files a queue touches.

What runs, and at which version, comes from the base's sdist: its
``.pre-commit-config.yaml`` (the hooks upstream CI runs, ``pre-commit run
--hook-stage manual``), its ``pyproject.toml`` (``[tool.ruff]``,
``[tool.typos]``, ``[tool.mypy]``) and its ``tools/pre_commit/mypy.py``, which
groups files into mypy runs. The tools come from PyPI at the pinned versions.

Only problems the queue adds count: typos and mypy also run on the pristine
release's versions of the same files, and a problem found there too (same
file, same message) is upstream's, not ours.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from forktools import download, git, materialize, tools
from forktools.pins import Base, ForkError

CONFIG = ".pre-commit-config.yaml"
MYPY_SCRIPT = "tools/pre_commit/mypy.py"
RUFF_REPO = "astral-sh/ruff-pre-commit"
TYPOS_REPO = "crate-ci/typos"
_VERSION = re.compile(r"\s*v?(\d+(?:\.\d+)+)\s*")
_MYPY_ERROR = re.compile(
    r"^(?P<path>[^:\s]+):(?P<line>\d+):(?:\d+:)? error: (?P<msg>.*)$"
)


@dataclass(frozen=True)
class Hooks:
    """The checks upstream CI runs on a pull request to one release."""

    ruff: str | None  # "ruff==0.14.0"
    typos: str | None
    typos_args: tuple[str, ...]
    mypy: tuple[str, ...]  # mypy's requirement, then the hook's other packages
    mypy_args: tuple[str, ...]  # MYPY_SCRIPT's arguments before the files
    exclude: str  # pre-commit's top-level exclude pattern
    mypy_script: Path | None


@dataclass(frozen=True)
class Problem:
    path: str
    line: int
    message: str

    @property
    def key(self) -> tuple[str, str]:
        return self.path, self.message

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def hooks(base: Base) -> Hooks:
    """The base's pre-commit hooks, read once from its sdist."""
    config_dir = _upstream_files(base)
    config = config_dir / CONFIG
    if not config.exists():
        return Hooks(None, None, (), (), (), "", None)
    text = config.read_text()
    data = _yaml(config_dir, text)
    typos_hook = _ci_hook(data, "typos") or {}
    mypy_hook = _ci_hook(data, "mypy") or {}
    script = config_dir / MYPY_SCRIPT
    return Hooks(
        ruff=_pinned("ruff", text, RUFF_REPO),
        typos=_pinned("typos", text, TYPOS_REPO),
        typos_args=tuple(typos_hook.get("args", ())),
        mypy=tuple(mypy_hook.get("additional_dependencies", ())),
        mypy_args=_script_args(mypy_hook),
        exclude=data.get("exclude") or "",
        mypy_script=script if mypy_hook and script.exists() else None,
    )


def _script_args(hook: dict) -> tuple[str, ...]:
    """What ``python tools/pre_commit/mypy.py …`` gets before the files."""
    entry = shlex.split(hook.get("entry", ""))
    return (*entry[2:], *hook.get("args", ()))


def _upstream_files(base: Base) -> Path:
    """A cache directory with the sdist's pre-commit config and mypy script."""
    path = download.cache_dir() / "precommit" / f"{base.name}-{base.sdist.sha256[:12]}"
    if (path / tools.COMPLETE).exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    with tarfile.open(download.fetch(base.sdist)) as archive:
        for member in archive:
            inner = member.name.partition("/")[2]
            if inner in (CONFIG, MYPY_SCRIPT) and member.isfile():
                (path / inner).parent.mkdir(parents=True, exist_ok=True)
                (path / inner).write_bytes(archive.extractfile(member).read())
    (path / tools.COMPLETE).touch()
    return path


def _yaml(cache: Path, text: str) -> dict:
    """The config as data, parsed by PyYAML from PyPI (anchors and merge keys
    included), cached beside it."""
    parsed = cache / (CONFIG + ".json")
    if not parsed.exists():
        program = (
            "import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)"
        )
        python = tools.python(tools.PYYAML)
        result = subprocess.run(
            [str(python), "-c", program], input=text, capture_output=True, text=True
        )
        if result.returncode != 0:
            raise ForkError(f"cannot read {cache / CONFIG}: {result.stderr.strip()}")
        parsed.write_text(result.stdout)
    return json.loads(parsed.read_text())


def _pinned(name: str, text: str, repo: str) -> str | None:
    """``name==version`` from the hook repository's ``rev``: a tag, or a frozen
    commit whose comment names the tag (``rev: <sha>  # frozen: v0.17.2``)."""
    match = re.search(
        rf"repo:\s*\S*{re.escape(repo)}\s*\n\s*rev:\s*(?P<rev>\S+)(?:\s*#(?P<note>.*))?",
        text,
    )
    if not match:
        return None
    rev, note = match["rev"], (match["note"] or "").replace("frozen:", "")
    version = _VERSION.fullmatch(rev) or _VERSION.search(note)
    if not version:
        raise ForkError(f"{CONFIG}: cannot tell the {repo} version from {match[0]!r}")
    return f"{name}=={version[1]}"


def _ci_hook(data: dict, prefix: str) -> dict | None:
    """The first hook named ``prefix``… that upstream CI runs (stage manual)."""
    default_stages = data.get("default_stages") or ["manual"]
    for repo in data.get("repos", ()):
        for hook in repo.get("hooks", ()):
            stages = hook.get("stages") or default_stages
            if hook.get("id", "").startswith(prefix) and "manual" in stages:
                return hook
    return None


def checked_files(hooks: Hooks, files: list[str]) -> list[str]:
    """What pre-commit hands its hooks: the files its exclude pattern leaves."""
    if not hooks.exclude:
        return files
    excluded = re.compile(hooks.exclude)
    return [name for name in files if not excluded.search(name)]


def typos(hooks: Hooks, tree: Path, files: list[str]) -> list[Problem]:
    """Upstream's spell check (typos, its ``[tool.typos]`` config) on ``files``."""
    if not files or not hooks.typos:
        return []
    command = [
        str(tools.installed(hooks.typos)),
        *hooks.typos_args,
        "--format",
        "json",
        *files,
    ]
    result = subprocess.run(command, cwd=tree, capture_output=True, text=True)
    if result.returncode not in (0, 2):
        raise ForkError(f"{' '.join(command)} in {tree} failed:\n{result.stderr}")
    found = []
    for line in result.stdout.splitlines():
        report = json.loads(line)
        if report.get("type") == "typo":
            fixes = ", ".join(report["corrections"]) or "no suggestion"
            found.append(
                Problem(
                    report["path"],
                    report["line_num"],
                    f"`{report['typo']}` should be {fixes}",
                )
            )
    return found


def mypy(hooks: Hooks, tree: Path, files: list[str], cache: Path) -> list[Problem]:
    """Upstream's mypy hook on ``files``: its own script, its mypy and stubs,
    its ``[tool.mypy]``, each mypy run with a cache of its own under ``cache``."""
    python_files = [name for name in files if name.endswith((".py", ".pyi"))]
    if not python_files or not hooks.mypy_script:
        return []
    [mypy_requirement] = [r for r in hooks.mypy if re.match(r"mypy\b", r)]
    packages = tuple(r for r in hooks.mypy if r != mypy_requirement)
    python = tools.python(mypy_requirement, packages)
    with tempfile.TemporaryDirectory() as shim_dir:
        shim = Path(shim_dir) / "mypy"
        shim.write_text(_MYPY_SHIM.format(python=python))
        shim.chmod(0o755)
        path = os.pathsep.join([shim_dir, str(python.parent), os.environ["PATH"]])
        env = {**os.environ, "PATH": path, "VLLM_FORK_MYPY_CACHE": str(cache)}
        command = [str(python), str(hooks.mypy_script), *hooks.mypy_args]
        result = subprocess.run(
            [*command, *python_files], cwd=tree, env=env, capture_output=True, text=True
        )
    found = [
        Problem(m["path"], int(m["line"]), m["msg"])
        for m in map(_MYPY_ERROR.match, result.stdout.splitlines())
        if m
    ]
    if result.returncode != 0 and not found:
        raise ForkError(
            f"{MYPY_SCRIPT} failed in {tree} without a mypy error:\n"
            f"{result.stdout}{result.stderr}"
        )
    return found


# Upstream's script runs one mypy per file group, with different options; a
# cache of their own keeps them from invalidating each other's.
_MYPY_SHIM = """\
#!{python}
import hashlib, os, sys
from mypy.__main__ import console_entry
options = " ".join(a for a in sys.argv[1:] if not a.endswith((".py", ".pyi")))
key = hashlib.sha256(options.encode()).hexdigest()[:12]
cache = os.path.join(os.environ["VLLM_FORK_MYPY_CACHE"], key)
sys.argv[1:1] = ["--cache-dir", cache]
console_entry()
"""


def new_problems(found: list[Problem], baseline: list[Problem]) -> list[Problem]:
    """``found`` less what the pristine files already had (by file and message,
    so that lines moved by the queue do not matter)."""
    known = Counter(problem.key for problem in baseline)
    fresh = []
    for problem in found:
        if known[problem.key]:
            known[problem.key] -= 1
        else:
            fresh.append(problem)
    return fresh


def not_configured(hooks: Hooks) -> list[str]:
    checks = {"ruff": hooks.ruff, "typos": hooks.typos, "mypy": hooks.mypy_script}
    return [name for name, configured in checks.items() if not configured]


def queue_problems(base: Base, tree: Path, files: list[str], hooks: Hooks) -> list[str]:
    """Every typos and mypy problem the queue adds to ``files`` of ``tree``."""
    found = [
        f"typos: {problem}"
        for problem in new_problems(
            typos(hooks, tree, files),
            typos(hooks, materialize.pristine(base), _in(base, files)),
        )
    ]
    found += [f"mypy: {problem}" for problem in _mypy_new(base, hooks, tree, files)]
    return found


def _in(base: Base, files: list[str]) -> list[str]:
    pristine = materialize.pristine(base)
    return [name for name in files if (pristine / name).is_file()]


def _mypy_new(base: Base, hooks: Hooks, tree: Path, files: list[str]) -> list[Problem]:
    """mypy runs in one scratch copy of the pristine release per base, the
    queue's files laid in for the queue's run: mypy's cache is keyed by path,
    so the pristine run, the queue's run and every clone share one."""
    if not hooks.mypy_script or not any(name.endswith(".py") for name in files):
        return []
    work = download.cache_dir() / "mypy" / f"{base.name}-{base.sdist.sha256[:12]}"
    work.mkdir(parents=True, exist_ok=True)
    with open(work / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        scratch = _scratch(base, work / "tree")
        baseline = _baseline(base, hooks, work, scratch, files)
        changed = git.out(tree, "diff", "--name-only", "--no-renames", "base", "HEAD")
        for name in changed.splitlines():
            _lay(tree / name, scratch / name)
        try:
            return new_problems(mypy(hooks, scratch, files, work / "cache"), baseline)
        finally:
            git.run(scratch, "reset", "--quiet", "--hard", "base")
            git.run(scratch, "clean", "--quiet", "-d", "--force")


def _scratch(base: Base, path: Path) -> Path:
    if not (path / ".git").exists():
        shutil.rmtree(path, ignore_errors=True)
        source = materialize.pristine(base)
        git.run(source, "clone", "--quiet", "--local", ".", str(path))
    return path


def _lay(source: Path, target: Path) -> None:
    target.unlink(missing_ok=True)
    if source.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


def _baseline(
    base: Base, hooks: Hooks, work: Path, scratch: Path, files: list[str]
) -> list[Problem]:
    """mypy's problems in the pristine versions of ``files``, cached per set."""
    pristine = [name for name in files if (scratch / name).is_file()]
    key = hashlib.sha256(
        json.dumps([hooks.mypy, hooks.mypy_args, sorted(pristine)]).encode()
    ).hexdigest()[:16]
    saved = work / "baseline" / f"{key}.json"
    if not saved.exists():
        found = mypy(hooks, scratch, pristine, work / "cache")
        saved.parent.mkdir(exist_ok=True)
        saved.write_text(json.dumps([vars(problem) for problem in found]))
    return [Problem(**item) for item in json.loads(saved.read_text())]
