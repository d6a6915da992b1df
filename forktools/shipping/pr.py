"""``make pr``: one patch of a queue, made ready to submit upstream.

``pr/<base>/<patch stem>/`` gets the patch as it applies to the pristine
release (``git am --keep-non-patch``), signed off by the submitter, and
``PR.md``, the pull-request body. The fork's own trailers stay behind:
``Upstream-Status:`` is ours, and a sign-off or authorship at a made-up
domain (the maintainers' alias) is no person's, so DCO cannot take it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from forktools import proof
from forktools.environments import venv
from forktools.proof import Outcome, Proof
from forktools.queue import commits, git, materialize, pins, series, upstream
from forktools.queue.pins import Base, ForkError
from forktools.shipping import user_checkout
from forktools.shipping.user_checkout import git_in

# Reserved for examples and tests (RFC 2606, RFC 6761): nobody receives mail there.
MADE_UP_DOMAIN = re.compile(
    r"(^|\.)(example|invalid|localhost|test)$|(^|\.)example\.(com|net|org)$"
)
SET_IDENTITY = (
    "set your identity: git config --global user.name 'Your Name' && "
    "git config --global user.email you@your.domain"
)
_APPLY_FAILURE = re.compile(
    r"^error: (?:patch failed: (?P<at>\S+?):\d+|(?P<file>\S+?): "
    r"(?:patch does not apply|does not exist in index|already exists in index))",
    re.MULTILINE,
)
FORK_STATUS_PARAGRAPH = "Upstream status:"
REPORT_PLUGIN = "vllm_fork_report"
_OFFSET = re.compile(r"^Hunk #\d+ succeeded at \d+ \(offset (-?\d+) lines?\)", re.M)


@dataclass(frozen=True)
class Identity:
    name: str
    email: str

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>"


@dataclass(frozen=True)
class Submission:
    directory: Path
    patch: Path
    body: Path
    branch: str
    tree: Path
    signed_off_by: Identity
    verified: bool
    newest: str  # whether the patch applies to the newest pinned release
    alone: str  # its tests on the pristine release with it, and without its fix
    onto: Onto | None = None


def submitter() -> Identity:
    """The git identity of whoever runs ``make pr``; refuses one that DCO
    cannot take."""
    name, email = _config("user.name"), _config("user.email")
    if not name or not email:
        raise ForkError(f"no git identity (user.name, user.email); {SET_IDENTITY}")
    if is_made_up(email):
        raise ForkError(
            f"your git identity {name} <{email}> is at a made-up domain, so its "
            f"Signed-off-by is no DCO sign-off; {SET_IDENTITY}"
        )
    return Identity(name, email)


def _config(key: str) -> str:
    result = subprocess.run(
        ["git", "config", "--get", key], cwd=pins.ROOT, capture_output=True, text=True
    )
    return result.stdout.strip()


def is_made_up(email: str) -> bool:
    return bool(MADE_UP_DOMAIN.search(email.rpartition("@")[2].lower()))


def title(base: Base, number: int) -> str:
    return _entry(base, number).subject(base)


@dataclass(frozen=True)
class Alone:
    """The patch's own tests on the pristine release with only this patch
    applied, and with only its tests (the fix left out); no fork harness."""

    with_fix: Outcome
    without_fix: Outcome


def body(base: Base, number: int, alone: Alone | None = None) -> str:
    """The pull-request body: the message's purpose, then how it was tested:
    the patch alone on the pristine release (``alone``), and the fork's proof
    ledger row (a note to run ``make verify`` where it has none)."""
    entry = _entry(base, number)
    return _body(base, entry, proof.current_proof(base, entry.name), alone)


def _body(
    base: Base,
    entry: series.Entry,
    row: Proof | None,
    alone: Alone | None = None,
    onto: Onto | None = None,
) -> str:
    result = [_onto(onto)] if onto else []
    result += [_alone(base, alone)] if alone else []
    result.append(_result(base, row) if row else _unverified(base))
    return "\n".join(
        [
            "## Purpose",
            "",
            _purpose(entry.message(base).get_content()),
            "",
            "## Test Plan",
            "",
            _plan(row) if row else _unverified(base),
            "",
            "## Test Result",
            "",
            "\n\n".join(result),
            "",
        ]
    )


def _entry(base: Base, number: int) -> series.Entry:
    entries = series.entries(base)
    if not 1 <= number <= len(entries):
        raise ForkError(f"patches/{base.name} has {len(entries)} patches, no #{number}")
    return entries[number - 1]


def refuse_fork_only(base: Base, entry: series.Entry) -> None:
    """Refuse what upstream must not get: fork-only patches, and backports
    of what upstream has already released."""
    status = entry.upstream_status(base)
    if status.kind == "Inappropriate":
        raise ForkError(
            f"patches/{base.name}/{entry.name} is not for upstream ({status}); "
            "submit the fix it covers instead"
        )
    if status.kind == "Backport":
        raise ForkError(
            f"patches/{base.name}/{entry.name} is a backport of what upstream "
            f"already has ({status}): there is nothing to submit"
        )


def _purpose(mail_body: str) -> str:
    """The commit message body without its closing trailer block and the
    fork's own upstream-status paragraph."""
    message = mail_body.split("\n---\n", 1)[0].strip()
    paragraphs = message.split("\n\n")
    if upstream.trailers(message):
        paragraphs = paragraphs[:-1]
    return "\n\n".join(p for p in paragraphs if not _fork_status(p)).strip()


