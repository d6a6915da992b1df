"""Upstream's pre-commit checks, read from the sdist, with stand-in tools."""

import sys
from pathlib import Path

import pytest

from forktools.queue import export, materialize
from forktools.shipping import lint, precommit
from forktools.environments import tools

from forktools.tests.conftest import CORE, SDIST_FILES, VERSION, _sdist, git

# As v0.19.1's: a frozen ruff rev, a mypy hook for local runs before the CI
# one, YAML anchors and merge keys.
CONFIG = """\
default_stages:
  - pre-commit
  - manual
exclude: 'vllm/third_party/.*'
repos:
- repo: https://github.com/astral-sh/ruff-pre-commit
  rev: f368fb366ff7f2f808dd324b83a6d32267799e19  # frozen: v0.17.2
  hooks:
  - id: ruff-check
- repo: https://github.com/crate-ci/typos
  rev: v1.43.5
  hooks:
  - id: typos
    args: [--force-exclude]
- repo: local
  hooks:
  - id: mypy-local
    entry: python tools/pre_commit/mypy.py 0 "3.10"
    stages: [pre-commit]
    <<: &mypy_common
      language: python
      additional_dependencies: ["mypy[faster-cache]==1.19.1", regex]
  - id: mypy-3.10
    entry: python tools/pre_commit/mypy.py 1 "3.10"
    <<: *mypy_common
    stages: [manual]
  - id: check-forbidden-imports
    entry: python tools/pre_commit/check_forbidden_imports.py
    language: python
    types: [python]
    additional_dependencies: [regex]
  - id: png-lint
    entry: tools/pre_commit/png-lint.sh
    language: script
"""
# Stands in for upstream's tools/pre_commit/mypy.py and the mypy it runs:
# "# type-error: <message>" in a file is an error on that line.
FAKE_MYPY_SCRIPT = """\
import sys
files = [name for name in sys.argv[1:] if name.endswith(".py")]
print("$ mypy", *sys.argv[1:3])
found = 0
for name in files:
    for number, line in enumerate(open(name), 1):
        if "# type-error:" in line:
            found += 1
            message = line.split("# type-error:")[1].strip()
            print(f"{name}:{number}: error: {message}  [misc]")
sys.exit(1 if found else 0)
"""
# Stands in for typos: its JSON lines for two known misspellings.
FAKE_TYPOS = """\
#!{python}
import json, sys
words = {{"teh": "the", "recieve": "receive"}}
found = 0
for name in [arg for arg in sys.argv[1:] if not arg.startswith("-")][1:]:
    for number, line in enumerate(open(name), 1):
        for word in line.replace("#", " ").split():
            if word in words:
                found += 1
                report = dict(type="typo", path=name, line_num=number,
                              byte_offset=0, typo=word, corrections=[words[word]])
                print(json.dumps(report))
sys.exit(2 if found else 0)
"""
# Stands in for one of upstream's own hook scripts; like them it reads a file
# beside it in the sdist.
FAKE_FORBIDDEN_IMPORTS = """\
import pathlib, sys
allowed = pathlib.Path(__file__).with_name("allowed.txt").read_text().split()
found = 0
for name in sys.argv[1:]:
    for number, line in enumerate(open(name), 1):
        if line.startswith("import ") and line.split()[1] not in allowed:
            found += 1
            red = "\\x1b[91merror:\\x1b[0m"
            print(f"{name}:{number}: {red} forbidden {line.split()[1]}")
sys.exit(1 if found else 0)
"""
PRISTINE_CORE = (
    "# teh first layer\nimport pickle\nX = 1  # type-error: old problem\n" + CORE
)


@pytest.fixture
def upstream(project, monkeypatch, tmp_path):
    """The miniature release with upstream's config, and stand-in tools."""
    pytest.importorskip("yaml")
    files = {
        **SDIST_FILES,
        "vllm/core.py": PRISTINE_CORE,
        ".pre-commit-config.yaml": CONFIG,
        "tools/pre_commit/mypy.py": FAKE_MYPY_SCRIPT,
        "tools/pre_commit/check_forbidden_imports.py": FAKE_FORBIDDEN_IMPORTS,
        "tools/pre_commit/allowed.txt": "os\n",
    }
    _sdist(project.sdist, VERSION, files)
    project.pin()
    typos = tmp_path / "typos"
    typos.write_text(FAKE_TYPOS.format(python=sys.executable))
    typos.chmod(0o755)
    monkeypatch.setattr(tools, "installed", lambda requirement, *_: typos)
    monkeypatch.setattr(tools, "python", lambda *_: Path(sys.executable))
    return project


