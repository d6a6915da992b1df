"""The repository's PEP 517 build backend.

``pip install -e .`` is setuptools' editable install, unchanged (``setup.py``).
A wheel (``pip wheel .``, ``pip install .``, ``python -m build --wheel``) is
the fork wheel of ``make wheel`` for this machine, byte for byte: a wheel
built from the repository's sources alone would ship no compiled kernels.
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools.build_meta import (
    build_editable,
    get_requires_for_build_editable,
    prepare_metadata_for_build_editable,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
]

NO_SDIST = (
    "vllm-fork: error: this repository has no sdist: it holds patches, not "
    "vLLM's sources. Build the fork wheel with `make wheel` (or `pip wheel .`, "
    "`python -m build --wheel`) and install that; see docs/fleet.md, 'Building a "
    "wheel for a fleet'."
)


def get_requires_for_build_wheel(config_settings=None) -> list[str]:
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    from forktools.queue import materialize, pins
    from forktools.queue.pins import ForkError
    from forktools.shipping import wheel

    try:
        base = pins.load().get()
        # The wheel is the exported queue: an edit in the tree would be left out
        # without a word where pip shows it, so stop and name it instead.
        materialize.refuse_if_unexported(
            materialize.tree_dir(base), f"build the {base.name} fork wheel"
        )
        built = wheel.build(base, base.wheel_for_this_machine(), Path(wheel_directory))
    except ForkError as e:
        sys.exit(f"vllm-fork: error: {e}")
    return built.path.name


def get_requires_for_build_sdist(config_settings=None) -> list[str]:
    return []


def build_sdist(sdist_directory, config_settings=None):
    sys.exit(NO_SDIST)
