"""The pristine tree of a base is built once and shared by every clone."""

import shutil

from forktools import git, materialize


def test_second_tree_reuses_the_pristine_tree(project, monkeypatch):
    first = materialize.build(project.base)
    head = git.out(first, "rev-parse", "base")
    shutil.rmtree(first)

    def no_second_extract(*args):
        raise AssertionError("the sdist was extracted again")

    monkeypatch.setattr(materialize, "extract_sdist", no_second_extract)
    tree = materialize.build(project.base)

    assert git.out(tree, "rev-parse", "base") == head
    assert git.out(tree, "remote") == ""
    assert (tree / "vllm" / "_C.abi3.so").stat().st_nlink == 2
    assert materialize.unexported(tree) == []
