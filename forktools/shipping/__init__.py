"""Shipping the fixes: the fork wheel and its build backend, ``make pr`` for
upstream, ``make apply`` and the release table for a user's own vLLM
checkout, upstream's pre-commit checks and ``make lint``.

The highest job: may import every other package (the proof through its
``__init__`` only); only ``forktools.cli`` sits above it.
"""
