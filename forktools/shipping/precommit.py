"""Upstream's own pre-commit checks on the files a queue touches.

What runs, and at which version, comes from the base's sdist: its
``.pre-commit-config.yaml`` (the hooks upstream CI runs, ``pre-commit run
--hook-stage manual``), its ``pyproject.toml`` (``[tool.ruff]``,
``[tool.typos]``, ``[tool.mypy]``), its ``tools/pre_commit/mypy.py``, which
groups files into mypy runs, and its other ``tools/pre_commit`` scripts. The
tools and the hooks' packages come from PyPI at the pinned versions.

Only problems the queue adds count: typos, mypy and the scripts also run on
the pristine release's versions of the same files, and a problem found there
too (same file, same message) is upstream's, not ours.
"""

from __future__ import annotations

import contextlib
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
from dataclasses import asdict, dataclass
from pathlib import Path

from forktools.environments import tools
from forktools.queue import download, git
from forktools.queue.pins import Base, ForkError

CONFIG = ".pre-commit-config.yaml"
MYPY_SCRIPT = "tools/pre_commit/mypy.py"
RUFF_REPO = "astral-sh/ruff-pre-commit"
TYPOS_REPO = "crate-ci/typos"
_VERSION = re.compile(r"\s*v?(\d+(?:\.\d+)+)\s*")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LOCATED = re.compile(r"^(?P<path>[^:\s]+):(?P<line>\d+):(?:\d+:)?\s*(?P<msg>.*)$")
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
    local: tuple[LocalHook, ...] = ()


@dataclass(frozen=True)
class LocalHook:
    """One of upstream's own ``python tools/…`` hooks (``language: python``)."""

    id: str
    command: tuple[str, ...]  # the entry after ``python``, then the hook's args
    packages: tuple[str, ...]  # its additional_dependencies
    files: str  # pre-commit's include and exclude patterns, "" for any
    exclude: str
    types: tuple[str, ...]  # every one of these tags, and one of types_or
    types_or: tuple[str, ...]
    pass_filenames: bool
    always_run: bool


@dataclass(frozen=True)
class Problem:
    path: str
    line: int
    message: str

    @property
    def key(self) -> tuple[str, str]:
        return self.path, self.message

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}" if self.path else self.message


def hooks(base: Base) -> Hooks:
    """The base's pre-commit hooks, as its sdist configures them."""
    work = _work_dir(base)
    return hooks_in(_sdist_checkout(base, work / "sdist"), work)


def hooks_in(checkout: Path, work: Path) -> Hooks:
    """The pre-commit hooks ``checkout`` configures; ``work`` keeps the
    parsed configuration."""
    config = checkout / CONFIG
    if not config.exists():
        return Hooks(None, None, (), (), (), "", None)
    text = config.read_text()
    data = _yaml(text, work / "config.json")
    typos_hook = _ci_hook(data, "typos") or {}
    mypy_hook = _ci_hook(data, "mypy") or {}
    script = checkout / MYPY_SCRIPT
    return Hooks(
        ruff=_pinned("ruff", text, RUFF_REPO),
        typos=_pinned("typos", text, TYPOS_REPO),
        typos_args=tuple(typos_hook.get("args", ())),
        mypy=tuple(mypy_hook.get("additional_dependencies", ())),
        mypy_args=_script_args(mypy_hook),
        exclude=data.get("exclude") or "",
        mypy_script=script if mypy_hook and script.exists() else None,
        local=tuple(_local_hooks(data)),
    )


def _local_hooks(data: dict) -> list[LocalHook]:
    """The CI hooks that run one of upstream's Python scripts, but mypy."""
    found = []
    for hook in _ci_hooks(data):
        entry = shlex.split(hook.get("entry", ""))
        if hook.get("language") != "python" or entry[:1] != ["python"]:
            continue
        if hook["id"].startswith("mypy"):
            continue
        found.append(
            LocalHook(
                id=hook["id"],
                command=(*entry[1:], *hook.get("args", ())),
                packages=tuple(hook.get("additional_dependencies", ())),
                files=hook.get("files", ""),
                exclude=hook.get("exclude", ""),
                types=tuple(hook.get("types", ("file",))),
                types_or=tuple(hook.get("types_or", ())),
                pass_filenames=hook.get("pass_filenames", True),
                always_run=hook.get("always_run", False),
            )
        )
    return found


def _script_args(hook: dict) -> tuple[str, ...]:
    """What ``python tools/pre_commit/mypy.py …`` gets before the files."""
    entry = shlex.split(hook.get("entry", ""))
    return (*entry[2:], *hook.get("args", ()))


