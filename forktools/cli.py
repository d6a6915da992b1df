"""``python -m forktools``: the fork's commands (the Makefile calls these)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from forktools.queue import check, env_factors, export, materialize, pins
from forktools.queue.pins import ForkError


def _bases(args) -> list[pins.Base]:
    """``--base``, else ``VLLM_FORK_BASE`` (refused when it pins nothing),
    else every pinned base."""
    pinned = pins.load()
    if getattr(args, "base", None) or os.environ.get(pins.BASE_ENV):
        return [pinned.get(getattr(args, "base", None))]
    return pinned.newest_first()


def cmd_fork(args) -> int:
    """Materialize the fork tree of a base and link vllm/, tests/ to it."""
    base = pins.load().get(args.base)
    materialize.ensure(base)
    materialize.select(base)
    print(f"vllm/ and tests/ are vLLM {materialize.version(base)}")
    return 0


def cmd_export(args) -> int:
    """Write the tree's commits back into patches/<base>/."""
    base = pins.load().get(args.base or materialize.selected())
    names = export.export(base)
    print(f"patches/{base.name}: {len(names)} patch(es) exported")
    for name in names:
        print(f"  {name}")
    return 0


def cmd_check(args, proving: bool = False) -> int:
    """Fail when patches/ and the fork trees disagree, or a proof ledger is
    stale; ``proving`` (``make test``, whose verify stage proves them next)
    lets rows that only need proving pass."""
    from forktools import proof

    found, checked = [], []
    for base in _bases(args):
        if getattr(args, "here", False) and not materialize.is_current(base):
            print(
                f"check: {base.name}: not checked, its tree is not built for this "
                f"queue (make check BASE={base.name} builds it)",
                file=sys.stderr,
            )
            continue
        checked.append(base)
        problems = check.problems(base) + proof.symptom_problems(base)
        found += problems + [p for p in _stale(base, proving) if p not in problems]
        if proof.ledger_path(base).exists():
            print(f"check: {proof.proved_here(base)}")
    found += env_factors.hashed_but_ignored_later(_built_trees(), checked)
    for problem in found:
        print(f"check: {problem}", file=sys.stderr)
    if not checked:
        print("check: nothing checked (no base's tree is built for its queue)")
    elif not found and proving:
        print("check: patches/ and the fork trees agree; verify proves what changed")
    elif not found:
        print("check: patches/ and the fork trees agree; the proof ledgers are current")
    return 1 if found else 0


def _built_trees() -> dict[pins.Base, Path]:
    """The fork tree of every pinned base built for its queue."""
    return {
        base: materialize.tree_dir(base)
        for base in pins.load().bases.values()
        if materialize.is_current(base)
    }


def _stale(base, proving: bool) -> list[str]:
    """The ledger's stale rows, or why they cannot be planned (a problem
    ``check.problems`` may name too)."""
    from forktools import proof

    try:
        return proof.stale(base, proving)
    except ForkError as error:
        return [str(error)]


def cmd_fixes(args) -> int:
    """The queue's patches that change vllm/, in order: the paths to git am."""
    from forktools.queue import series

    base = pins.load().get(args.base)
    for entry in series.fixes(base):
        print(base.patch_dir / entry.name)
    return 0


def cmd_status(args) -> int:
    """A queue's patches: fix or test, upstream status, which newer releases hold it."""
    from forktools.environments import relock
    from forktools.queue import status
    from forktools.shipping import wheel

    bases = _bases(args) if args.wide else [pins.load().get(args.base)]
    return status.main(bases, args.fetch, args.wide, relock.moves, wheel.status_lines)


