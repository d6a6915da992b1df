"""The pristine tree of a base is built once and shared by every clone."""

import os
import shutil
import stat
import subprocess

import pytest

from forktools.queue import check, download, export, git, materialize, pins, metadata
from forktools.queue.pins import ForkError

from forktools.tests.conftest import WHEEL_FILES, _wheel


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


def test_a_built_tree_declares_the_wheels_metadata_without_hashing_it_again(
    project, monkeypatch
):
    materialize.build(project.base)
    expected = metadata.read(project.wheel)

    def no_fetch(artifact):
        raise AssertionError(f"{artifact.file} was fetched and hashed again")

    monkeypatch.setattr(download, "fetch", no_fetch)
    assert materialize.wheel_metadata(project.base) == expected
    assert not list(materialize.pristine(project.base).glob(".git/.*.json.*"))


def test_the_shared_pristine_tree_is_readable_by_all_and_a_killed_build_is_cleaned(
    project,
):
    wheel = project.base.wheel_for_this_machine()
    key = f"{project.base.name}-{project.base.sdist.sha256[:12]}-{wheel.sha256[:12]}"
    leftover = materialize.download.cache_dir() / "pristine" / f".{key}.x1y2z3"
    leftover.mkdir(parents=True)
    (leftover / "half-written").write_text("")
    old_umask = os.umask(0o022)
    try:
        pristine = materialize.pristine(project.base)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(pristine.stat().st_mode) == 0o755
    assert not leftover.exists()


WHEEL_ONLY = "vllm/vllm_flash_attn/interface.py"


def test_wheel_only_python_file_is_each_trees_own_and_guarded(
    project, monkeypatch, tmp_path
):
    _wheel(project.wheel, {**WHEEL_FILES, WHEEL_ONLY: "def flash():\n    pass\n"})
    project.pin()
    tree = materialize.ensure(project.base)
    other_root = tmp_path / "other-clone"
    other_root.mkdir()
    shutil.copy(project.root / "upstream.toml", other_root / "upstream.toml")
    monkeypatch.setattr(pins, "ROOT", other_root)
    other = materialize.ensure(project.base)
    monkeypatch.setattr(pins, "ROOT", project.root)

    (tree / WHEEL_ONLY).write_text("edited in the first clone\n")

    assert (other / WHEEL_ONLY).read_text() == "def flash():\n    pass\n"
    assert (materialize.pristine(project.base) / WHEEL_ONLY).read_text() == (
        "def flash():\n    pass\n"
    )
    assert materialize.unexported(other) == []
    assert materialize.unexported(tree) == [WHEEL_ONLY]
    [problem] = check.problems(project.base)
    assert WHEEL_ONLY in problem
    with pytest.raises(ForkError, match=WHEEL_ONLY):
        export.export(project.base)
    (project.base.patch_dir).mkdir(parents=True)
    (project.base.patch_dir / "series").write_text("# a pull\n")
    with pytest.raises(ForkError, match=WHEEL_ONLY):
        materialize.ensure(project.base)
    assert (tree / WHEEL_ONLY).read_text() == "edited in the first clone\n"

    restore = problem.partition("Restore: ")[2]
    subprocess.run(restore, shell=True, check=True)
    assert materialize.unexported(tree) == []
