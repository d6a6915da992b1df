"""``python -m forktools``: the fork's commands (the Makefile calls these)."""

from __future__ import annotations

import argparse
import sys

from forktools import check, export, materialize, pins, queue, table
from forktools.pins import ForkError


def _bases(args) -> list[pins.Base]:
    table = pins.load()
    if getattr(args, "base", None):
        return [table.get(args.base)]
    return table.newest_first()


def cmd_fork(args) -> int:
    base = pins.load().get(args.base)
    materialize.ensure(base)
    materialize.select(base)
    print(f"vllm/ and tests/ are vLLM {materialize.version(base)}")
    return 0


def cmd_export(args) -> int:
    base = pins.load().get(args.base or materialize.selected())
    names = export.export(base)
    print(f"patches/{base.name}: {len(names)} patch(es) exported")
    for name in names:
        print(f"  {name}")
    return 0


def cmd_check(args) -> int:
    found = [problem for base in _bases(args) for problem in check.problems(base)]
    for problem in found:
        print(f"check: {problem}", file=sys.stderr)
    if not found:
        print("check: patches/ and the fork trees agree")
    return 1 if found else 0


def cmd_status(args) -> int:
    rows = [("base", "#", "patch", "subject", "upstream")]
    for base in _bases(args):
        for number, entry in enumerate(queue.entries(base), 1):
            rows.append(
                (base.name, str(number), entry.name, entry.subject(base), entry.status)
            )
        if not queue.entries(base):
            rows.append((base.name, "-", "(empty queue)", "", ""))
    print(table.render(rows))
    current = materialize.selected()
    if current:
        print(
            f"\nselected: {current} ({materialize.version(pins.load().get(current))})"
        )
    return 0


def cmd_verify(args) -> int:
    from forktools import verify

    return verify.main(_bases(args))


def cmd_lint(args) -> int:
    from forktools import lint

    return lint.main(_bases(args))


def cmd_bench(args) -> int:
    from forktools import bench

    return bench.main(_bases(args))


def cmd_pr(args) -> int:
    from forktools import pr

    print(pr.body(pins.load().get(args.base), args.patch))
    return 0


def cmd_venv(args) -> int:
    from forktools import venv

    for base in _bases(args):
        print(venv.ensure(base))
    return 0


def cmd_test(args) -> int:
    """Everything CI runs: tooling tests, lint, check, verify."""
    import subprocess

    from forktools import venv
    from forktools.pins import ROOT

    bases = _bases(args)
    pythons = [venv.ensure(base) for base in bases]
    tooling = [str(pythons[0]), "-m", "pytest", "-q", "forktools/tests"]
    stages = {
        "tooling tests": lambda: subprocess.run(tooling, cwd=ROOT).returncode,
        "lint": lambda: cmd_lint(args),
        "check": lambda: cmd_check(args),
        "verify": lambda: cmd_verify(args),
    }
    failed = []
    for name, stage in stages.items():
        print(f"\n== {name}", flush=True)
        if stage() != 0:
            failed.append(name)
    print(f"\nfailed: {', '.join(failed)}" if failed else "")
    print(f"stages: {len(stages) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


_ALL = "a base pinned in upstream.toml (default: every base)"
BASE_HELP = {
    "fork": "a base pinned in upstream.toml (default: $VLLM_FORK_BASE, else "
    "upstream.toml's default)",
    "export": "a base pinned in upstream.toml (default: the selected tree's)",
    "check": _ALL,
    "status": _ALL,
    "verify": _ALL,
    "lint": _ALL,
    "venv": _ALL,
    "test": _ALL,
    "bench": _ALL,
    "pr": "a base pinned in upstream.toml (default: upstream.toml's default)",
}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m forktools",
        description="Carry vLLM fork patches as queues on pinned upstream releases.",
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = [
        (
            "fork",
            cmd_fork,
            "materialize the fork tree of a base and link vllm/, tests/ to it",
        ),
        ("export", cmd_export, "write the tree's commits back into patches/<base>/"),
        ("check", cmd_check, "fail when patches/ and the fork trees disagree"),
        ("status", cmd_status, "table of every queue: base, patch, subject, upstream"),
        (
            "verify",
            cmd_verify,
            "prove each commit's tests fail without it, pass with it",
        ),
        (
            "lint",
            cmd_lint,
            "ruff, sign-off, subject and SPDX checks on code and queues",
        ),
        ("bench", cmd_bench, "fork vs pristine costs, written to BENCHMARKS.md"),
        ("pr", cmd_pr, "print the upstream pull-request body for one patch"),
        ("venv", cmd_venv, "build (if needed) and print each base's test environment"),
        ("test", cmd_test, "everything CI runs: tooling tests, lint, check, verify"),
    ]
    for name, func, summary in commands:
        command = sub.add_parser(name, help=summary, description=summary)
        command.add_argument("--base", help=BASE_HELP[name])
        command.set_defaults(func=func)
        if name == "pr":
            command.add_argument(
                "--patch", type=int, required=True, help="the patch's number in series"
            )
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except ForkError as e:
        print(f"vllm-fork: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
