"""The proof: each patch's tests pass with it and fail without it, as data.

- ``prove``: what one proof observes; its content and the harness are in
  every ledger key.
- ``machine``: the machine a proof ran on, kept beside each row, in no key.
- ``ledger``: ``patches/<base>/proof.json``, rows keyed by their inputs.
- ``symptoms``: ``patches/<base>/symptoms.toml``, what each test shows
  without its fix, and the judging of failures against it.
- ``verify``: plans the rows, runs them and judges them (``make verify``),
  auditing reused ones.
- ``hunks``: ``make verify HUNKS=1``, which hunks a fix's tests need.
- ``readonly``: ``make read-only``, the read-only tests without capabilities.
- ``schedule``: the one scheduler their test runs share.
- ``costs``: ``make costs``, where the ledgers' test-seconds go.

``main`` is the entry the command line calls.
"""

from __future__ import annotations

from forktools.queue.pins import Base, ForkError

COMMANDS = ("verify", "hunks", "read-only", "costs")


def main(command: str, bases: list[Base], **options) -> int:
    """Run the proof ``command`` (one of COMMANDS) on ``bases``."""
    if command == "verify":
        from forktools.proof import verify

        return verify.main(bases, **options)
    if command == "hunks":
        from forktools.proof import hunks

        return hunks.main(bases, **options)
    if command == "read-only":
        from forktools.proof import readonly

        return readonly.main(bases, **options)
    if command == "costs":
        from forktools.proof import costs

        return costs.main(bases)
    raise ForkError(f"no proof command {command!r}; one of {', '.join(COMMANDS)}")
