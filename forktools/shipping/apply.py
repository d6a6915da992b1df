"""``make apply ONTO=<vLLM checkout>``: every fix that checkout needs, on a
new branch from its HEAD.

The checkout's vLLM version is read from the newest release tag on its
history (``git describe --tags``), else from ``vllm/_version.py`` (what a
build or an sdist leaves there); the fixes are those of the nearest pinned
base at or below it (``BASE=`` overrides), in series order, then those of
each newer queue that none before is a version of (bugs that came in after
that base). Each ends in one of:

- **has it**: the patch's ``Upstream-Status`` names a release at or before
  the checkout's, or the patch reverse-applies there;
- **applied**: ``git am --3way`` on the branch (``forktools.shipping.user_checkout``,
  as ``make pr ONTO=``), the queue's own patch or, where it does not apply,
  another queue's patch of the same fix (same subject or regression test
  module), or a port of it: the same fix and tests written on a release
  no queue is pinned to, kept as ``patches/<base>/ports/<release>/<the
  fix's patch name>``; the version written on the code nearest the
  checkout's is tried first; with ``python``, proved
  there: the fix's tests pass with it and fail without it (its source
  reverted, its tests kept), each failure the declared symptom. A fix whose
  tests pass without it is **not needed** on this build and is taken off the
  branch again; so is a fix whose bug came in with a later release than the
  checkout's (the queue's ``bugs_since.toml``);
- **conflict**: the run stops naming the file, the conflicted lines and the
  fix; ``git am --continue``, then ``make apply`` again, goes on from the
  branch.

``apply/<checkout>/APPLY.md`` reports the checkout, its version and how it
was read, and each fix's outcome; the command exits 1 unless every fix has
it, is not needed, or was applied and proved.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from forktools import proof
from forktools.queue import commits, materialize, pins, series, upstream
from forktools.queue.pins import Base, ForkError
from forktools.shipping import release_sdists, user_checkout
from forktools.shipping.user_checkout import git_in

HAS_IT, APPLIED, NOT_NEEDED, CONFLICT = "has it", "applied", "not needed", "conflict"
_VERSION_FILE = re.compile(r"""version\s*=\s*['"]v?([0-9][^'"+]*)""")


@dataclass(frozen=True)
class Version:
    """One version of a fix: a queue's patch, or a port of one to a release."""

    base: Base  # the queue that carries it; its symptoms judge the tests
    patch: Path
    release: str = ""  # a port: the release it was written on

    @property
    def short(self) -> str:
        return f"the {self.release} port" if self.release else f"{self.base.name}'s"

    @property
    def described(self) -> str:
        if self.release:
            return (
                f"its port to {self.release} (ports/{self.release}/{self.patch.name})"
            )
        return f"{self.base.name}'s version of it ({self.patch.name})"

    @property
    def folder(self) -> str:
        """Where a port and its symptoms are, under the queue's folder."""
        return f"{series.PORTS}/{self.release}" if self.release else ""

    @property
    def written_on(self) -> str:
        return self.release or self.base.version

    def blobs(self) -> Path:
        """A git repository holding the blobs the patch was written against."""
        if self.release:
            return release_sdists.checkout_of(self.release)
        return materialize.ensure(self.base)


def ports(base: Base, entry: series.Entry) -> list[Version]:
    """The ports of ``base``'s fix ``entry``, by release."""
    return [
        Version(base, base.patch_dir / port.name, release)
        for release, port in series.ports(base)
        if Path(port.name).name == entry.name
    ]


@dataclass(frozen=True)
class TestEnvironment:
    """Where the fixes' tests run: the Python of an environment with the
    checkout installed; ``cpu``: under the fork's CPU harness, on a machine
    without a GPU, as ``make verify`` runs them."""

    python: Path
    cpu: bool = False


@dataclass
class Fix:
    """One fix and what became of it in the checkout."""

    base: Base  # the queue that carries it
    entry: series.Entry
    outcome: str = ""
    how: str = ""
    proof: str = "-"

    @property
    def done(self) -> bool:
        proved = self.outcome == APPLIED and self.proof.startswith("proved")
        return proved or self.outcome in (HAS_IT, NOT_NEEDED)


