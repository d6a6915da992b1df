"""make verify HUNKS=1: each fix hunk reverted alone names the tests it needs."""

import sys
from pathlib import Path

from forktools import cli
from forktools.queue import export, materialize
from forktools.environments import venv
from forktools.proof import hunks

from forktools.tests.conftest import git

TEST = "def test_layer_3():\n    from vllm import core\n\n    assert core.layer_3() == 33\n"


def test_each_hunk_reverted_alone_names_the_tests_that_need_it(
    project, monkeypatch, capsys
):
    monkeypatch.setattr(venv, "ensure", lambda base: Path(sys.executable))
    monkeypatch.setattr(venv, "ensure_engine", lambda base: None)
    materialize.ensure(project.base)
    core = (project.tree / "vllm/core.py").read_text()
    core = core.replace("return 3\n", "return 33\n").replace("return 15\n", "return 1515\n")
    (project.tree / "vllm/core.py").write_text(core)
    (project.tree / "tests/test_layer_3.py").write_text(TEST)
    git(project.tree, "add", "-A")
    git(
        project.tree,
        "commit",
        "-q",
        "-s",
        "-m",
        "[Bugfix] Layers 3 and 15\n\nUpstream-Status: Pending [x]",
    )
    export.export(project.base)

    code = cli.main(["verify", "--base", project.base.name, "--hunks", "--patch", "1"])

    assert code == 1
    first, second = capsys.readouterr().out.splitlines()[1:]
    assert "vllm/core.py:11 (def layer_2():)" in first
    assert first.split()[-4:] == ["1/1:", "test_layer_3", "(AssertionError)", "yes"]
    assert "vllm/core.py:59 (def layer_14():)" in second
    assert second.split()[-6:] == ["none", "NO:", "no", "test", "needs", "it"]


def test_a_hunk_alone_is_a_diff_of_its_own():
    diff = (
        "diff --git a/vllm/a.py b/vllm/a.py\nindex 1..2 100644\n--- a/vllm/a.py\n"
        "+++ b/vllm/a.py\n@@ -1,2 +1,2 @@ def f():\n-x\n+y\n z\n"
        "@@ -9 +9 @@ class C:\n-p\n+q\n"
    )
    first, second = hunks.split(diff)
    assert first.where == "vllm/a.py:1 (def f():)"
    assert second.patch.startswith("diff --git a/vllm/a.py b/vllm/a.py\nindex 1..2")
    assert second.patch.endswith("@@ -9 +9 @@ class C:\n-p\n+q\n")