def cmd_verify(args) -> int:
    """Prove each commit's tests fail without it and pass with it."""
    from forktools import proof

    # make test runs this with its own arguments, which have no --hunks.
    if getattr(args, "hunks", False):
        return proof.main("hunks", _bases(args), patch=args.patch)
    if getattr(args, "patch", None) is not None:
        raise ForkError("--patch goes with --hunks (make verify HUNKS=1 PATCH=n)")
    return proof.main(
        "verify",
        _bases(args),
        jobs=args.jobs,
        fresh=args.fresh,
        audit=args.audit,
        seed=args.audit_seed,
        audit_minutes=args.audit_minutes,
    )


def cmd_lint(args) -> int:
    """Upstream's CI checks (ruff, typos, mypy, hooks) on every queue; sign-offs."""
    from forktools.shipping import lint

    return lint.main(_bases(args))


def cmd_read_only(args) -> int:
    """The queue's read-only cache tests again, with every capability dropped."""
    from forktools import proof
    from forktools.proof import AUDIT_MINUTES

    return proof.main(
        "read-only",
        _bases(args),
        fresh=getattr(args, "fresh", False),
        seed=getattr(args, "audit_seed", None),
        audit_minutes=getattr(args, "audit_minutes", AUDIT_MINUTES),
        jobs=getattr(args, "jobs", None),
    )


def cmd_costs(args) -> int:
    """Where the proof's test-seconds go: per test file, from the ledgers."""
    from forktools import proof

    return proof.main("costs", _bases(args))


def cmd_bench(args) -> int:
    """Fork vs pristine costs, written to BENCHMARKS.md."""
    from forktools.engine import bench

    names = args.figures.split(",") if args.figures else None
    return bench.main(_bases(args), names)


def cmd_pr(args) -> int:
    """One patch for upstream: signed off by you, on the pristine release, PR body."""
    from forktools.shipping import pr

    onto = Path(args.onto).expanduser() if args.onto else None
    if args.python and not onto:
        raise ForkError("--python goes with --onto: the environment of that checkout")
    python = Path(args.python).expanduser() if args.python else None
    return pr.main(pins.load().get(args.base), args.patch, onto, python)


def cmd_apply(args) -> int:
    """Every fix your vLLM checkout needs, on a new branch, each proved there."""
    from forktools.shipping import apply

    if args.cpu and not args.python:
        raise ForkError("--cpu goes with --python: the environment the tests run in")
    environment = (
        apply.TestEnvironment(Path(args.python).expanduser(), args.cpu)
        if args.python
        else None
    )
    return apply.main(Path(args.onto).expanduser(), args.base, environment)


def cmd_releases(args) -> int:
    """Every release from the oldest pin to the newest, against every fix."""
    from forktools.shipping import releases

    return releases.main()


def cmd_rebase(args) -> int:
    """Carry the newest queue onto a new upstream release, with a report."""
    from forktools import proof
    from forktools.queue import rebase

    probe = proof.probe_tests if args.probe_tests else None
    report = rebase.rebase(args.to, probe=probe, ported=args.ported)
    print(report.read_text())
    return 0 if rebase.is_complete(report) else 1


def cmd_wheel(args) -> int:
    """Build the fork wheel: the pinned upstream wheel with the queue in place."""
    import time

    from forktools.shipping import wheel

    base = pins.load().get(args.base)
    artifacts = base.wheels if args.all_platforms else [base.wheel_for_this_machine()]
    out = Path(args.out) if args.out else wheel.default_out()
    unlocked = 0
    for artifact in artifacts:
        started = time.monotonic()
        built = wheel.build(base, artifact, out)
        manifest = wheel.write_manifest(built)
        seconds = time.monotonic() - started
        print(f"{built.path}  ({seconds:.1f} s)")
        print(f"  sha256 {built.sha256}")
        print(f"  from {artifact.file} (sha256 {artifact.sha256})")
        print(f"  manifest {manifest}")
        if args.no_lock:
            continue
        try:
            hashed, plain = wheel.write_locks(base, built, artifact)
        except ForkError as error:
            print(f"vllm-fork: {error}", file=sys.stderr)
            unlocked += 1
            continue
        print(f"  lock {hashed}")
        print(f"  constraints {plain}")
    return 1 if unlocked else 0


