"""Two runs at once, in one clone or in two sharing a cache, wait for each
other: no error, one download."""

import concurrent.futures
import shutil
import subprocess
import sys

import pytest

from forktools import materialize
from forktools.proof import prove

from .conftest import copy_tooling, git

SLOW_FORK = """
import sys, time
from forktools import cli, download

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
        with prove.checkout(tree) as path:
            return (path / materialize.VERSION_FILE).read_text()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        versions = list(pool.map(check_out_and_read, range(48)))
    assert versions == ["__version__ = '9.9.9'\n"] * 48
    assert git(tree, "worktree", "list").count("\n") == 1
