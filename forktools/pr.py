"""``make pr``: the upstream pull-request text for one patch of a queue."""

from __future__ import annotations

from forktools import queue, verify
from forktools.pins import Base, ForkError


def body(base: Base, number: int) -> str:
    entries = queue.entries(base)
    if not 1 <= number <= len(entries):
        raise ForkError(f"patches/{base.name} has {len(entries)} patches, no #{number}")
    entry = entries[number - 1]
    text = entry.message(base).get_content().split("\n---\n", 1)[0]
    purpose = "\n".join(
        line
        for line in text.strip().splitlines()
        if not line.startswith("Signed-off-by:")
    ).strip()
    row = verify.saved_row(base, entry.name)
    if row is None:
        raise ForkError(
            f"no `make verify` result for {entry.name} on the current queue; "
            f"run `make verify BASE={base.name}` first"
        )
    return "\n".join(
        [
            f"Title: {entry.subject(base)}",
            "",
            "## Purpose",
            "",
            purpose,
            "",
            "## Test Plan",
            "",
            "```bash",
            "VLLM_TARGET_DEVICE=cpu pytest -q \\",
            " \\\n".join(f"    {nodeid}" for nodeid in row["nodeids"]),
            "```",
            "",
            "Run with the fix, and again with the fix undone "
            f"({row['undone_by']}), tests kept.",
            "",
            "## Test Result",
            "",
            _result(row),
        ]
    )


def _result(row: dict) -> str:
    with_fix, without = row["with_fix"], row["without_fix"]
    total = with_fix["passed"] + with_fix["failed"]
    kinds = ", ".join(without["failure_types"]) or "-"
    return (
        f"On vLLM {row['base']} (CPU): with the fix {with_fix['passed']}/{total} "
        f"passed; without it {without['failed']}/{total} failed ({kinds}). "
        f"{row['seconds']:.0f} s for both runs."
    )
