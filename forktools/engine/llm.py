"""Run the fork tree in a real vLLM engine on CPU, and the smoke check of it.

How the tree meets the CPU build's kernels: an engine run uses the engine
environment's Python (``venv.ensure_engine``: the base's CPU build of vLLM
installed in it) with the fork tree first on PYTHONPATH and the harness
beside it, and ``VLLM_TARGET_DEVICE=cpu``. ``import vllm`` then reads every
Python file from the tree, as the CPU test runs do, while the harness's
``vllm_engine_kernels`` finder loads each ``vllm.*`` extension module
(``vllm._C`` and the AVX2/AVX512 variants) from the CPU build's installed
package and refuses the CUDA wheel's extensions that the tree also holds. The
harness also pins the CPU platform, which the tree's own detection (a "cpu"
in the ``vllm`` distribution's version) cannot see. The engine core is a
spawned process; it inherits the environment, so every hook runs there too.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from forktools.engine.engine_run import PROMPTS
from forktools.environments import venv
from forktools.proof import HARNESS
from forktools.queue import materialize
from forktools.queue.pins import Base, ForkError

SCRIPT = Path(__file__).with_name("engine_run.py")
AOT_LOADED = "Directly load AOT compilation from path"
AOT_SAVED = "saved AOT compiled function to"
RECOMPILED = "Compiling model again"
AOT_COMPILE = {"VLLM_FORK_CPU_LORA_COMPILE": "1", "VLLM_USE_AOT_COMPILE": "1"}
SERVER_START_SECONDS = 600


def environment(tree: Path, cache_root: Path, **extra: str) -> dict[str, str]:
    """The environment of an engine run on ``tree``'s sources."""
    return dict(
        os.environ,
        VLLM_TARGET_DEVICE="cpu",
        PYTHONPATH=os.pathsep.join([str(tree), str(HARNESS)]),
        VLLM_CACHE_ROOT=str(cache_root),
        HF_HUB_OFFLINE="1",
        # The default takes half of the machine's memory for the KV cache.
        VLLM_CPU_KVCACHE_SPACE="1",
        **extra,
    )


@dataclass
class Run:
    """One engine start and its generations, from ``engine_run.py``."""

    seconds: float  # the whole process: imports, start, generation, exit
    startup_s: float  # LLM(...) alone
    base: list[list[int]]
    lora: list[list[int]]
    vllm_file: str
    kernels: str
    log: Path
    events: dict[str, int] = field(default_factory=dict)

    @property
    def tokens(self) -> tuple:
        return self.base, self.lora


def make_model(python: Path, directory: Path) -> dict:
    """Write the tiny model, tokenizer and adapter; returns HF's tokens."""
    _run([*_script(python), "model", str(directory)], os.environ, None)
    return json.loads((directory / "hf_tokens.json").read_text())


def run_engine(
    python: Path,
    model: Path,
    env: dict[str, str],
    log: Path,
    cwd: Path | None = None,
    prefix: tuple[str, ...] = (),
    **engine_args: int | str,
) -> Run:
    """``LLM(...)`` in a process of its own (``prefix`` runs it, as
    ``unshare`` does), its tokens and what its log says."""
    out = log.with_suffix(".json")
    settings = [f"{name}={value}" for name, value in engine_args.items()]
    started = time.monotonic()
    script = [*_script(python), "generate", str(model), str(out), *settings]
    command = [*prefix, *script]
    _run(command, env, log, cwd)
    seconds = time.monotonic() - started
    events = log_events(log.read_text(errors="replace"))
    return Run(seconds=seconds, log=log, events=events, **json.loads(out.read_text()))


def log_events(text: str) -> dict[str, int]:
    """How often an engine's log says it loaded, saved or compiled again."""
    return {key: text.count(key) for key in (AOT_LOADED, AOT_SAVED, RECOMPILED)}


@dataclass
class ServerStart:
    """One ``vllm serve`` start: seconds until it answered, and its answer."""

    ready_s: float
    answer: str
    log: Path
    events: dict[str, int]

    @property
    def tokens(self) -> str:
        return self.answer