def cmd_venv(args) -> int:
    """Build (if needed) and print each base's test environment."""
    from forktools.environments import venv

    for base in _bases(args):
        print(venv.ensure(base))
    return 0


def cmd_lock(args) -> int:
    """Write each environment's lock from the package index, printing each move."""
    from forktools import proof
    from forktools.environments import relock
    from forktools.shipping import precommit

    bases = _bases(args)
    recorded = proof.recorded_environments if args.from_ledger else None
    return relock.main(bases, recorded, precommit.tool_environments(bases))


def cmd_engine_env(args) -> int:
    """Build (if needed) and print each base's CPU engine environment."""
    from forktools.environments import venv

    for base in _bases(args):
        python = venv.ensure_engine(base)
        print(f"{base.name}: {python or 'no engine pinned in upstream.toml'}")
        if python and args.smoke:
            from forktools.engine import llm

            tree = Path(args.tree) if args.tree else None
            for line in llm.smoke(base, tree, keep=args.keep):
                print(f"  {line}")
    return 0


def _environments(bases: list[pins.Base]) -> list[Path]:
    """Each base's tree, test and engine environments, built side by side (an
    install keeps about one core busy); the bases' test Pythons."""
    import concurrent.futures

    from forktools import proof
    from forktools.environments import venv

    def test_environment(base: pins.Base) -> Path:
        materialize.ensure(base)
        python = venv.ensure(base)
        if base.engine and base.engine.kernels_only:
            venv.ensure_engine(base)  # a layer over the test environment
        return python

    own_engines = [b for b in bases if b.engine and not b.engine.kernels_only]
    with concurrent.futures.ThreadPoolExecutor(proof.default_jobs()) as pool:
        # An engine of its own takes as long as a test environment: start it
        # first, beside them, rather than after its base's.
        engines = [pool.submit(venv.ensure_engine, base) for base in own_engines]
        pythons = list(pool.map(test_environment, bases))
        for engine in engines:
            engine.result()
    return pythons


def cmd_test_tooling(args) -> int:
    """The tooling's own tests, on this Python, over the CPUs (no base needed)."""
    return _tooling_tests(sys.executable)


def _tooling_tests(python: str) -> int:
    """Runs forktools/tests on ``python``, spread over up to four CPUs by
    pytest-xdist (installed once into the cache), else in one process."""
    import subprocess

    from forktools.environments import tools
    from forktools.queue.pins import ROOT

    command = [python, "-m", "pytest", "-q", "forktools/tests"]
    # The host's pytest plugins (pytest-benchmark, ...) are not the tooling's.
    environment = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    workers = min(4, os.cpu_count() or 1)
    try:
        plugin = tools.packages(tools.XDIST) if workers > 1 else None
    except ForkError as error:
        print(f"tooling tests in one process: {error}", file=sys.stderr, flush=True)
        plugin = None
    if plugin:
        path = [str(plugin), *filter(None, [environment.get("PYTHONPATH")])]
        environment["PYTHONPATH"] = os.pathsep.join(path)
        command += ["-p", "xdist.plugin", "-n", str(workers), "--dist", "loadfile"]
    return subprocess.run(command, cwd=ROOT, env=environment).returncode