def _fork_status(paragraph: str) -> bool:
    """The fork's note of where upstream stands: upstream knows that itself."""
    return paragraph.lstrip().startswith(FORK_STATUS_PARAGRAPH)


def _plan(row: Proof) -> str:
    return "\n".join(
        [
            "```bash",
            "VLLM_TARGET_DEVICE=cpu pytest -q \\",
            " \\\n".join(f"    {nodeid}" for nodeid in row.inputs.tests),
            "```",
            "",
            "Run with the fix, and again with the fix undone "
            f"({row.undone_by}), tests kept.",
        ]
    )


def _unverified(base: Base) -> str:
    return (
        f"TODO: no current proof ledger row for this patch; run "
        f"`make verify BASE={base.name}`, then `make pr` again."
    )


def _result(base: Base, row: Proof) -> str:
    """The patch's proof ledger row, quoted: its key, what was observed, when."""
    with_fix, without = row.with_fix, row.without_fix
    failures = [
        f"- `{nodeid}`: {failure.splitlines()[0][:300]}"
        for nodeid, failure in without.failures.items()
    ]
    return "\n".join(
        [
            f"The fork's evidence, on vLLM {base.version} (CPU) with its whole "
            "patch queue applied and its CPU harness (stand-in schemas for the "
            "CUDA ops), as recorded in its proof ledger "
            f"(`patches/{base.name}/{proof.LEDGER_FILE}`, key `{row.key}`, "
            f"proved {row.proved}):",
            "",
            f"- with the fix: {with_fix.passed}/{with_fix.total} passed",
            f"- without it: {without.failed}/{without.total} failed "
            f"({', '.join(sorted(without.failure_types)) or '-'}), "
            f"{row.seconds:.0f} s",
            "",
            "Without the fix:",
            "",
            *failures,
        ]
    )


def _alone(base: Base, alone: Alone) -> str:
    if not alone.with_fix.total and not alone.with_fix.errors:
        return "This patch adds no test functions of its own."
    lines = [
        f"On pristine vLLM {base.version} with only this patch applied, on CPU "
        "(`VLLM_TARGET_DEVICE=cpu`), as upstream's CI would run it (no fork "
        "harness):",
        "",
        f"- with the patch: {_summary(alone.with_fix, 'passed')}",
        f"- its tests without its fix: {_summary(alone.without_fix, 'failed')}",
    ]
    if alone.with_fix.errors or alone.with_fix.failed:
        lines += ["", "With the patch, here:", "", *_failures(alone.with_fix)]
    lines += ["", "Without its fix:", "", *_failures(alone.without_fix)]
    return "\n".join(lines)