def serve_once(
    python: Path,
    model: Path,
    env: dict[str, str],
    log: Path,
    served_name: str = "",
) -> ServerStart:
    """Start the OpenAI API server on ``model`` (named ``served_name`` to
    clients, when given), time it until ``/health`` answers, ask it for one
    greedy completion, and stop it."""
    port = _free_port()
    naming = [f"--served-model-name={served_name}"] if served_name else []
    command = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        f"--model={model}",
        f"--port={port}",
        "--max-model-len=128",
        "--dtype=float32",
        *naming,
    ]
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as output:
        started = time.monotonic()
        server = subprocess.Popen(
            command, cwd=log.parent, env=env, stdout=output, stderr=subprocess.STDOUT
        )
        try:
            ready_s = _wait_until_healthy(server, url, started, log)
            answer = _complete(url, served_name or str(model), PROMPTS[0])
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    events = log_events(log.read_text(errors="replace"))
    return ServerStart(ready_s=ready_s, answer=answer, log=log, events=events)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_healthy(
    server: subprocess.Popen, url: str, started: float, log: Path
) -> float:
    while time.monotonic() - started < SERVER_START_SECONDS:
        if server.poll() is not None:
            raise ForkError(f"the server exited ({server.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5):
                return time.monotonic() - started
        except OSError:
            time.sleep(0.5)
    raise ForkError(f"the server did not start in {SERVER_START_SECONDS} s; see {log}")


def _complete(url: str, model: str, prompt: list[int]) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": 6, "temperature": 0}
    request = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())["choices"][0]["text"]


def _script(python: Path) -> list[str]:
    # -P: forktools/ must not come first on sys.path (its queue.py would
    # shadow the standard library's).
    return [str(python), "-P", str(SCRIPT)]


def _run(command: list[str], env, log: Path | None, cwd: Path | None = None) -> None:
    with open(log, "w") if log else open(os.devnull, "w") as output:
        result = subprocess.run(
            command,
            cwd=cwd,
            env=env,
            stdout=output if log else None,
            stderr=subprocess.STDOUT if log else None,
        )
    if result.returncode != 0:
        where = f"; its output is in {log}" if log else " (output above)"
        raise ForkError(f"`{' '.join(command)}` failed{where}")


def disk_usage(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def smoke(base: Base, tree: Path | None = None, keep: bool = False) -> list[str]:
    """Run the engine on ``tree`` (default: the base's fork tree): greedy
    tokens equal HF's, eager; then with compile kept on under LoRA and AOT
    compile, a cold start that saves the artifact and a warm one that loads
    it. Returns the report's lines; raises ForkError on any difference."""
    python = venv.ensure_engine(base)
    if python is None:
        raise ForkError(f"{base.name}: no engine pinned in upstream.toml")
    tree = tree or materialize.ensure(base)
    work = Path(tempfile.mkdtemp(prefix="vllm-fork-engine-"))
    try:
        return _smoke(python, tree, work)
    finally:
        if keep:
            print(f"engine smoke: kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def _smoke(python: Path, tree: Path, work: Path) -> list[str]:
    reference = make_model(python, work / "model")
    lines, problems = [], []
    eager = run_engine(
        python,
        work / "model",
        environment(tree, work / "cache-eager"),
        work / "eager.log",
    )
    lines.append(_describe("eager (LoRA on, compile off)", eager))
    lines.append(f"  vllm from {eager.vllm_file}; _C from {eager.kernels}")
    problems += _differences("eager", eager, reference, lora=True)
    cache = work / "cache-aot"
    for start in ("cold", "warm"):
        run = run_engine(
            python,
            work / "model",
            environment(tree, cache, **AOT_COMPILE),
            work / f"aot-{start}.log",
        )
        lines.append(_describe(f"AOT {start} (compile kept on)", run))
        problems += _differences(f"AOT {start}", run, reference, lora=False)
        expected = AOT_SAVED if start == "cold" else AOT_LOADED
        if not run.events[expected] or run.events[RECOMPILED]:
            problems.append(f"AOT {start}: expected {expected!r}; see {run.log}")
    lines.append(f"compile cache: {disk_usage(cache) / 1e6:.1f} MB in {cache}")
    if problems:
        raise ForkError("engine smoke failed:\n  " + "\n  ".join(problems + lines))
    return lines


def _describe(name: str, run: Run) -> str:
    events = ", ".join(f"{k!r} x{n}" for k, n in run.events.items() if n)
    return (
        f"{name}: LLM() {run.startup_s:.1f} s, process {run.seconds:.1f} s"
        f"{'; ' + events if events else ''}"
    )


def _differences(name: str, run: Run, reference: dict, lora: bool) -> list[str]:
    problems = []
    if run.base != reference["base"]:
        problems.append(f"{name}: base tokens {run.base} != HF {reference['base']}")
    if lora and run.lora != reference["lora"]:
        problems.append(f"{name}: LoRA tokens {run.lora} != HF {reference['lora']}")
    return problems
