"""A patch's upstream status: the ``Upstream-Status:`` trailer of its message.

In the manner of OpenEmbedded's patch QA, every patch says where its change
stands upstream, in its closing trailer block beside ``Signed-off-by:``::

    Upstream-Status: Backport [PR 40627, first released in v0.20.0]
    Upstream-Status: Pending [issue 55383; open PR 55386 differs]
    Upstream-Status: Test-only [fix in PR 45059, no upstream test]

The tools read it from there; nothing else records it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from forktools.queue.pins import ForkError

KEY = "Upstream-Status"
# Each kind, and what its details must name.
KINDS = {
    "Backport": (
        re.compile(r"\bPR (\d+|not identified)\b.*, first released in v\d+(\.\d+)+\b"),
        "PR <n>, first released in v<x.y.z> ('PR not identified' where the "
        "release shows the change but no PR is known)",
    ),
    "Pending": (re.compile(r"\b(issue|PR) \d+\b"), "issue <n> or PR <n>"),
    "Submitted": (re.compile(r"\bPR \d+\b"), "PR <n>"),
    "Test-only": (re.compile(r"\bfix in PR \d+\b"), "fix in PR <n>"),
    "Inappropriate": (re.compile(r"\S"), "a reason"),
}
EXAMPLE = f"{KEY}: Pending [issue 55383; open PR 55386 differs]"
_VALUE = re.compile(r"^(?P<kind>\S+) \[(?P<detail>[^\[\]]*\S[^\[\]]*)\]$")
_TRAILER_LINE = re.compile(r"^[A-Za-z][\w-]*: ")
_RELEASED = re.compile(r"first released in v(?P<version>\d+(?:\.\d+)+)")


class StatusError(ForkError):
    """A patch message without a valid ``Upstream-Status:`` trailer."""


@dataclass(frozen=True)
class Status:
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} [{self.detail}]"

    @property
    def released_in(self) -> str | None:
        """The first upstream release with the fix, if the trailer names one."""
        match = _RELEASED.search(self.detail)
        return match["version"] if match else None


def message_of(patch_text: str) -> str:
    """The commit message of a ``git format-patch`` mail (body up to ``---``)."""
    body = patch_text.split("\n\n", 1)[1] if "\n\n" in patch_text else ""
    return body.split("\n---\n", 1)[0].strip()


def trailers(message: str) -> list[str]:
    """The closing trailer block: the last paragraph, if every line is one."""
    last = message.strip().split("\n\n")[-1].splitlines()
    lines = [line for line in last if not line[:1].isspace()]
    if lines and all(_TRAILER_LINE.match(line) for line in lines):
        return lines
    return []


def read(message: str) -> Status:
    """The message's upstream status; `StatusError` says what is wrong."""
    found = [line for line in trailers(message) if line.startswith(f"{KEY}:")]
    if not found:
        where = (
            f"{KEY}: appears in the body, not in the closing trailer block"
            if re.search(rf"^{KEY}:", message, re.MULTILINE)
            else f"no {KEY}: trailer"
        )
        raise StatusError(
            f"{where}; add one beside Signed-off-by:, e.g. '{EXAMPLE}' "
            f"(kinds: {', '.join(KINDS)})"
        )
    if len(found) > 1:
        raise StatusError(f"{len(found)} {KEY}: trailers; keep exactly one")
    return parse(found[0].split(":", 1)[1].strip())


def parse(value: str) -> Status:
    match = _VALUE.match(value)
    if not match:
        raise StatusError(
            f"malformed {KEY}: {value!r}; write '<Kind> [<details>]', e.g. '{EXAMPLE}'"
        )
    kind, detail = match["kind"], match["detail"].strip()
    if kind not in KINDS:
        raise StatusError(f"unknown {KEY} kind {kind!r}; one of {', '.join(KINDS)}")
    pattern, needs = KINDS[kind]
    if not pattern.search(detail):
        raise StatusError(f"{KEY}: {kind} must name {needs}, as in '{kind} [{needs}]'")
    return Status(kind, detail)