def checkout_version(checkout: Path) -> tuple[str, str]:
    """The checkout's vLLM release version, and where it was read."""
    described = git_in(
        checkout, "describe", "--tags", "--abbrev=0", "--match", "v[0-9]*"
    )
    tag = described.stdout.strip()
    if described.returncode == 0 and pins.is_release(tag.removeprefix("v")):
        return tag.removeprefix("v"), f"the tag {tag} on its history"
    version_file = checkout / "vllm" / "_version.py"
    found = (
        _VERSION_FILE.search(version_file.read_text())
        if version_file.exists()
        else None
    )
    if found and pins.is_release(found[1]):
        return found[1], "vllm/_version.py"
    raise ForkError(
        f"ONTO={checkout}: cannot tell its vLLM version (no release tag v* on its "
        "history, no vllm/_version.py): give BASE=<the pinned base it is closest to>"
    )


def base_for(version: str, pinned: pins.Pins) -> Base:
    """The newest pinned base at or below ``version``."""
    below = [
        base
        for base in pinned.newest_first()
        if pins.version_key(base.version) <= pins.version_key(version)
    ]
    if not below:
        oldest = pinned.newest_first()[-1]
        raise ForkError(
            f"vLLM {version} is older than the oldest pinned base, {oldest.name}: "
            "no queue is made for it"
        )
    return below[0]


@dataclass
class Target:
    """The checkout being fixed, on its branch of the base's fixes."""

    checkout: Path
    version: str
    base: Base
    branch: str
    started_from: str  # where giving up switches back to
    on_branch: dict[str, str]  # an earlier run's fixes: subject -> commit


def main(
    checkout: Path, base_name: str | None, environment: TestEnvironment | None
) -> int:
    user_checkout.require_checkout(checkout)
    user_checkout.require_clean(checkout, "make apply")
    pinned = pins.load()
    if base_name:
        base = pinned.get(base_name)
        try:
            version, read_from = checkout_version(checkout)
        except ForkError:
            version, read_from = base.version, f"BASE={base.name}: none of its own"
    else:
        version, read_from = checkout_version(checkout)
        base = base_for(version, pinned)
    fixes = needed(base, pinned)
    subjects = {fix.entry.subject(fix.base) for fix in fixes}
    target = _target(checkout, version, base, subjects)
    try:
        for fix in fixes:
            _apply(fix, target, pinned, environment)
    finally:
        report = _report(target, read_from, fixes)
    for fix in fixes:
        print(f"apply: {_shown(fix, base)}: {fix.outcome}, {fix.how}; {fix.proof}")
    print(f"apply: {checkout}: branch {target.branch}; report {report}")
    return 0 if all(fix.done for fix in fixes) else 1


def needed(base: Base, pinned: pins.Pins) -> list[Fix]:
    """``base``'s fixes in series order, then those of each newer queue that
    no fix before it is a version of: bugs that came in after ``base``."""
    fixes = [Fix(base, entry) for entry in series.fixes(base)]
    oldest_first = pinned.newest_first()[::-1]
    newer = oldest_first[oldest_first.index(base) + 1 :]
    for other in newer:
        fixes += [
            Fix(other, entry)
            for entry in series.fixes(other)
            if not any(same_fix(fix.base, fix.entry, other, entry) for fix in fixes)
        ]
    return fixes


def _target(checkout: Path, version: str, base: Base, subjects: set[str]) -> Target:
    """Switch the checkout to the branch of ``base``'s fixes: a new one from
    HEAD, or the one an earlier run left, whose tip holds the fixes it
    applied (``subjects``)."""
    branch = f"vllm-fork/fixes-{base.name}"
    current = git_in(checkout, "branch", "--show-current").stdout.strip()
    if git_in(checkout, "rev-parse", "--verify", "-q", branch).returncode != 0:
        head = git_in(checkout, "rev-parse", "HEAD").stdout.strip()
        git_in(checkout, "switch", "--quiet", "-c", branch, check=True)
        return Target(checkout, version, base, branch, current or head, {})
    if current != branch:
        raise ForkError(
            f"{checkout} already has a branch {branch}: switch to it to go on "
            f"(git switch {branch}), or remove it (git branch -D {branch})"
        )
    log = git_in(checkout, "log", "--first-parent", "--format=%H %s", "-n", "200")
    on_branch = {}
    for line in log.stdout.splitlines():
        commit, _, subject = line.partition(" ")
        if subject not in subjects:
            return Target(checkout, version, base, branch, commit, on_branch)
        on_branch[subject] = commit
    raise ForkError(f"{checkout}: {branch} holds nothing but fixes; remove it")