def _queue(project, core: str, new: str = "") -> list[str]:
    """One patch that makes vllm/core.py ``core`` (and vllm/new.py ``new``);
    the touched files."""
    materialize.ensure(project.base)
    touched = ["vllm/core.py"] + ["vllm/new.py"] * bool(new)
    if new:
        (project.tree / "vllm/new.py").write_text(new)
        git(project.tree, "add", "vllm/new.py")
    message = "[Bugfix][Core] Fix\n\nUpstream-Status: Pending [issue 1]"
    project.commit("vllm/core.py", core, message)
    export.export(project.base)
    return touched


def test_hooks_come_from_the_sdist_config(upstream):
    hooks = precommit.hooks(upstream.base)
    assert hooks.ruff == "ruff==0.17.2"  # a frozen rev's tag comment
    assert hooks.typos == "typos==1.43.5"
    assert hooks.typos_args == ("--force-exclude",)
    # the hook upstream CI runs (stage manual), with the anchor's packages
    assert hooks.mypy == ("mypy[faster-cache]==1.19.1", "regex")
    assert hooks.mypy_args == ("1", "3.10")
    assert hooks.mypy_script.read_text() == FAKE_MYPY_SCRIPT
    # upstream's own Python hook scripts, not shell ones
    [local] = hooks.local
    assert (local.id, local.packages) == ("check-forbidden-imports", ("regex",))
    assert local.command == ("tools/pre_commit/check_forbidden_imports.py",)
    assert precommit._matches(local, "vllm/a.py")
    assert not precommit._matches(local, "docs/a.md")
    assert precommit.checked_files(hooks, ["vllm/third_party/x.py", "vllm/a.py"]) == [
        "vllm/a.py"
    ]


def test_a_new_misspelling_is_reported_and_an_old_one_is_not(upstream):
    # the queue moves upstream's "teh" two lines down and adds "recieve"
    core = "# new\n# lines\n" + PRISTINE_CORE + "# recieve the layer\n"
    files = _queue(upstream, core)
    hooks = precommit.hooks(upstream.base)
    found = precommit.queue_problems(upstream.base, upstream.tree, files, hooks)
    last = len(core.splitlines())
    assert found == [f"typos: vllm/core.py:{last}: `recieve` should be receive"]


def test_a_new_mypy_error_is_reported_and_an_old_one_is_not(upstream):
    core = PRISTINE_CORE.replace("X = 1", "Y = 2  # type-error: new problem\nX = 1")
    files = _queue(upstream, core)
    hooks = precommit.hooks(upstream.base)
    found = precommit.queue_problems(upstream.base, upstream.tree, files, hooks)
    assert found == ["mypy: vllm/core.py:3: new problem  [misc]"]
    [work] = (upstream.root.parent / "cache" / "upstream-checks").iterdir()
    # the queue's files are laid in a checkout of the sdist, then taken back
    assert (work / "sdist" / "vllm/core.py").read_text() == PRISTINE_CORE
    assert git(work / "sdist", "status", "--porcelain") == ""


def test_upstream_hook_scripts_report_only_what_the_queue_adds(upstream):
    # upstream's core.py imports pickle itself; the queue's new file does too
    files = _queue(upstream, PRISTINE_CORE, new="import os\nimport pickle\n")
    hooks = precommit.hooks(upstream.base)
    found = precommit.queue_problems(upstream.base, upstream.tree, files, hooks)
    assert found == ["check-forbidden-imports: vllm/new.py:2: error: forbidden pickle"]


def test_baseline_matches_by_file_and_message_not_line():
    old = precommit.Problem("a.py", 3, "bad")
    moved, new = precommit.Problem("a.py", 9, "bad"), precommit.Problem("a.py", 4, "x")
    twice = precommit.Problem("a.py", 12, "bad")
    assert precommit.new_problems([moved, new, twice], [old]) == [new, twice]


def test_lint_runs_ruff_at_the_version_the_base_pins(upstream, monkeypatch):
    _queue(upstream, PRISTINE_CORE + "Z = 3\n")
    runs = []
    monkeypatch.setattr(lint, "_ruff", lambda *args: runs.append(args) or [])
    assert lint.queue_problems(upstream.base) == []
    [(cwd, config, files, version)] = runs
    assert (cwd, files, version) == (upstream.tree, ["vllm/core.py"], "ruff==0.17.2")


def test_release_without_config_runs_no_upstream_check(project, capsys, monkeypatch):
    hooks = precommit.hooks(project.base)
    assert precommit.not_configured(hooks) == ["ruff", "typos", "mypy"]
    monkeypatch.setattr(lint, "our_code", lambda: [])
    materialize.ensure(project.base)
    assert lint.main([project.base]) == 0
    out = capsys.readouterr().out
    assert f"lint: {project.base.name}: mypy not run: {lint.NOT_CONFIGURED}" in out


def test_typos_json_lines_are_problems(upstream, tmp_path):
    hooks = precommit.hooks(upstream.base)
    (tmp_path / "a.py").write_text("ok\n# teh\n")
    [problem] = precommit.typos(hooks, tmp_path, ["a.py"])
    assert str(problem) == "a.py:2: `teh` should be the"
