"""Failures users meet before anything is built end in a message that names
the file or command and what to do, never in a traceback."""

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading

import pytest

from forktools import cli
from forktools.queue import download, materialize
from forktools.environments import venv
from forktools.queue.pins import ForkError

from .conftest import BASE, copy_tooling

OLD_GIT = """#!/bin/sh
case "$*" in
  *--version*) echo "git version 2.20.1" ;;
  *--initial-branch*) echo "error: unknown option \\`initial-branch=fork'" >&2; exit 129 ;;
  *) exec {git} "$@" ;;
esac
"""


def _setup_py(project, *args: str) -> subprocess.CompletedProcess[str]:
    copy_tooling(project.root, "setup.py")
    return subprocess.run(
        [sys.executable, "setup.py", *args],
        cwd=project.root,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize(
    "broken, named",
    [
        (("sha256 = ", "sha = "), "no 'sha256'"),
        (("default = ", "# default = "), "no 'default'"),
        (('version = "', 'versions = "'), "no 'version'"),
    ],
)
def test_setup_py_names_a_malformed_pin_file(project, broken, named):
    pin_file = project.root / "upstream.toml"
    pin_file.write_text(pin_file.read_text().replace(*broken, 1))
    result = _setup_py(project, "--version")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert f"vllm-fork: error: {pin_file}: malformed pin file" in result.stderr
    assert named in result.stderr


def test_setup_py_without_git_says_to_install_it(project, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-git"))
    result = _setup_py(project, "--version")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "git is not installed" in result.stderr and "2.28" in result.stderr


def test_too_old_git_is_named_before_it_fails(project, tmp_path, monkeypatch, capsys):
    bin_dir = tmp_path / "old-git"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(OLD_GIT.format(git=shutil.which("git")))
    (bin_dir / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert cli.main(["fork", "--base", BASE]) == 2
    err = capsys.readouterr().err
    assert "git version 2.20.1" in err and "git >= 2.28" in err
    assert not materialize.tree_dir(project.base).exists()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def http_index(tmp_path, monkeypatch):
    """A package index on a local HTTP server whose page for vllm links files
    that the server does not have."""
    root = tmp_path / "www"
    (root / "simple" / "vllm").mkdir(parents=True)
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    for name in ("PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_INDEX_URL", f"{url}/simple")
    yield root, url
    server.shutdown()


def test_http_error_from_the_index_names_the_file_and_url(project, http_index):
    root, url = http_index
    missing = f"{url}/files/{project.sdist.name}"
    page = f'<a href="{missing}">{project.sdist.name}</a>\n'
    (root / "simple" / "vllm" / "index.html").write_text(page)
    with pytest.raises(ForkError) as error:
        download.fetch(project.base.sdist)
    message = str(error.value)
    assert f"downloading {project.sdist.name} failed" in message
    assert "404" in message and missing in message
    assert "PIP_INDEX_URL" in message


def test_python_without_venv_says_to_install_python3_venv(project, monkeypatch):
    run = subprocess.run

    def venv_fails(command, *args, check=False, **kwargs):
        if command[1:3] != ["-m", "venv"]:
            return run(command, *args, check=check, **kwargs)
        if check:
            raise subprocess.CalledProcessError(1, command)
        return subprocess.CompletedProcess(command, 1)

    monkeypatch.setattr(subprocess, "run", venv_fails)
    with pytest.raises(ForkError, match="install python3-venv"):
        venv.ensure(project.base)
