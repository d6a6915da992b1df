"""The CPU test environment: exact requirements unless a base excludes some."""

import sys
from dataclasses import replace
from hashlib import sha256
from pathlib import Path

import pytest

from forktools import venv
from forktools.pins import Exclusion, ForkError

from .conftest import WHEEL_FILES, _wheel

EXCLUDED = Exclusion("numpy", "a GPU kernel package in this story")


def test_plain_base_installs_the_wheel_with_its_requirements(project):
    python = Path("/venv/bin/python")
    [command] = venv.install_commands(project.base, python, project.wheel)
    assert command[-1] == str(project.wheel)
    assert "--no-deps" not in command


def test_exclusion_installs_the_rest_and_the_wheel_without_deps(project):
    base = replace(project.base, cpu_test_exclude=(EXCLUDED,))
    deps, wheel = venv.install_commands(base, Path("/venv/bin/python"), project.wheel)
    assert "numpy" not in deps
    assert 'six>=1.16.0; python_version > "3.11"' in deps
    assert wheel[-2:] == ["--no-deps", str(project.wheel)]


def test_exclusion_the_wheel_does_not_declare_is_refused(project, tmp_path):
    metadata = next(name for name in WHEEL_FILES if name.endswith("METADATA"))
    wheel = tmp_path / project.wheel.name
    _wheel(wheel, {**WHEEL_FILES, metadata: "Requires-Dist: numpy==2.0\n"})
    base = replace(project.base, cpu_test_exclude=(EXCLUDED,))
    with pytest.raises(ForkError, match="cpu-test-exclude names numpy"):
        venv.install_commands(base, Path("/venv/bin/python"), wheel)


def test_key_of_a_base_without_exclusions_is_unchanged(project):
    # The key before exclusions existed: existing environments (about 10 GB
    # each) must keep it, or they would be rebuilt.
    base = replace(project.base, test_requirements=("pytest==8.4.2",))
    spec = "\n".join([base.name, project.wheel.name, sys.version, "pytest==8.4.2"])
    assert venv._key(base, project.wheel) == sha256(spec.encode()).hexdigest()[:12]
    excluded = replace(base, cpu_test_exclude=(EXCLUDED,))
    assert venv._key(excluded, project.wheel) != venv._key(base, project.wheel)
