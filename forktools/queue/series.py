"""A base's patch queue: ``patches/<base>/series`` and its mbox patches."""

from __future__ import annotations

import email
import email.message
import email.policy
import hashlib
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from forktools.queue import git, upstream
from forktools.queue.pins import Artifact, Base, ForkError, sha256_of, tomllib

SERIES_HEADER = """\
# Patch queue for vLLM {base}, applied in order with
# `git am --keep-non-patch`. After each patch, a copy of its Upstream-Status
# trailer, written by `make export`; the tools read the patch, not this.
"""
NO_STATUS = "(no Upstream-Status trailer)"
FORMAT_PATCH = (
    "format-patch",
    "--zero-commit",
    "--no-signature",
    "--no-numbered",
    "--find-renames",
)
_AM_FAILURE = re.compile(
    r"^error: (?:patch failed: (?P<at>\S+?):\d+|(?P<file>\S+?): "
    r"(?:patch does not apply|does not exist in index|already exists in"
    r" (?:index|working directory)))",
    re.MULTILINE,
)

_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/", re.MULTILINE)
_NEW_FILE = re.compile(r"^diff --git a/\S+ b/(\S+\.py)\n(new file mode)?", re.MULTILINE)


@dataclass(frozen=True)
class Entry:
    name: str

    def message(self, base: Base) -> email.message.EmailMessage:
        """The patch as the mail ``git format-patch`` wrote."""
        data = (base.patch_dir / self.name).read_bytes()
        return email.message_from_bytes(data, policy=email.policy.default)

    def subject(self, base: Base) -> str:
        subject = str(self.message(base)["Subject"])
        return re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)

    def upstream_status(self, base: Base) -> upstream.Status:
        """The patch's Upstream-Status trailer; `upstream.StatusError` if bad."""
        return upstream.read(upstream.message_of(self.text(base)))

    def text(self, base: Base) -> str:
        return (base.patch_dir / self.name).read_text()

    def changed_files(self, base: Base) -> list[str]:
        """The paths the patch's diff changes, as ``diff --git`` names them."""
        return _DIFF_HEADER.findall(self.text(base))

    def new_test_modules(self, base: Base) -> set[str]:
        """The ``test_*.py`` files the patch creates: its regression tests."""
        return {
            path
            for path, created in _NEW_FILE.findall(self.text(base))
            if created and path.rpartition("/")[2].startswith("test_")
        }

    def is_fix(self, base: Base) -> bool:
        """Whether the patch changes vLLM itself, not only its tests."""
        return any(path.startswith("vllm/") for path in self.changed_files(base))


def entries(base: Base) -> list[Entry]:
    series = base.patch_dir / "series"
    if not series.exists():
        return []
    result = []
    for number, line in enumerate(series.read_text().splitlines(), 1):
        name = line.partition("#")[0].strip()
        if not name:
            continue
        if not (base.patch_dir / name).is_file():
            raise ForkError(f"{series}:{number}: {name} is listed but missing")
        result.append(Entry(name))
    return result


PORTS = "ports"


def ports(base: Base) -> list[tuple[str, Entry]]:
    """The queue's ports, as (release, entry): a fix and its tests written
    again on a release no queue is pinned to, kept as
    ``patches/<base>/ports/<release>/<the fix's patch name>``."""
    found = sorted((base.patch_dir / PORTS).glob("*/*.patch"))
    return [
        (path.parent.name, Entry(str(path.relative_to(base.patch_dir))))
        for path in found
    ]


BUGS_SINCE = "bugs_since.toml"


def bugs_since(base: Base) -> dict[str, tuple[str, str]]:
    """The release each of the queue's fixes' bug came in with, and why,
    where that is a release after the oldest pinned base:
    ``patches/<base>/bugs_since.toml`` maps a patch name to ``since`` and
    ``why``. A release below it lacks the bug: nothing there to fix."""
    path = base.patch_dir / BUGS_SINCE
    if not path.exists():
        return {}
    declared = tomllib.loads(path.read_text())
    return {name: (bug["since"], bug["why"]) for name, bug in declared.items()}


def fixes(base: Base) -> list[Entry]:
    """The queue's patches that change ``vllm/``, in order: what an internal
    build cherry-picks; the others are tests only."""
    return [entry for entry in entries(base) if entry.is_fix(base)]


def patches_id(base: Base) -> str:
    """A short digest of the queue's exact bytes: ``series`` and its patches."""
    digest = hashlib.sha256(base.name.encode())
    series = base.patch_dir / "series"
    if series.exists():
        digest.update(series.read_bytes())
    for entry in entries(base):
        digest.update((base.patch_dir / entry.name).read_bytes())
    return digest.hexdigest()[:10]


