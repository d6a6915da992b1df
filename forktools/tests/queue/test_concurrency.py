"""Two runs at once, in one clone or in two sharing a cache, wait for each
other: no error, one download."""

import concurrent.futures
import os
import shutil
import subprocess
import sys

import pytest

from forktools.queue import materialize
from forktools.proof import checkouts

from forktools.tests.conftest import copy_tooling, git

SLOW_FORK = """
import sys, time
from forktools import cli
from forktools.queue import download

def slow_download(*args, download_now=download._download):
    time.sleep(2)
    download_now(*args)

download._download = slow_download
sys.exit(cli.main(["fork"]))
"""


def _clone(project, root):
    if root != project.root:
        root.mkdir()
        shutil.copy(project.root / "upstream.toml", root / "upstream.toml")
    copy_tooling(root)
    return root


@pytest.mark.parametrize("clones", [1, 2])
def test_two_forks_of_one_base_at_once(project, tmp_path, clones):
    roots = [_clone(project, project.root), _clone(project, tmp_path / "clone2")]
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", SLOW_FORK],
            cwd=roots[i % clones],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [run.communicate(timeout=120) for run in runs]

    err = "".join(stderr for _, stderr in outputs)
    assert [run.returncode for run in runs] == [0, 0], err
    assert err.count(f"downloading {project.sdist.name}") == 1, err
    assert err.count(f"downloading {project.wheel.name}") == 1, err
    assert "waiting for another run to" in err
    for root in roots[:clones]:
        assert (root / "vllm" / "core.py").exists()
        status = ["git", "-C", str(root / "vllm"), "status", "--porcelain"]
        assert subprocess.run(status, capture_output=True, text=True).stdout == ""


def test_checkouts_of_one_tree_at_once(tmp_path):
    tree = tmp_path / "tree"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm" / "__init__.py").touch()
    (tree / materialize.VERSION_FILE).write_text("__version__ = '9.9.9'\n")
    git(tree.parent, "init", "-q", str(tree))
    git(tree, "add", "vllm/__init__.py")
    git(tree, "commit", "-q", "-m", "base")

    def check_out_and_read(_):
        with checkouts.checkout(tree) as path:
            return (path / materialize.VERSION_FILE).read_text()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        versions = list(pool.map(check_out_and_read, range(48)))
    assert versions == ["__version__ = '9.9.9'\n"] * 48
    assert 1 < git(tree, "worktree", "list").count("\n") <= 9  # at most one per thread
    checkouts.remove_checkouts()
    assert git(tree, "worktree", "list").count("\n") == 1


def test_a_checkout_given_back_is_reused_switched_and_cleaned(tmp_path):
    tree = tmp_path / "tree"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm" / "__init__.py").write_text("value = 1\n")
    (tree / materialize.VERSION_FILE).write_text("__version__ = '9.9.9'\n")
    git(tree.parent, "init", "-q", str(tree))
    git(tree, "add", "vllm/__init__.py")
    git(tree, "commit", "-q", "-m", "base")
    # Same size, and switched to within the second its bytecode was written.
    (tree / "vllm" / "__init__.py").write_text("value = 2\n")
    git(tree, "add", "vllm/__init__.py")
    second = git(tree, "write-tree").strip()
    git(tree, "reset", "-q", "--hard")
    read_value = [sys.executable, "-c", "import vllm; print(vllm.value)"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

    with checkouts.checkout(tree) as first_path:
        assert subprocess.check_output(read_value, cwd=first_path, env=env, text=True) == "1\n"
        (first_path / "left_by_a_test.txt").write_text("x")
        (first_path / ".hypothesis").mkdir()
        (first_path / "tests" / "__pycache__").mkdir(parents=True)
    compiled = list((first_path / "vllm" / "__pycache__").glob("__init__.*.pyc"))
    assert compiled
    with checkouts.checkout(tree, second) as second_path:
        assert second_path == first_path
        assert not any(path.exists() for path in compiled)
        value = subprocess.check_output(read_value, cwd=second_path, env=env, text=True)
        assert value == "2\n"
        assert not (second_path / "left_by_a_test.txt").exists()
        assert not (second_path / ".hypothesis").exists()
        assert (second_path / "tests" / "__pycache__").is_dir()
        assert (second_path / materialize.VERSION_FILE).exists()
    (tree / "vllm" / "__init__.py").write_text("value = 3\n")
    git(tree, "commit", "-qam", "moved on")
    with checkouts.checkout(tree) as third_path:  # the tree's HEAD, not the worktree's
        value = subprocess.check_output(read_value, cwd=third_path, env=env, text=True)
        assert value == "3\n"
    checkouts.remove_checkouts()
    assert not first_path.exists()


def test_a_tree_built_again_in_place_gets_a_new_worktree(tmp_path):
    tree = tmp_path / "tree"

    def build(value: str) -> None:
        shutil.rmtree(tree, ignore_errors=True)
        (tree / "vllm").mkdir(parents=True)
        (tree / "vllm" / "__init__.py").write_text(value)
        (tree / materialize.VERSION_FILE).write_text("__version__ = '9.9.9'\n")
        git(tree.parent, "init", "-q", str(tree))
        git(tree, "add", "vllm/__init__.py")
        git(tree, "commit", "-q", "-m", "base")

    build("value = 1\n")
    with checkouts.checkout(tree) as old:
        pass
    build("value = 2\n")  # a new .git: the old worktree's record is gone
    with checkouts.checkout(tree) as new:
        assert new != old and not old.exists()
        assert (new / "vllm" / "__init__.py").read_text() == "value = 2\n"
    checkouts.remove_checkouts()