def _work_dir(base: Base) -> Path:
    """Where a base's upstream checks keep their sdist checkout and caches."""
    path = download.cache_dir() / "upstream-checks" / _key(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _key(base: Base) -> str:
    return f"{base.name}-{base.sdist.sha256[:12]}"


def _yaml(text: str, parsed: Path) -> dict:
    """The config as data, parsed by PyYAML from PyPI (anchors and merge keys
    included), kept in ``parsed``."""
    if not parsed.exists():
        program = (
            "import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)"
        )
        python = tools.python(tools.PYYAML)
        result = subprocess.run(
            [str(python), "-c", program], input=text, capture_output=True, text=True
        )
        if result.returncode != 0:
            raise ForkError(f"cannot read upstream's {CONFIG}: {result.stderr.strip()}")
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


def _ci_hooks(data: dict) -> list[dict]:
    """The hooks upstream CI runs (``--hook-stage manual``), in order."""
    default_stages = data.get("default_stages") or ["manual"]
    return [
        hook
        for repo in data.get("repos", ())
        for hook in repo.get("hooks", ())
        if "manual" in (hook.get("stages") or default_stages)
    ]


def _ci_hook(data: dict, prefix: str) -> dict | None:
    """The first CI hook whose id starts with ``prefix``."""
    return next(
        (hook for hook in _ci_hooks(data) if hook["id"].startswith(prefix)), None
    )


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


def run_local(hook: LocalHook, tree: Path, files: list[str]) -> list[Problem]:
    """One of upstream's hook scripts, as pre-commit runs it on ``files``:
    the lines it prints when it fails, one problem each."""
    matching = [name for name in files if _matches(hook, name)]
    if not matching and not hook.always_run:
        return []
    python = tools.python("", hook.packages)
    passed = matching if hook.pass_filenames else []
    command = [str(python), *hook.command, *passed]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if result.returncode == 0:
        return []
    output = _ANSI.sub("", result.stdout + result.stderr)
    return [_problem(line) for line in output.splitlines() if line.strip()]


def _matches(hook: LocalHook, name: str) -> bool:
    tags = _tags(name)
    return (
        re.search(hook.files, name) is not None
        and not (hook.exclude and re.search(hook.exclude, name))
        and set(hook.types) <= tags
        and (not hook.types_or or bool(tags & set(hook.types_or)))
    )


def _tags(name: str) -> set[str]:
    """pre-commit's file type tags, for the kinds of files a queue holds."""
    suffix = Path(name).suffix
    kinds = {".py": "python", ".pyi": "pyi", ".md": "markdown", ".txt": "text"}
    kinds |= {".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json"}
    return {"file", "text", kinds.get(suffix, "")} - {""}


def _problem(line: str) -> Problem:
    if match := _LOCATED.match(line):
        return Problem(match["path"], int(match["line"]), match["msg"])
    return Problem("", 0, line.strip())


def mypy_requirements(hooks: Hooks) -> list[str]:
    """mypy's requirement, then the packages the hook installs beside it."""
    [mypy_requirement] = [r for r in hooks.mypy if re.match(r"mypy\b", r)]
    return [mypy_requirement, *(r for r in hooks.mypy if r != mypy_requirement)]


def mypy(hooks: Hooks, tree: Path, files: list[str], cache: Path) -> list[Problem]:
    """Upstream's mypy hook on ``files``: its own script, its mypy and stubs,
    its ``[tool.mypy]``, each mypy run with a cache of its own under ``cache``."""
    python_files = [name for name in files if name.endswith((".py", ".pyi"))]
    if not python_files or not hooks.mypy_script:
        return []
    mypy_requirement, *packages = mypy_requirements(hooks)
    python = tools.python(mypy_requirement, tuple(packages))
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
    """Every problem typos, mypy and upstream's own hook scripts find in
    ``files`` of ``tree`` that they do not find in the pristine release.

    All run in one checkout of the whole sdist per base (the scripts read
    files beside them, such as ``.buildkite/``), first pristine, then with
    the queue's files laid in; mypy's cache is keyed by path, so both runs
    and every clone share one."""
    work = _work_dir(base)
    with open(work / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        scratch = _sdist_checkout(base, work / "sdist")
        _restore(scratch)
        present = [name for name in files if (scratch / name).is_file()]
        before = _baseline(hooks, scratch, present, work)
        for name in _changed(tree):
            _lay(tree / name, scratch / name)
        try:
            after = _checks(hooks, scratch, files, work)
        finally:
            _restore(scratch)
    return [
        f"{check}: {problem}"
        for check, found in after.items()
        for problem in new_problems(found, before.get(check, []))
    ]


def commit_problems(
    scratch: Path, before: str, after: str, files: list[str], work: Path
) -> tuple[Hooks, list[str]]:
    """What the checks ``after`` configures (typos, mypy, the hook scripts)
    find in ``files`` at commit ``after`` of the git checkout ``scratch``
    that they do not find at ``before``; the checkout is left at ``after``."""
    listed = git.out(scratch, "ls-tree", "-r", "--name-only", before, "--", *files)
    present = set(listed.splitlines())
    git.run(scratch, "checkout", "--quiet", "--force", "--detach", after)
    found_hooks = hooks_in(scratch, work)
    files = checked_files(found_hooks, files)
    git.run(scratch, "checkout", "--quiet", "--force", "--detach", before)
    baseline = _checks(found_hooks, scratch, [f for f in present if f in files], work)
    git.run(scratch, "checkout", "--quiet", "--force", "--detach", after)
    after_found = _checks(found_hooks, scratch, files, work)
    return found_hooks, [
        f"{check}: {problem}"
        for check, found in after_found.items()
        for problem in new_problems(found, baseline.get(check, []))
    ]


def _checks(
    hooks: Hooks, scratch: Path, files: list[str], work: Path
) -> dict[str, list[Problem]]:
    found = {
        "typos": typos(hooks, scratch, files),
        "mypy": mypy(hooks, scratch, files, work / "mypy-cache"),
    }
    for hook in hooks.local:
        found[hook.id] = run_local(hook, scratch, files)
    return found


def _baseline(
    hooks: Hooks, scratch: Path, files: list[str], work: Path
) -> dict[str, list[Problem]]:
    """The checks' problems in the pristine ``files``, cached per set of
    files: the release does not change, and a cold mypy run takes minutes."""
    key = json.dumps([asdict(hooks), sorted(files)], default=str)
    saved = work / "baseline" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if not saved.exists():
        found = _checks(hooks, scratch, files, work)
        saved.parent.mkdir(exist_ok=True)
        data = {
            check: [asdict(p) for p in problems] for check, problems in found.items()
        }
        saved.write_text(json.dumps(data, indent=1) + "\n")
    data = json.loads(saved.read_text())
    return {check: [Problem(**item) for item in items] for check, items in data.items()}


def _changed(tree: Path) -> list[str]:
    """Every path the tree's queue adds, changes or removes."""
    names = git.out(tree, "diff", "--name-only", "--no-renames", "base", "HEAD")
    return names.splitlines()


def _sdist_checkout(base: Base, path: Path) -> Path:
    """The whole sdist, committed and tagged ``base``; made once per base."""
    if (path / ".git").exists():
        return path
    staging = Path(tempfile.mkdtemp(prefix=".sdist.", dir=path.parent))
    try:
        with tarfile.open(download.fetch(base.sdist)) as archive:
            members = []
            for member in archive.getmembers():
                member.name = member.name.partition("/")[2]
                if member.name:
                    members.append(member)
            safety = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            archive.extractall(staging, members=members, **safety)
        git.run(staging, "init", "--quiet")
        git.run(staging, "add", "--all", "--force")
        date = {"GIT_AUTHOR_DATE": git.BASE_DATE, "GIT_COMMITTER_DATE": git.BASE_DATE}
        message = f"{base.sdist.file}, as published"
        git.run(staging, "commit", "--quiet", "--no-verify", "-m", message, env=date)
        git.run(staging, "tag", "base")
        with contextlib.suppress(OSError):  # another process was first
            staging.rename(path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def _restore(scratch: Path) -> None:
    git.run(scratch, "reset", "--quiet", "--hard", "base")
    git.run(scratch, "clean", "--quiet", "-d", "--force")


def _lay(source: Path, target: Path) -> None:
    target.unlink(missing_ok=True)
    if source.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


def tool_environments(bases: list[Base]) -> dict[str, tuple[list[str], bool]]:
    """The tool environments each base's upstream lint hooks install, for
    ``make lock``: by name, their requirements, and False (an environment,
    not a ``--target`` folder)."""
    found = {}
    for base in bases:
        hooks_of_base = hooks(base)
        for tool in filter(None, (hooks_of_base.ruff, hooks_of_base.typos)):
            found[tools.environment_name(tool)] = ([tool], False)
        if hooks_of_base.mypy:
            mypy, *packages = mypy_requirements(hooks_of_base)
            found[tools.environment_name(mypy, tuple(packages))] = (
                [mypy, *packages],
                False,
            )
        for hook in hooks_of_base.local:
            if hook.packages:
                found[tools.environment_name("", hook.packages)] = (
                    list(hook.packages),
                    False,
                )
    return found