def queue_id(base: Base) -> str:
    """A short digest of the queue and of the pinned artifacts it applies to:
    what a tree must match to be up to date, and what support asks for
    (``vllm._version.__fork_queue__``)."""
    digest = hashlib.sha256(patches_id(base).encode())
    for artifact in base.artifacts:
        digest.update(f"{artifact.file} {artifact.sha256}\n".encode())
    return digest.hexdigest()[:10]


def label_id(base: Base, wheel: Artifact | None = None) -> str:
    """A short digest of the code that ships on one platform: the pinned
    sdist and that platform's wheel (default: this machine's), and each
    patch's diff of ``vllm/``. It is the version label, which vLLM hashes
    into its compile cache keys, so a queue update that changes only a test,
    a message or another platform's pin keeps every node's compile cache.
    ``queue_id`` still names the exact queue."""
    texts = [entry.text(base) for entry in entries(base)]
    return label_of(base, wheel or base.wheel_for_this_machine(), texts)


def label_of(base: Base, wheel: Artifact, patches: list[str]) -> str:
    """``label_id`` of the queue whose patches' texts are ``patches``."""
    digest = hashlib.sha256(base.name.encode())
    for artifact in (base.sdist, wheel):
        digest.update(f"{artifact.file} {artifact.sha256}\n".encode())
    for text in patches:
        digest.update(shipped_diff(text).encode())
    return digest.hexdigest()[:10]


def shipped_diff(patch: str) -> str:
    """A patch's diff of the files that ship (``vllm/``): not its message,
    not its tests."""
    sections = re.split(r"^(?=diff --git )", patch, flags=re.MULTILINE)
    return "".join(s for s in sections if s.startswith("diff --git a/vllm/"))


def digests(base: Base) -> dict[str, str]:
    """sha256 of ``series`` and of each patch it lists, by file name, in order."""
    found = {}
    series = base.patch_dir / "series"
    if series.exists():
        found["series"] = sha256_of(series)
    for entry in entries(base):
        found[entry.name] = sha256_of(base.patch_dir / entry.name)
    return found


def apply(base: Base, tree: Path) -> None:
    """Apply the queue on ``tree`` in one ``git am``, naming any patch that fails."""
    names = [entry.name for entry in entries(base)]
    if not names:
        return
    before = git.out(tree, "rev-parse", "HEAD")
    result = git.run(
        tree,
        "am",
        "--keep-non-patch",
        "--committer-date-is-author-date",
        *(str(base.patch_dir / name) for name in names),
        check=False,
    )
    if result.returncode != 0:
        applied = int(git.out(tree, "rev-list", "--count", f"{before}..HEAD"))
        git.run(tree, "am", "--abort", check=False)
        raise ForkError(_am_failure(base, names[applied], result.stderr))


def _am_failure(base: Base, name: str, stderr: str) -> str:
    files = sorted(
        {m.group("at") or m.group("file") for m in _AM_FAILURE.finditer(stderr)}
    )
    where = f" (in {', '.join(files)})" if files else ""
    return (
        f"patches/{base.name}/{name} no longer applies to vLLM "
        f"{base.version}{where}.\n{stderr.strip()}\n"
        "Rebase it: materialize the tree without it, redo the change, and "
        "export (see docs/rebasing.md, 'Moving to a new upstream release')."
    )


def export_to(tree: Path, since: str, dest: Path, until: str = "HEAD") -> list[Path]:
    """Write the commits after ``since`` as mbox patches into ``dest``."""
    names = git.out(tree, *FORMAT_PATCH, "-o", str(dest), f"{since}..{until}")
    return [Path(line) for line in names.splitlines()]


def _series_comment(patch: Path) -> str:
    try:
        return str(upstream.read(upstream.message_of(patch.read_text())))
    except upstream.StatusError:
        return NO_STATUS


def write(base: Base, tree: Path, since: str) -> list[str]:
    """Replace the queue with the tree's commits."""
    with tempfile.TemporaryDirectory() as tmp:
        patches = export_to(tree, since, Path(tmp))
        base.patch_dir.mkdir(parents=True, exist_ok=True)
        for entry in entries(base):
            (base.patch_dir / entry.name).unlink()
        lines = [SERIES_HEADER.format(base=base.version)]
        for patch in patches:
            (base.patch_dir / patch.name).write_bytes(patch.read_bytes())
            lines.append(f"{patch.name}  # {_series_comment(patch)}\n")
    (base.patch_dir / "series").write_text("".join(lines))
    return [p.name for p in patches]
