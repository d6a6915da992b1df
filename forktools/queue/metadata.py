"""What ``pip install -e .`` declares: exactly the upstream wheel's metadata."""

from __future__ import annotations

import configparser
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from forktools.queue.pins import ForkError

_EXTRA_ONLY = re.compile(r'^(?P<req>[^;]+);\s*extra\s*==\s*"(?P<extra>[^"]+)"$')


@dataclass(frozen=True)
class WheelMetadata:
    requires_python: str | None
    install_requires: list[str]
    extras_require: dict[str, list[str]]
    entry_points: dict[str, list[str]]


def read(wheel: Path) -> WheelMetadata:
    with zipfile.ZipFile(wheel) as archive:
        info = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(info).decode()
        points_file = info.replace("METADATA", "entry_points.txt")
        points = (
            archive.read(points_file).decode()
            if points_file in archive.namelist()
            else ""
        )
    install, extras = requirements(metadata)
    python = re.search(r"^Requires-Python: (.+)$", metadata, re.MULTILINE)
    return WheelMetadata(
        requires_python=python[1].strip() if python else None,
        install_requires=install,
        extras_require=extras,
        entry_points=entry_points(points),
    )


def requirements(metadata: str) -> tuple[list[str], dict[str, list[str]]]:
    """``Requires-Dist`` lines split into plain requirements and extras."""
    install, extras = [], {}
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = line.split(":", 1)[1].strip()
        if match := _EXTRA_ONLY.match(requirement):
            extras.setdefault(match["extra"], []).append(match["req"].strip())
        elif "extra" in requirement.partition(";")[2]:
            raise ForkError(f"cannot translate the wheel requirement {requirement!r}")
        else:
            install.append(requirement)
    return install, extras


def entry_points(text: str) -> dict[str, list[str]]:
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    parser.optionxform = str
    parser.read_string(text)
    return {
        group: [f"{name} = {value}" for name, value in parser[group].items()]
        for group in parser.sections()
    }
