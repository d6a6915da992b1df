"""What every benchmark script shares: stdout is kept for its JSON result."""

import os
import sys
from contextlib import contextmanager


@contextmanager
def stdout_to_stderr():
    """Send what native code prints to fd 1 to stderr, keeping stdout for JSON."""
    sys.stdout.flush()
    saved_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved_stdout, 1)
        os.close(saved_stdout)