def _onto(onto: Onto) -> str:
    brought = (
        f"; {onto.brought} blob(s) of the release brought in" if onto.brought else ""
    )
    lines = [
        f"Rebased onto upstream commit `{onto.upstream}` (branch `{onto.branch}`, "
        f"a three-way apply{brought}):",
        "",
    ]
    if onto.tests is None:
        lines.append(
            "- its tests: not run on that commit (no Python of an environment "
            "where that checkout is installed was given: `make pr ... PYTHON=`)"
        )
    else:
        lines.append(
            "- its tests there, on CPU (`VLLM_TARGET_DEVICE=cpu`): "
            f"{_summary(onto.tests, 'passed')}"
        )
        lines += [f"  {line}" for line in _failures(onto.tests)]
    checks = (
        f"upstream's pre-commit checks of that commit ({onto.hooks}) on the "
        "changed files"
    )
    if onto.checks:
        lines.append(f"- {checks}: {len(onto.checks)} new problem(s):")
        lines += [f"  - {problem.splitlines()[0]}" for problem in onto.checks]
    else:
        lines.append(f"- {checks}: no new problem")
    return "\n".join(lines)


def _summary(outcome: Outcome, field: str) -> str:
    kinds = ", ".join(sorted(outcome.failure_types))
    text = f"{getattr(outcome, field)}/{outcome.total} {field}"
    if field == "failed" and kinds:
        text += f" ({kinds})"
    if outcome.errors:
        text += f"; {len(outcome.errors)} error(s): {outcome.errors[0]}"
    return text


def _failures(outcome: Outcome) -> list[str]:
    return [
        f"- `{nodeid}`: {failure.splitlines()[0][:300]}"
        for nodeid, failure in outcome.failures.items()
    ] + [f"- {error}" for error in outcome.errors]


def run_alone(base: Base, tree: Path, commit: str) -> Alone:
    """Run the tests ``commit`` (the patch on ``base``) adds on the pristine
    release with the patch, then with only its test files."""
    tests = commits.added_tests(tree, commit)
    if not tests:
        return Alone(Outcome(), Outcome())
    with_fix = git.out(tree, "rev-parse", f"{commit}^{{tree}}")
    tests_only = _tree_of_tests(tree, commit)
    python = venv.ensure(base)
    return Alone(
        _run_plain(python, tree, with_fix, tests, "with the patch"),
        _run_plain(python, tree, tests_only, tests, "its tests alone"),
    )


def _tree_of_tests(tree: Path, commit: str) -> str:
    """The git tree of ``base`` with only the test files of ``commit``."""
    diff = git.run(tree, "diff", "base", commit, "--", "tests").stdout
    return commits.tree_with_diff(tree, "base", diff)


