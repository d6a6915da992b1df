"""Find a pinned file with uv's index settings, for ``uv pip install -e .``.

uv runs ``setup.py`` as a PEP 517 build backend but hands it neither its
command line nor its resolved index settings: only ``UV``, the path of its
binary. So the file is looked up by asking that uv to lock the release
(``uv pip compile --format pylock.toml``), which lists each file's URL:

- ``UV_INDEX_URL``, ``UV_FIND_LINKS`` and the other ``UV_*`` variables, and
  ``uv.toml``, reach that uv as they reached the user's;
- index options given on the command line (``--index-url``, ``--find-links``,
  …) are read from the invoking ``uv pip install`` process and passed on, and
  the lookup runs in that process's working directory, so that relative paths
  and project configuration resolve as they did for the user.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

from forktools.queue.pins import ForkError, tomllib

# uv options that choose indexes, with a value and without one.
VALUE_OPTIONS = {
    "--index-url": "--index-url",
    "-i": "--index-url",
    "--extra-index-url": "--extra-index-url",
    "--find-links": "--find-links",
    "-f": "--find-links",
    "--index": "--index",
    "--default-index": "--default-index",
    "--index-strategy": "--index-strategy",
    "--keyring-provider": "--keyring-provider",
    "--allow-insecure-host": "--allow-insecure-host",
    "--trusted-host": "--allow-insecure-host",
    "--config-file": "--config-file",
    "--cache-dir": "--cache-dir",
}
FLAG_OPTIONS = {"--no-index", "--no-config", "--offline", "--native-tls"}


def running_uv() -> str | None:
    """The uv binary that runs this process, if uv runs it."""
    return os.environ.get("UV") or None


def index_options(argv: list[str]) -> list[str]:
    """The index-choosing options of a uv command line, normalized."""
    options = []
    args = iter(argv)
    for arg in args:
        name, equals, value = arg.partition("=")
        if name in VALUE_OPTIONS:
            value = value if equals else next(args, "")
            options += [VALUE_OPTIONS[name], value]
        elif arg in FLAG_OPTIONS:
            options.append(arg)
    return options


def _invoking_uv() -> tuple[list[str], Path | None]:
    """Index options and working directory of the parent ``uv pip`` process.

    Empty where the parent is not uv or its command line cannot be read
    (not Linux): environment and configuration files still apply.
    """
    proc = Path("/proc") / str(os.getppid())
    try:
        argv = (proc / "cmdline").read_bytes().decode().split("\0")
        cwd = Path(os.readlink(proc / "cwd"))
    except OSError:
        return [], None
    if Path(argv[0]).name != "uv" or argv[1:2] != ["pip"]:
        return [], None
    return index_options(argv[2:]), cwd


def find_url(uv: str, project: str, filename: str) -> str | None:
    """The URL under which uv's configured indexes offer ``filename``."""
    version = filename.removesuffix(".tar.gz").split("-")[1]
    options, cwd = _invoking_uv()
    command = [
        uv,
        "pip",
        "compile",
        "-",
        "--no-deps",
        "--no-header",
        "--quiet",
        "--format",
        "pylock.toml",
        "--python",
        sys.executable,
        *options,
    ]
    result = subprocess.run(
        command,
        input=f"{project}=={version}\n",
        capture_output=True,
        text=True,
        cwd=cwd,
    )
    if result.returncode != 0:
        raise ForkError(
            f"uv could not find {project}=={version} for {filename}: "
            f"{result.stderr.strip()}"
        )
    return url_in_lock(result.stdout, filename, cwd or Path.cwd())


def url_in_lock(lock_text: str, filename: str, cwd: Path) -> str | None:
    """The URL of ``filename`` in a pylock.toml (a local path as a file URL)."""
    for package in tomllib.loads(lock_text).get("packages", []):
        for entry in [package.get("sdist", {}), *package.get("wheels", [])]:
            if url := entry.get("url"):
                if unquote(urlsplit(url).path).rsplit("/", 1)[-1] == filename:
                    return url
            elif (path := entry.get("path")) and Path(path).name == filename:
                return (cwd / path).resolve().as_uri()
    return None
