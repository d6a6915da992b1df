"""What every benchmark script shares: stdout is kept for its JSON result."""

import os
import sys
import tempfile
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


@contextmanager
def single_process_group():
    """A one-rank gloo group, as vLLM's parallel layers need one to exist."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        cleanup_dist_env_and_memory,
        init_distributed_environment,
        initialize_model_parallel,
    )

    with tempfile.TemporaryDirectory() as tmp:
        with set_current_vllm_config(VllmConfig()):
            init_distributed_environment(
                world_size=1,
                rank=0,
                distributed_init_method=f"file://{os.path.join(tmp, 'dist-init')}",
                local_rank=0,
                backend="gloo",
            )
            initialize_model_parallel(1, 1)
        try:
            yield
        finally:
            cleanup_dist_env_and_memory()