def _run_plain(
    python: Path, tree: Path, tree_id: str, tests: list[str], label: str
) -> Outcome:
    """``tests`` in a checkout of the git tree ``tree_id``, with its sources
    alone on the path: only the report plugin is added, from a directory of
    its own, not the harness with its ``sitecustomize``."""
    print(f"pr: running {len(tests)} test(s) {label}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp, proof.checkout(tree, tree_id) as path:
        plugin = Path(tmp) / "plugin"
        plugin.mkdir()
        shutil.copy(proof.HARNESS / f"{REPORT_PLUGIN}.py", plugin)
        return proof.run_tests(python, path, tests, label=f"pr {label}", harness=plugin)


def prepare(
    base: Base,
    number: int,
    onto: Path | None = None,
    python: Path | None = None,
) -> Submission:
    """Write ``pr/<base>/<stem>/`` and branch ``pr/<stem>`` of the fork tree;
    with ``onto``, also apply it to that checkout (``run_onto``)."""
    entry = _entry(base, number)
    refuse_fork_only(base, entry)
    who = submitter()
    tree = materialize.ensure(base)
    stem = entry.name.removesuffix(".patch")
    branch = f"pr/{stem}"
    commit = _signed_commit(tree, base.patch_dir / entry.name, who)
    git.run(tree, "update-ref", f"refs/heads/{branch}", commit)
    directory = pins.ROOT / "pr" / base.name / stem
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.patch"):
        old.unlink()
    written = git.out(tree, *series.FORMAT_PATCH, "-o", str(directory), "-1", commit)
    patch = Path(written)
    row = proof.current_proof(base, entry.name)
    # A conflict in the user's checkout stops before minutes of tests.
    shown = f"patches/{base.name}/{entry.name}"
    started = apply_onto(tree, patch, onto, shown) if onto else None
    alone = run_alone(base, tree, commit)
    applied = run_onto(tree, commit, started, python) if started else None
    (directory / "PR.md").write_text(_body(base, entry, row, alone, applied))
    return Submission(
        directory=directory,
        patch=patch,
        body=directory / "PR.md",
        branch=branch,
        tree=tree,
        signed_off_by=who,
        verified=row is not None,
        newest=applies_to_newest(base, patch),
        alone=(
            f"with the patch {_summary(alone.with_fix, 'passed')}; its tests "
            f"without its fix {_summary(alone.without_fix, 'failed')}"
        ),
        onto=applied,
    )


def _signed_commit(tree: Path, patch: Path, who: Identity) -> str:
    """The patch committed on the tree's ``base`` tag as ``git am
    --keep-non-patch`` would, without the fork's trailers and signed off by
    ``who``; no work tree or branch is touched."""
    with tempfile.TemporaryDirectory() as tmp:
        info = _mailinfo(tree, patch, Path(tmp))
        message = submission_message(info["Subject"], info["body"], who)
        author = Identity(info["Author"], info["Email"])
        if is_made_up(author.email):
            author = who
        index = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        git.run(tree, "read-tree", "base", env=index)
        applied = git.run(
            tree, "apply", "--cached", str(Path(tmp) / "diff"), env=index, check=False
        )
        if applied.returncode != 0:
            raise ForkError(
                f"{patch} does not apply to the pristine release in {tree}:\n"
                f"{applied.stderr.strip()}\nRun `make check` and fix the queue first."
            )
        written = git.run(tree, "write-tree", env=index).stdout.strip()
        dates = {"GIT_AUTHOR_DATE": info["Date"], "GIT_COMMITTER_DATE": info["Date"]}
        people = {
            "GIT_AUTHOR_NAME": author.name,
            "GIT_AUTHOR_EMAIL": author.email,
            "GIT_COMMITTER_NAME": who.name,
            "GIT_COMMITTER_EMAIL": who.email,
        }
        return git.run(
            tree,
            "commit-tree",
            written,
            "-p",
            "base",
            env=dates | people,
            input=message,
        ).stdout.strip()


def _mailinfo(tree: Path, patch: Path, scratch: Path) -> dict[str, str]:
    msg, diff = scratch / "msg", scratch / "diff"
    result = git.run(
        tree, "mailinfo", "-b", str(msg), str(diff), input=patch.read_text()
    )
    info = dict(
        line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line
    )
    info["body"] = msg.read_text()
    return info


def submission_message(subject: str, message_body: str, who: Identity) -> str:
    """The upstream commit message: the fork's ``Upstream-Status:`` and
    made-up sign-offs dropped, other trailers kept, ``who`` signing off."""
    paragraphs = [p for p in message_body.strip().split("\n\n") if p.strip()]
    trailers = upstream.trailers(message_body)
    if trailers:
        paragraphs = paragraphs[:-1]
    paragraphs = [p for p in paragraphs if not _fork_status(p)]
    kept = [line for line in trailers if not _fork_only(line)]
    sign_off = f"Signed-off-by: {who}"
    if sign_off not in kept:
        kept.append(sign_off)
    return "\n\n".join([subject, *paragraphs, "\n".join(kept)]) + "\n"


def _fork_only(trailer: str) -> bool:
    key, _, value = trailer.partition(": ")
    if key == upstream.KEY:
        return True
    email = value.rpartition("<")[2].rstrip(">")
    return key == "Signed-off-by" and is_made_up(email)


def applies_to_newest(base: Base, patch: Path) -> str:
    """Whether ``patch`` applies to the newest pinned release's pristine tree:
    as is, with offsets, or not (naming the files)."""
    newest = pins.load().newest_first()[0]
    if newest.name == base.name:
        return f"{base.name} is the newest pinned release"
    tree = materialize.ensure(newest)
    result = git.apply_check(tree, "base", patch, verbose=True)
    if result.returncode != 0:
        files = sorted(
            {m["at"] or m["file"] for m in _APPLY_FAILURE.finditer(result.stderr)}
        )
        return (
            f"does not apply to {newest.name} ({', '.join(files) or 'see git apply'})"
        )
    offsets = _OFFSET.findall(result.stderr)
    if offsets:
        return f"applies to {newest.name} with offsets ({len(offsets)} hunk(s) moved)"
    return f"applies to {newest.name} as is"


def main(
    base: Base, number: int, onto: Path | None = None, python: Path | None = None
) -> int:
    done = prepare(base, number, onto, python)
    root = pins.ROOT
    print(
        f"{done.patch.relative_to(root)}: on pristine {base.name}, "
        f"signed off by {done.signed_off_by}"
    )
    print(f"{done.body.relative_to(root)}: the pull-request body")
    print(f"branch {done.branch} in {done.tree.relative_to(root)}: the same commit")
    print(f"newest pinned release: {done.newest}")
    print(f"alone on pristine {base.name}: {done.alone}")
    author = git.out(done.tree, "log", "-1", "--format=%an <%ae>", done.branch)
    if f"Signed-off-by: {author}" not in done.patch.read_text():
        print(f"note: the author, {author}, has not signed off; DCO needs theirs too")
    if not done.verified:
        print(
            f"PR.md has no test result yet: run `make verify BASE={base.name}`, "
            f"then `make pr BASE={base.name} PATCH={number}` again"
        )
    if done.onto:
        return _said_onto(done.onto, done.body)
    print(
        "\nTo submit, from your clone of github.com/vllm-project/vllm (the fork "
        "tree's history is the sdist's, not upstream's):\n"
        f"  git switch -c {done.branch} v{base.version}   # or main\n"
        f"  git am --keep-non-patch {done.patch}\n"
        f"  git push -u <your-fork-remote> {done.branch}\n"
        f"  gh pr create --title {_quoted(title(base, number))} "
        f"--body-file {done.body}"
    )
    return 0


def _said_onto(onto: Onto, body: Path) -> int:
    print(f"{onto.checkout}: branch {onto.branch}, onto {onto.upstream}")
    if onto.tests is None:
        print("its tests: not run there (PYTHON= names an environment with it)")
    else:
        print(f"its tests there: {_summary(onto.tests, 'passed')}")
    print(f"upstream checks ({onto.hooks}): {len(onto.checks)} new problem(s)")
    for problem in onto.checks:
        print(f"  {problem}")
    print(
        f"\nTo submit, from {onto.checkout}:\n"
        f"  git push -u <your-fork-remote> {onto.branch}\n"
        f"  gh pr create --body-file {body}"
    )
    failed = onto.checks or (onto.tests and (onto.tests.failed or onto.tests.errors))
    return 1 if failed else 0


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


@dataclass(frozen=True)
class Onto:
    """The patch applied to a vLLM git checkout of the user's, and what ran there."""

    checkout: Path
    branch: str
    upstream: str  # the commit it was applied onto: "<sha> <subject>"
    brought: int  # blobs of the release copied into the checkout for the merge
    tests: Outcome | None  # None: no Python given
    checks: list[str]  # what the checkout's pre-commit checks found
    hooks: str  # which checks those were


def onto_branch(stem: str) -> str:
    return f"vllm-fork/{stem}"


@dataclass(frozen=True)
class Started:
    """Where ``apply_onto`` put the patch."""

    checkout: Path
    branch: str
    upstream: str  # "<sha> <subject>" of the commit the branch starts from
    brought: int  # blobs of the release copied in


def apply_onto(tree: Path, patch: Path, checkout: Path, shown: str) -> Started:
    """``patch`` (from the fork tree ``tree``; ``shown`` names it) on a new
    branch of ``checkout`` at its HEAD, three-way. Resumes a branch that
    already holds the patch (a conflict finished by hand)."""
    user_checkout.require_checkout(checkout)
    user_checkout.require_clean(checkout, "make pr")
    branch = onto_branch(patch.name.split("-", 1)[1].removesuffix(".patch"))
    subject = git_in(checkout, "log", "-1", "--format=%s", "HEAD").stdout.strip()
    wanted = _mailinfo_subject(tree, patch)
    if git_in(checkout, "rev-parse", "--verify", "-q", branch).returncode == 0:
        top = git_in(checkout, "log", "-1", "--format=%s", branch).stdout.strip()
        current = git_in(checkout, "branch", "--show-current").stdout.strip()
        if top == wanted and current == branch:
            start = git_in(checkout, "rev-parse", f"{branch}~1").stdout.strip()
            return Started(checkout, branch, user_checkout.describe(checkout, start), 0)
        raise ForkError(
            f"{checkout} already has a branch {branch}; remove it (git branch -D "
            f"{branch}) or switch to it to resume, then run make pr again"
        )
    start = git_in(checkout, "rev-parse", "HEAD").stdout.strip()
    described = f"{start[:12]} {subject}"
    brought = user_checkout.bring_blobs(tree, patch, checkout)
    previous = git_in(checkout, "branch", "--show-current").stdout.strip() or start
    git_in(checkout, "switch", "--quiet", "-c", branch, check=True)
    applied = git_in(checkout, "am", "--3way", "--keep-non-patch", str(patch))
    if applied.returncode != 0:
        raise ForkError(
            user_checkout.conflict(
                shown, patch, checkout, branch, previous, applied, "make pr"
            )
        )
    return Started(checkout, branch, described, brought)


def _mailinfo_subject(tree: Path, patch: Path) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        return _mailinfo(tree, patch, Path(tmp))["Subject"]


def run_onto(tree: Path, commit: str, started: Started, python: Path | None) -> Onto:
    """The patch's tests in the user's checkout, where ``apply_onto`` put
    it, with ``python``, and the checkout's own pre-commit checks on what
    it changes."""
    checkout, branch = started.checkout, started.branch
    tests = commits.added_tests(tree, commit)
    outcome = None
    if python is not None and tests:
        with tempfile.TemporaryDirectory() as tmp:
            plugin = Path(tmp) / "plugin"
            plugin.mkdir()
            shutil.copy(proof.HARNESS / f"{REPORT_PLUGIN}.py", plugin)
            print(f"pr: running {len(tests)} test(s) in {checkout}", file=sys.stderr)
            outcome = proof.run_tests(
                python, checkout, tests, label="pr onto", harness=plugin
            )
    elif python is not None:
        outcome = Outcome()
    hooks, checks = _checks_onto(checkout, f"{branch}~1", branch)
    return Onto(
        checkout, branch, started.upstream, started.brought, outcome, checks, hooks
    )


def _checks_onto(checkout: Path, before: str, after: str) -> tuple[str, list[str]]:
    """The checkout's own pre-commit checks on the files the patch changes,
    in a scratch clone that shares its objects (the checkout is not touched)."""
    from forktools.queue import download
    from forktools.shipping import precommit

    config = git_in(checkout, "show", f"{after}:{precommit.CONFIG}")
    if config.returncode != 0:
        return "none: the checkout has no .pre-commit-config.yaml", []
    key = hashlib.sha256(config.stdout.encode()).hexdigest()[:12]
    work = download.cache_dir() / "upstream-checks" / f"onto-{key}"
    work.mkdir(parents=True, exist_ok=True)
    with open(work / ".lock", "w") as lock:  # one run at a time per config
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _checks_in(checkout, before, after, work)


def _checks_in(
    checkout: Path, before: str, after: str, work: Path
) -> tuple[str, list[str]]:
    from forktools.shipping import lint, precommit

    scratch = work / "checkout"
    shutil.rmtree(scratch, ignore_errors=True)
    subprocess.run(
        [
            "git",
            "clone",
            "--quiet",
            "--shared",
            "--no-checkout",
            str(checkout),
            str(scratch),
        ],
        check=True,
        capture_output=True,
    )
    before_sha = git_in(checkout, "rev-parse", before).stdout.strip()
    after_sha = git_in(checkout, "rev-parse", after).stdout.strip()
    changed = git_in(
        checkout, "diff", "--name-only", "--diff-filter=d", before_sha, after_sha
    ).stdout.split()
    try:
        hooks, found = precommit.commit_problems(
            scratch, before_sha, after_sha, changed, work
        )
        python = [
            n for n in precommit.checked_files(hooks, changed) if n.endswith(".py")
        ]
        if python and hooks.ruff:
            found = (
                lint._ruff(scratch, scratch / "pyproject.toml", python, hooks.ruff)
                + found
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ran = [
        name
        for name, on in (
            ("ruff", hooks.ruff),
            ("typos", hooks.typos),
            ("mypy", hooks.mypy_script),
        )
        if on
    ]
    ran += [f"{len(hooks.local)} hook scripts"] if hooks.local else []
    return ", ".join(ran) or "none configured", found
