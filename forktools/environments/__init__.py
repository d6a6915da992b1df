"""Environments: each base's virtual environments, the dependency locks they
install from (``locks/``) and ``make lock`` that writes them, and the pinned
tools the tooling installs for itself.

Imports the queue package only.
"""