def cmd_test(args) -> int:
    """Everything CI runs: tooling tests, lint, check, verify, read-only tests."""
    import concurrent.futures
    import time

    bases = _bases(args)
    pythons: list[Path] = []

    def environments() -> int:
        pythons.extend(_environments(bases))
        return 0

    def tooling_tests() -> int:
        return _tooling_tests(str(pythons[0]))

    stages = {
        "environments": environments,
        "tooling tests": tooling_tests,
        "lint": lambda: cmd_lint(args),
        "check": lambda: cmd_check(args, proving=True),
        "verify": lambda: cmd_verify(args),
        "read-only tests": lambda: cmd_read_only(args),
    }
    failed, minutes = [], []

    def timed(name: str) -> int:
        print(f"\n== {name}", flush=True)
        started = time.monotonic()
        code = stages[name]()
        took = f"{(time.monotonic() - started) / 60:.1f}"
        print(f"== {name}: {took} min", flush=True)
        minutes.append(f"{name} {took}")
        if code != 0:
            failed.append(name)
        return code

    # Lint needs no environment of a base (its tools have their own): it
    # runs beside the environments, which wait on downloads and the disk.
    with concurrent.futures.ThreadPoolExecutor(1) as beside:
        linted = beside.submit(timed, "lint")
        timed("environments")
        linted.result()
    if "environments" not in failed:
        for name in ("tooling tests", "check", "verify", "read-only tests"):
            timed(name)
    print(f"\nfailed: {', '.join(failed)}" if failed else "")
    print(f"minutes: {', '.join(minutes)}")
    print(f"stages: {len(stages) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


COMMANDS = {
    "fork": cmd_fork,
    "export": cmd_export,
    "check": cmd_check,
    "fixes": cmd_fixes,
    "status": cmd_status,
    "verify": cmd_verify,
    "lint": cmd_lint,
    "bench": cmd_bench,
    "pr": cmd_pr,
    "apply": cmd_apply,
    "releases": cmd_releases,
    "rebase": cmd_rebase,
    "wheel": cmd_wheel,
    "venv": cmd_venv,
    "lock": cmd_lock,
    "engine-env": cmd_engine_env,
    "read-only": cmd_read_only,
    "costs": cmd_costs,
    "test": cmd_test,
    "test-tooling": cmd_test_tooling,
}
BASE_DEFAULT = {
    "fork": "$VLLM_FORK_BASE, else upstream.toml's default",
    "export": "the selected tree's",
    "pr": "$VLLM_FORK_BASE, else upstream.toml's default",
    "status": "$VLLM_FORK_BASE, else upstream.toml's default; with --wide every base",
    "fixes": "$VLLM_FORK_BASE, else upstream.toml's default",
    "wheel": "$VLLM_FORK_BASE, else upstream.toml's default",
    "apply": "the nearest pinned base at or below the checkout's vLLM version",
}


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole number: {text!r}")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(text)


def _minutes(text: str) -> float:
    try:
        minutes = float(text)
    except ValueError:
        minutes = -1.0
    if minutes < 0:
        raise argparse.ArgumentTypeError(f"not a number of minutes: {text!r}")
    return minutes


def parser() -> argparse.ArgumentParser:
    from forktools.proof import AUDIT_MINUTES

    top = argparse.ArgumentParser(
        prog="python -m forktools",
        description="Carry vLLM fork patches as queues on pinned upstream releases.",
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, func in COMMANDS.items():
        summary = func.__doc__.splitlines()[0]
        command = sub.add_parser(name, help=summary, description=summary)
        if name not in ("rebase", "releases", "test-tooling"):
            default = BASE_DEFAULT.get(name, "every base")
            command.add_argument(
                "--base", help=f"a base pinned in upstream.toml (default: {default})"
            )
        command.set_defaults(func=func)
    sub.choices["pr"].add_argument(
        "--patch", type=int, required=True, help="the patch's number in series"
    )
    sub.choices["pr"].add_argument(
        "--onto",
        help="a vLLM git checkout of yours (upstream main, say): the patch goes "
        "there on a new branch vllm-fork/<patch>, three-way, and PR.md says which "
        "commit it was rebased onto and what passed there",
    )
    sub.choices["pr"].add_argument(
        "--python",
        help="with --onto: the Python of an environment where that checkout is "
        "installed; the patch's tests run there with it (without it they do not)",
    )
    sub.choices["pr"].epilog = (
        "Writes pr/<base>/<patch>/: the patch as `git am --keep-non-patch` applies "
        "it to the pristine release, signed off by your git user.name and "
        "user.email (also its author where the fork's is the maintainers' alias), "
        "without the fork's Upstream-Status: trailer; and PR.md, the "
        "body (its test result quotes the patch's proof ledger row). The same "
        "commit is branch pr/<patch> of the base's fork tree. Says whether the "
        "patch applies to the newest pinned release. Refuses when your git "
        "identity is unset or "
        "at a made-up domain (DCO needs a person's), for a fork-only patch "
        "(Upstream-Status: Inappropriate), and for a backport of a fix upstream "
        "has released (Upstream-Status: Backport)."
    )
    sub.choices["apply"].add_argument(
        "--onto",
        required=True,
        help="your vLLM git checkout, clean: the fixes go there on a new branch "
        "vllm-fork/fixes-<base> from its HEAD",
    )
    sub.choices["apply"].add_argument(
        "--python",
        help="the Python of an environment where that checkout is installed: "
        "each applied fix's tests run there with it and without it",
    )
    sub.choices["apply"].add_argument(
        "--cpu",
        action="store_true",
        help="with --python, on a machine without a GPU: run the tests under the "
        "fork's CPU harness (forktools/engine/harness: the CPU platform pinned, "
        "stand-in schemas for the CUDA kernels' ops), as make verify does",
    )
    sub.choices["apply"].epilog = (
        "Reads the checkout's vLLM version from its newest release tag, else from "
        "vllm/_version.py. Each fix of the base's queue, in series order: has it "
        "(its release or a reverse-apply), applied (the queue's patch or another "
        "queue's version of it, three-way), not needed (its tests pass without "
        "it there: left off), or conflict (stops naming the file and lines; "
        "git am --continue, then apply again, goes on). Writes "
        "apply/<checkout>/APPLY.md; exits 1 unless every fix has it, is not "
        "needed, or was applied and proved."
    )
    sub.choices["fixes"].epilog = (
        "One absolute path per line, in series order, for `git am "
        "--keep-non-patch $(make -s -C <this repository> fixes BASE=...)` in "
        "a vLLM checkout of that release. The other patches change only tests: "
        "the fork's own (Upstream-Status: Inappropriate) and upstream-style "
        "tests for fixes upstream shipped without one (Test-only). `make check` "
        "applies the fixes in this order on the pristine release."
    )
    sub.choices["bench"].add_argument(
        "--figures",
        help="measure only these figures (comma-separated names, as in "
        "BENCHMARKS.md's 'How each figure is measured'), keeping the other rows",
    )
    sub.choices["check"].add_argument(
        "--here",
        action="store_true",
        help="check only the bases whose fork tree is built for the queue; build "
        "and download nothing (the pre-commit hook)",
    )
    sub.choices["status"].add_argument(
        "--wide",
        action="store_true",
        help="every base (or --base), each patch's full upstream status and "
        "file name, as wide as that takes",
    )
    sub.choices["status"].add_argument(
        "--fetch",
        action="store_true",
        help="download and build the newer releases' pristine trees that are not "
        "here yet, and ask the package index for releases newer than the newest "
        "pin (default: use what is here, download nothing)",
    )
    sub.choices["rebase"].add_argument(
        "--to", required=True, help="the upstream release to move to, e.g. 0.34.0"
    )
    sub.choices["rebase"].add_argument(
        "--probe-tests",
        action="store_true",
        help="first run each fix's tests on the new release without it (builds "
        "its test environment); all passing drops the patch as already upstream",
    )
    sub.choices["rebase"].add_argument(
        "--ported",
        action="store_true",
        help="the previous queue changed after this rebase and you ported the "
        "change into the new queue by hand (and exported it): record that, so "
        "the finished rebase counts as up to date again",
    )
    sub.choices["read-only"].add_argument(
        "--fresh",
        action="store_true",
        help="run them again even where patches/<base>/read_only.json's key holds",
    )
    for name in ("verify", "test"):
        command = sub.choices[name]
        command.add_argument(
            "--jobs",
            type=_positive,
            help="test runs at once, rows of every base side by side, each "
            "keeping about one core busy (default: one per CPU)",
        )
        command.add_argument(
            "--fresh",
            action="store_true",
            help="prove every row again, ignoring the proof ledger",
        )
        command.add_argument(
            "--audit",
            type=_count,
            help="instead of the rotation: this many reused ledger rows to prove "
            "again, picked at random",
        )
        command.add_argument(
            "--audit-minutes",
            type=_minutes,
            default=AUDIT_MINUTES,
            help="wall-clock minutes that one slot of the audit's rotation fits: "
            "a run proves its slot's reused rows again (both halves), then rows "
            "proved on another kind of machine with what its own proofs leave; "
            "failing when one differs from its record; 0 audits nothing "
            "(default: %(default)g)",
        )
        command.add_argument(
            "--audit-seed",
            type=_count,
            help="the rotation's turn (default: the commit count), or with "
            "--audit the seed that picks rows (default: a random one); printed",
        )
    sub.choices["verify"].add_argument(
        "--hunks",
        action="store_true",
        help="instead: for each fix patch, revert each of its source hunks alone "
        "and run the patch's tests; names every hunk no test needs (a test run "
        "per hunk; nothing is kept in the ledger)",
    )
    sub.choices["verify"].add_argument(
        "--patch",
        type=_positive,
        help="with --hunks: only patch number N of the queue (1 = the first)",
    )
    sub.choices["lock"].add_argument(
        "--from-ledger",
        action="store_true",
        help="lock the sets that patches/<base>/proof.json records instead of "
        "what the index serves today (every ledger key stays valid)",
    )
    sub.choices["lock"].epilog = (
        "Writes locks/<base>/test.txt (and engine.txt where the base pins a CPU "
        "engine): every distribution with its file's sha256, resolved by pip, "
        "run by the Python that makes the environment, under pip's own "
        "configuration (pip config list). Environments are built from them "
        "with --require-hashes --no-deps. A moved lock re-keys the base's proof "
        "ledger rows: review the moves, then `make verify`."
    )
    engine_env = sub.choices["engine-env"]
    engine_env.add_argument(
        "--smoke",
        action="store_true",
        help="then run the engine on the fork tree: a tiny Llama with LoRA, "
        "greedy tokens against HF transformers', and an AOT compile cold and "
        "warm (minutes)",
    )
    engine_env.add_argument(
        "--tree", help="with --smoke: run these sources (default: the fork tree)"
    )
    engine_env.add_argument(
        "--keep", action="store_true", help="with --smoke: keep the model and logs"
    )
    sub.choices["wheel"].add_argument(
        "--all-platforms",
        action="store_true",
        help="one wheel per pinned upstream wheel (x86_64, aarch64), not only "
        "this machine's",
    )
    sub.choices["wheel"].add_argument(
        "--out", help="where to write the wheels (default: dist/ in the repository)"
    )
    sub.choices["wheel"].add_argument(
        "--no-lock",
        action="store_true",
        help="write the wheel alone, without resolving its requirements into "
        "the node lock beside it (which asks the package index)",
    )
    sub.choices["wheel"].epilog = (
        "Beside each wheel of this machine's platform: <wheel>.pythonX.Y.lock.txt, "
        "its requirements resolved by pip on this Python with each file's "
        "sha256 (a node runs `pip install --require-hashes --no-deps -r` it, "
        "then `pip install --no-deps` the wheel), and "
        "<wheel>.pythonX.Y.constraints.txt, the same versions for `pip install "
        "-c` it `-e .`. Exits 1 when a lock could not be written (the wheel is "
        "kept): a requirement the index does not serve, or another platform."
    )
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except ForkError as e:
        print(f"vllm-fork: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `make status | head -1`: the reader has all it wants
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
