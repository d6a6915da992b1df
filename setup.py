"""Editable install of the fork: ``pip install -e .``.

Materializes the fork tree of the selected base (``VLLM_FORK_BASE``, else the
default in ``upstream.toml``) and installs ``vllm`` from it, with exactly the
upstream wheel's requirements and entry points.
"""

import configparser
import re
import sys
import zipfile
from pathlib import Path

from setuptools import find_packages, setup

sys.path.insert(0, str(Path(__file__).resolve().parent))

from forktools import download, materialize, pins  # noqa: E402

EXTRA_ONLY = re.compile(r'^(?P<req>[^;]+);\s*extra\s*==\s*"(?P<extra>[^"]+)"$')


def wheel_metadata(wheel: Path) -> tuple[str, str]:
    with zipfile.ZipFile(wheel) as archive:
        info = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        entry_points = info.replace("METADATA", "entry_points.txt")
        return archive.read(info).decode(), archive.read(entry_points).decode()


def requirements(metadata: str) -> tuple[list[str], dict[str, list[str]]]:
    install, extras = [], {}
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = line.split(":", 1)[1].strip()
        if match := EXTRA_ONLY.match(requirement):
            extras.setdefault(match["extra"], []).append(match["req"].strip())
        elif "extra" in requirement.partition(";")[2]:
            raise SystemExit(f"vllm-fork: cannot translate {requirement!r}")
        else:
            install.append(requirement)
    return install, extras


def entry_points(text: str) -> dict[str, list[str]]:
    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str
    parser.read_string(text)
    return {
        group: [f"{name} = {value}" for name, value in parser[group].items()]
        for group in parser.sections()
    }


base = pins.load().get()
materialize.ensure(base)
materialize.select(base)
metadata, wheel_entry_points = wheel_metadata(
    download.fetch(base.wheel_for_this_machine())
)
install_requires, extras_require = requirements(metadata)

setup(
    name="vllm",
    version=materialize.version(base),
    description=f"vLLM {base.version} with this fork's patch queue",
    python_requires=re.search(r"^Requires-Python: (.+)$", metadata, re.M)[1],
    packages=find_packages(include=["vllm", "vllm.*"]),
    include_package_data=True,
    install_requires=install_requires,
    extras_require=extras_require,
    entry_points=entry_points(wheel_entry_points),
    # A path entry for the repository root, so that `vllm` resolves through
    # the root's link to the selected tree, as a plain checkout would.
    options={"editable_wheel": {"mode": "compat"}},
)