def _apply(
    fix: Fix, target: Target, pinned: pins.Pins, environment: TestEnvironment | None
) -> None:
    base, entry, checkout = fix.base, fix.entry, target.checkout
    if earlier := target.on_branch.get(entry.subject(base)):
        fix.outcome, fix.how = APPLIED, "on the branch from an earlier run"
        applied = _applied_version(base, entry, target, pinned, earlier)
        _prove_if(fix, applied, checkout, earlier, environment)
        return
    if later := _bug_came_later(base, entry, target.version):
        since, why = later
        fix.outcome, fix.how = NOT_NEEDED, f"the bug came in with {since} ({why})"
        return
    if held := _has_it(base, entry, target.version, checkout):
        fix.outcome, fix.how = HAS_IT, held
        return
    taken = _first_applying(base, entry, target.version, pinned, checkout)
    if taken:
        version, applied = taken
        fix.outcome = APPLIED
        output = applied.stdout + applied.stderr
        fix.how = "three-way" if "3-way" in output else "clean"
        if version.patch != base.patch_dir / entry.name:
            fix.how += f", {version.described}"
    else:
        fix.outcome, fix.how = CONFLICT, "applies from no queue"
        patch = base.patch_dir / entry.name
        applied = _am(Version(base, patch), checkout)
        shown = f"patches/{base.name}/{entry.name}"
        stopped = user_checkout.conflict(
            shown,
            patch,
            checkout,
            target.branch,
            target.started_from,
            applied,
            "make apply",
        )
        raise ForkError(f"{stopped}\n{_why_conflict(base, entry, target.version)}")
    head = git_in(checkout, "rev-parse", "HEAD").stdout.strip()
    _prove_if(fix, version, checkout, head, environment)


def _applied_version(
    base: Base, entry: series.Entry, target: Target, pinned: pins.Pins, commit: str
) -> Version:
    """The version of the fix an earlier run put on the branch as ``commit``:
    the one whose message it carries (a port's has its own ``Port:``
    paragraph), so that the proof judges it by that version's symptoms."""
    carried = git_in(target.checkout, "log", "-1", "--format=%b", commit).stdout
    for version in _versions(base, entry, target.version, pinned):
        if upstream.message_of(version.patch.read_text()).split() == carried.split():
            return version
    return Version(base, base.patch_dir / entry.name)


def _first_applying(
    base: Base, entry: series.Entry, release: str, pinned: pins.Pins, checkout: Path
) -> tuple[Version, subprocess.CompletedProcess[str]] | None:
    """The first version of the fix (``_versions``) that applies onto the
    checkout of vLLM ``release``, committed there; None, the checkout as it
    was, if none does."""
    for version in _versions(base, entry, release, pinned):
        applied = _am(version, checkout)
        if applied.returncode == 0:
            return version, applied
        git_in(checkout, "am", "--abort")
    return None


def _prove_if(
    fix: Fix,
    version: Version,
    checkout: Path,
    commit: str,
    environment: TestEnvironment | None,
) -> None:
    if environment is None:
        fix.proof = (
            "not proved here (PYTHON=: an environment with the checkout installed)"
        )
    else:
        _prove(fix, version, checkout, commit, environment)


def try_alone(
    checkout: Path, base: Base, entry: series.Entry, version: str, pinned: pins.Pins
) -> str:
    """What ``make apply`` makes of ``entry`` alone on the clean ``checkout``
    of vLLM ``version``, which is left as it was: "has it (...)", "applies",
    "applies as <base>'s", "applies as the <release> port", "no code" (none
    of the files it fixes is there), "no bug (came in <release>)" or "port
    needed"."""
    sources = [name for name in entry.changed_files(base) if name.startswith("vllm/")]
    if later := _bug_came_later(base, entry, version):
        return f"no bug (came in {later[0]})"
    if held := _has_it(base, entry, version, checkout):
        released = entry.upstream_status(base).released_in
        return f"{HAS_IT} (v{released})" if "released" in held else f"{HAS_IT} (code)"
    if not any((checkout / name).exists() for name in sources):
        return "no code"
    head = git_in(checkout, "rev-parse", "HEAD").stdout.strip()
    taken = _first_applying(base, entry, version, pinned, checkout)
    if not taken:
        return "port needed"
    git_in(checkout, "reset", "--quiet", "--hard", head, check=True)
    taken_version = taken[0]
    if taken_version.patch == base.patch_dir / entry.name:
        return "applies"
    return f"applies as {taken_version.short}"


