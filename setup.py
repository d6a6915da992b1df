"""Editable install of the fork: ``pip install -e .``.

Materializes the fork tree of the selected base (``VLLM_FORK_BASE``, else the
default in ``upstream.toml``) and installs ``vllm`` from it, with exactly the
upstream wheel's requirements and entry points.
"""

import sys
from pathlib import Path

from setuptools import find_packages, setup

sys.path.insert(0, str(Path(__file__).resolve().parent))

from forktools.queue import materialize, pins  # noqa: E402
from forktools.queue.pins import ForkError  # noqa: E402

try:
    base = pins.load().get()
    materialize.ensure(base)
    materialize.select(base)
    wheel = materialize.wheel_metadata(base)
except ForkError as e:
    sys.exit(f"vllm-fork: error: {e}")

setup(
    name="vllm",
    version=materialize.version(base),
    description=f"vLLM {base.version} with this fork's patch queue",
    python_requires=wheel.requires_python,
    # The root as an explicit package root: for such a layout setuptools'
    # default editable mode installs a path entry for the repository root (as
    # the deprecated "compat" mode did), so `vllm` resolves through the root's
    # link to the selected tree and a base switch needs no reinstall of it.
    package_dir={"": "."},
    packages=find_packages(include=["vllm", "vllm.*"]),
    install_requires=wheel.install_requires,
    extras_require=wheel.extras_require,
    entry_points=wheel.entry_points,
)
