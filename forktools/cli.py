"""``python -m forktools``: the fork's commands (the Makefile calls these)."""

from __future__ import annotations

import argparse
import sys

from forktools import check, export, materialize, pins, queue
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
    _print_table(rows)
    current = materialize.selected()
    if current:
        print(f"\nselected: {current} ({materialize.version(pins.load().get(current))})")
    return 0


def cmd_verify(args) -> int:
    from forktools import verify

    return verify.main(_bases(args))


def _print_table(rows) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m forktools",
        description="Carry vLLM fork patches as queues on pinned upstream releases.",
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = [
        ("fork", cmd_fork, "materialize the fork tree of a base and link vllm/, tests/ to it"),
        ("export", cmd_export, "write the tree's commits back into patches/<base>/"),
        ("check", cmd_check, "fail when patches/ and the fork trees disagree"),
        ("status", cmd_status, "table of every queue: base, patch, subject, upstream"),
        ("verify", cmd_verify, "prove each commit's tests fail without it, pass with it"),
    ]
    for name, func, summary in commands:
        command = sub.add_parser(name, help=summary, description=summary)
        command.add_argument(
            "--base", help=f"a base pinned in upstream.toml (default: see {name} help)"
        )
        command.set_defaults(func=func)
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