def _why_conflict(base: Base, entry: series.Entry, version: str) -> str:
    """Whether the bug is gone or the code moved, as far as the patch's
    Upstream-Status tells."""
    released = entry.upstream_status(base).released_in
    upstream = f"upstream fixed it in v{released}" if released else "upstream lacks it"
    return (
        f"vLLM {version} has the bug ({upstream}, its source changes do not "
        "reverse-apply) and no queue's version of the fix applies: the code "
        "moved, the fix needs a port for this release."
    )


def _bug_came_later(
    base: Base, entry: series.Entry, version: str
) -> tuple[str, str] | None:
    """The release ``entry``'s bug came in with and why, where that is later
    than vLLM ``version`` (``bugs_since.toml``); else None."""
    since, why = series.bugs_since(base).get(entry.name, ("", ""))
    if since and pins.version_key(version) < pins.version_key(since):
        return since, why
    return None


def _has_it(base: Base, entry: series.Entry, version: str, checkout: Path) -> str:
    """Why the checkout already holds ``entry``'s fix, or ""."""
    released = entry.upstream_status(base).released_in
    if released and pins.version_key(released) <= pins.version_key(version):
        return f"upstream's own fix, released in v{released}"
    patch = str(base.patch_dir / entry.name)
    source = ("--include=vllm/*", "--check", "--reverse", patch)
    if git_in(checkout, "apply", *source).returncode == 0:
        return "its source changes reverse-apply"
    return ""


def _versions(
    base: Base, entry: series.Entry, release: str, pinned: pins.Pins
) -> list[Version]:
    """Every version of the fix: ``base``'s patch, the other queues' versions
    of it (``same_fix``) and its ports, the one written on the code nearest
    the checkout's ``release`` first (``_nearest_code``)."""
    versions = [Version(base, base.patch_dir / entry.name)]
    for other in pinned.newest_first():
        if other is not base:
            versions += [
                Version(other, other.patch_dir / candidate.name)
                for candidate in series.fixes(other)
                if same_fix(base, entry, other, candidate)
            ]
    return sorted(versions + ports(base, entry), key=_nearest_code(release))


def _nearest_code(release: str):
    """Versions written on a release at or below ``release`` (code the
    checkout's grew from) first, the newest of them first; then the others,
    nearest first; ``base``'s own patch before an equal one."""

    def key(version: Version) -> tuple[bool, tuple[int, ...]]:
        above = pins.version_key(version.written_on) > pins.version_key(release)
        return above, _distance(version.written_on, release)

    return key


def _distance(version: str, other: str) -> tuple[int, ...]:
    pairs = zip(pins.version_key(version), pins.version_key(other), strict=True)
    return tuple(abs(a - b) for a, b in pairs)


def same_fix(
    base: Base, entry: series.Entry, other: Base, candidate: series.Entry
) -> bool:
    """Whether ``candidate`` of ``other``'s queue is a version of ``entry``
    of ``base``'s: the same subject, or a regression test module in common
    (a fix written again for newer code)."""
    if candidate.subject(other) == entry.subject(base):
        return True
    return bool(entry.new_test_modules(base) & candidate.new_test_modules(other))


def _am(version: Version, checkout: Path) -> subprocess.CompletedProcess[str]:
    user_checkout.bring_blobs(version.blobs(), version.patch, checkout)
    return git_in(checkout, "am", "--3way", "--keep-non-patch", str(version.patch))


