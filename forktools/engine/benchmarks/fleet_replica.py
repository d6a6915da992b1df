"""One replica of a fleet on a shared compile cache, for ``make bench``.

Runs ``aot_warm_start.py``'s model (real Inductor, AOT compile, the base's
default artifact format) on ``VLLM_CACHE_ROOT``, as ``forktools.engine.bench``
starts it: PID 1 of a PID namespace of its own, like every container of one
image. With ``FLEET_BARRIER`` set (a writer), each rename of a vLLM save into
the cache root waits there until ``FLEET_REPLICAS`` replicas reach it, as
replicas finishing one compile together would. Prints one JSON object: the
process's PID, whether it ran correctly and loaded from disk, the AOT
artifacts it saved, and the warnings vLLM's compilation logged.
"""

import json
import logging
import os
import sys
import time
from pathlib import Path

import aot_warm_start
from script_io import single_process_group, stdout_to_stderr

BARRIER_SECONDS = 120


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("vllm.compilation"):
            self.messages.append(record.getMessage())


def saved_by_vllm(path: Path) -> bool:
    """The backend's index or an AOT artifact, not a write-aside file nor
    Inductor's own files."""
    if path.name.endswith(".tmp"):
        return False
    if path.name == "vllm_compile_cache.py":
        return True
    return "torch_aot_compile" in path.parts and "inductor_cache" not in path.parts


def hold_renames_at_barrier(root: str, barrier: Path, replicas: int) -> list[str]:
    """Patch ``os.replace``; the names of the renames that waited in vain."""
    replace, timed_out = os.replace, []
    name = f"replica-{os.environ['FLEET_REPLICA']}"

    def replace_together(src, dst, *args, **kwargs):
        if str(dst).startswith(root) and saved_by_vllm(Path(dst)):
            gate = barrier / Path(dst).name
            gate.mkdir(parents=True, exist_ok=True)
            (gate / name).touch()
            deadline = time.monotonic() + BARRIER_SECONDS
            while len(list(gate.iterdir())) < replicas:
                if time.monotonic() > deadline:
                    timed_out.append(Path(dst).name)
                    break
                time.sleep(0.05)
        return replace(src, dst, *args, **kwargs)

    os.replace = replace_together
    return timed_out


def main() -> None:
    barrier = os.environ.get("FLEET_BARRIER")
    timed_out = []
    if barrier:
        replicas = int(os.environ["FLEET_REPLICAS"])
        root = os.environ["VLLM_CACHE_ROOT"]
        timed_out = hold_renames_at_barrier(root, Path(barrier), replicas)
    warnings = Warnings()
    logging.getLogger("vllm").addHandler(warnings)
    from vllm.compilation.counter import compilation_counter

    with stdout_to_stderr(), single_process_group():
        aot_warm_start.artifact_format("default")
        model = aot_warm_start.build_model(aot_warm_start.compile_config(), 2)
        output = aot_warm_start.run(model)
        expected = model.forward(aot_warm_start.model_input())
    result = {
        "pid": os.getpid(),
        "correct": bool(aot_warm_start.torch.allclose(output, expected)),
        "loaded_from_disk": bool(model.was_aot_compile_fn_loaded_from_disk),
        "aot_artifacts_saved": compilation_counter.num_aot_artifacts_saved,
        "warnings": warnings.messages,
        "barrier_timed_out": timed_out,
    }
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
