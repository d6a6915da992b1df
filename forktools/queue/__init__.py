"""The queue and its trees: pinned upstream artifacts, the patch series on
each base, the fork trees materialized from them, and the commands that read
or reshape a queue (export, check, status, rebase).

The lowest layer: imports nothing of forktools outside this package. What a
command needs from a higher job (an environment, a proof) its caller passes
in.
"""
