"""`pip install -e .` and `uv venv && uv pip install -e .`, offline, from local

The miniature release is offered only where uv is told to look (its command
line, ``UV_FIND_LINKS`` or ``UV_INDEX_URL``); pip is pointed at an empty
wheelhouse, so the install passes only if the artifacts are found with uv's
settings.
"""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from forktools.queue import materialize, uv_index
from forktools.environments import tools
from forktools.queue.pins import ROOT

from forktools.tests.conftest import WHEEL_FILES, _wheel, copy_tooling

@pytest.fixture(scope="session")
def uv() -> Path:
    return tools.installed(tools.UV)


@pytest.fixture(scope="session")
def build_wheelhouse(tmp_path_factory) -> Path:
    """The build requirements as wheels, from their lock, through pip's
    configured indexes."""
    wheelhouse = tmp_path_factory.mktemp("build-wheelhouse")
    lock = tools.lock_path(tools.packages_name(tools.BUILD))
    download = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:"]
    result = subprocess.run(
        [*download, "-d", str(wheelhouse), "--require-hashes", "--no-deps", "-r", lock],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return wheelhouse


@pytest.fixture
def uv_project(project, tmp_path, uv, build_wheelhouse):
    """A copy of this repository's installer with the miniature release pinned;
    the wheel requires nothing, so that the install needs no index."""
    copy_tooling(project.root, "setup.py", "pyproject.toml")
    metadata = next(name for name in WHEEL_FILES if name.endswith("METADATA"))
    requirements_free = "".join(
        line
        for line in WHEEL_FILES[metadata].splitlines(keepends=True)
        if not line.startswith("Requires-Dist")
    )
    _wheel(project.wheel, {**WHEEL_FILES, metadata: requirements_free})
    project.pin()
    subprocess.run([uv, "venv", "-q", str(tmp_path / "venv")], check=True)
    return project


def test_the_build_requirements_are_pinned_and_locked():
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    here = [r for r in requires["requires"] if "python_version" not in r]
    assert here == list(tools.BUILD)
    locked = tools.lock_path(tools.packages_name(tools.BUILD)).read_text()
    for requirement in tools.BUILD:
        assert f"{requirement} \\\n    --hash=sha256:" in locked


def uv_install(uv, project, tmp_path, args, env_updates) -> Path:
    python = tmp_path / "venv" / "bin" / "python"
    env = {
        **os.environ,
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
        "UV_NO_CONFIG": "1",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(tmp_path / "empty"),
        **env_updates,
    }
    for name in ("UV_INDEX_URL", "UV_FIND_LINKS", "UV_EXTRA_INDEX_URL"):
        if name not in env_updates:
            env.pop(name, None)
    command = [uv, "pip", "install", "--python", str(python), "-e", ".", *args]
    result = subprocess.run(
        command, cwd=project.root, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return python


def simple_index(root: Path, files: list[Path]) -> Path:
    """A PEP 503 index in a directory: root/vllm/index.html links the files."""
    project_dir = root / "vllm"
    project_dir.mkdir(parents=True)
    links = "".join(f'<a href="{f.as_uri()}">{f.name}</a>\n' for f in files)
    (project_dir / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return root


@pytest.mark.parametrize("given_by", ["--find-links", "UV_FIND_LINKS", "UV_INDEX_URL"])
def test_uv_install_reports_fork_version_and_path(
    uv, uv_project, build_wheelhouse, tmp_path, given_by
):
    project = uv_project
    wheelhouse = ["--find-links", str(build_wheelhouse)]
    if given_by == "--find-links":
        args, env = ["--no-index", *wheelhouse, "--find-links", str(project.index)], {}
    elif given_by == "UV_FIND_LINKS":
        # A --find-links on the command line would replace the variable.
        locations = f"{build_wheelhouse},{project.index}"
        args, env = ["--no-index"], {"UV_FIND_LINKS": locations}
    else:
        index = simple_index(tmp_path / "simple", [project.sdist, project.wheel])
        args, env = wheelhouse, {"UV_INDEX_URL": index.as_uri()}

    python = uv_install(uv, project, tmp_path, args, env)

    assert_installed_from_root(python, project, tmp_path)


def test_pip_install_reports_fork_version_and_path(
    uv_project, build_wheelhouse, tmp_path
):
    project = uv_project
    python = tmp_path / "pip-venv" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", python.parent.parent], check=True)
    env = {
        **os.environ,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": f"{build_wheelhouse} {project.index}",
    }
    command = [python, "-m", "pip", "install", "-v", "-e", "."]
    result = subprocess.run(
        command, cwd=project.root, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SetuptoolsDeprecationWarning" not in result.stdout + result.stderr

    assert_installed_from_root(python, project, tmp_path)


def assert_installed_from_root(python: Path, project, tmp_path: Path) -> None:
    shown = subprocess.run(
        [python, "-c", "import vllm; print(vllm.__version__, vllm.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert shown == [
        materialize.version(project.base),
        str(project.root / "vllm" / "__init__.py"),
    ]
    # A path entry for the root, not a finder bound to one tree's files: the
    # root's vllm link, which switches bases, is what is imported.
    (pth,) = python.parent.parent.glob("lib/python*/site-packages/__editable__*.pth")
    assert pth.read_text().split() == [str(project.root)]


def test_index_options_of_a_uv_command_line():
    argv = [
        "install",
        "-e",
        ".",
        "-i",
        "https://mirror/simple",
        "--find-links=/wheels",
        "--no-index",
        "--extra-index-url",
        "https://extra/simple",
        "--reinstall",
    ]
    assert uv_index.index_options(argv) == [
        "--index-url",
        "https://mirror/simple",
        "--find-links",
        "/wheels",
        "--no-index",
        "--extra-index-url",
        "https://extra/simple",
    ]