def _prove(
    fix: Fix,
    version: Version,
    checkout: Path,
    commit: str,
    environment: TestEnvironment,
) -> None:
    """The tests of the fix ``commit`` in the checkout with it (HEAD) and
    without it (its source changes reverted there for the run, its tests
    kept), judged as ``make verify`` judges a row; a fix at the tip whose
    tests pass without it is taken off again. They run in the checkout
    itself: its build's files (compiled extensions, ``_version.py``) are not
    in git."""
    tests = commits.added_tests(checkout, commit)
    if not tests:
        fix.proof = "not proved: the patch adds no test"
        return
    changed = git_in(checkout, "diff", "--name-only", f"{commit}~1", commit).stdout
    _forget_bytecode(checkout, changed.split())
    with_fix = _run(checkout, environment, tests, "with")
    source = git_in(checkout, "diff", f"{commit}~1", commit, "--", "vllm").stdout
    reverted = subprocess.run(
        ["git", "-C", str(checkout), "apply", "--reverse"],
        input=source,
        capture_output=True,
        text=True,
    )
    if reverted.returncode != 0:
        fix.proof = "NOT proved: its source changes do not revert at HEAD"
        return
    try:
        _forget_bytecode(checkout, changed.split())
        without = _run(checkout, environment, tests, "without")
    finally:
        git_in(checkout, "checkout", "--quiet", "HEAD", "--", "vllm", check=True)
        _forget_bytecode(checkout, changed.split())
    problems = proof.judge_without_fix(version.base, without, version.folder)
    if with_fix.failed or with_fix.errors:
        fix.proof = f"NOT proved: with it, {with_fix.failed} of {with_fix.total} failed"
    elif not without.failed and not without.errors:
        fix.outcome, fix.how = NOT_NEEDED, "its tests pass without it here"
        left = _take_off(checkout, commit)
        fix.proof = f"{without.passed}/{without.total} passed without it; {left}"
    elif problems or without.errors:
        fix.proof = "NOT proved: without it, " + "; ".join(problems + without.errors)
    else:
        fix.proof = (
            f"proved: {with_fix.passed}/{with_fix.total} passed with it, "
            f"{without.failed}/{without.total} failed without it, as declared"
        )


def _forget_bytecode(checkout: Path, paths: list[str]) -> None:
    """Remove the compiled bytecode of ``paths``: Python trusts a ``.pyc``
    whose source has the size and mtime second it recorded, which a fix
    applied or reverted within the second can keep."""
    for name in paths:
        source = checkout / name
        if source.suffix == ".py":
            for compiled in source.parent.glob(f"__pycache__/{source.stem}.*.pyc"):
                compiled.unlink()


def _take_off(checkout: Path, commit: str) -> str:
    """Take the fix ``commit`` off the branch where it is the tip."""
    if git_in(checkout, "rev-parse", "HEAD").stdout.strip() != commit:
        return f"left on the branch (git rebase --onto {commit[:12]}~1 {commit[:12]})"
    git_in(checkout, "reset", "--quiet", "--hard", f"{commit}~1", check=True)
    return "left off"


def _run(
    checkout: Path, environment: TestEnvironment, tests: list[str], half: str
) -> proof.Outcome:
    print(f"apply: {half} the fix: {len(tests)} test(s)", file=sys.stderr)
    label = f"apply {half}"
    if environment.cpu:
        return proof.run_tests(environment.python, checkout, tests, label=label)
    with tempfile.TemporaryDirectory() as tmp:
        plugin = Path(tmp)
        report_plugin = proof.HARNESS / "vllm_fork_report.py"
        (plugin / report_plugin.name).write_bytes(report_plugin.read_bytes())
        return proof.run_tests(
            environment.python, checkout, tests, label=label, harness=plugin
        )


def _shown(fix: Fix, base: Base) -> str:
    """The fix's patch name, with its queue where that is not ``base``."""
    return fix.entry.name if fix.base is base else f"{fix.base.name} {fix.entry.name}"


def _report(target: Target, read_from: str, fixes: list[Fix]) -> Path:
    checkout, base = target.checkout, target.base
    started = user_checkout.describe(checkout, target.started_from)
    head = user_checkout.describe(checkout, "HEAD")
    rows = [
        f"| {_shown(fix, base)} | {fix.outcome or 'not reached'} | {fix.how} | "
        f"{fix.proof} |"
        for fix in fixes
    ]
    lines = [
        f"# The fixes of {base.name} on {checkout}",
        "",
        f"- checkout: `{started}`, vLLM {target.version} (read from {read_from})",
        f"- branch: `{target.branch}`, at `{head}`: the fixes of the "
        f"{base.name} queue in series order, then those only a newer queue "
        "carries",
        "",
        "| fix | outcome | how | its tests there |",
        "|---|---|---|---|",
        *rows,
        "",
    ]
    report = pins.ROOT / "apply" / checkout.resolve().name / "APPLY.md"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text("\n".join(lines))
    return report
