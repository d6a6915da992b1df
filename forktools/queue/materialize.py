"""Build the fork tree of a base: upstream sources, wheel extras, the queue.

A tree lives in ``.fork/trees/<base>/``, a git repository whose first commit
(tagged ``base``) is the sdist's ``vllm/``, ``tests/`` and ``pyproject.toml``
and whose later commits are the queue. Files that only the wheel ships
(compiled extensions, generated modules) are laid beside them and ignored by
git. The repository root's ``vllm`` and ``tests`` link to the selected tree.

Every clone's tree is cloned from one pristine tree per base in the shared
cache. The wheel's Python files are copied, so that an edit stays in its
tree, and their sha256 is kept (``WHEEL_MANIFEST``): git does not see them,
the unexported-edits guard and ``make check`` do. Its other files (compiled
extensions, headers for JIT builds: hundreds of MB) are hard-linked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import shlex
import shutil
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from forktools.queue import download, file_locks, git, metadata, pins, series
from forktools.queue.pins import Artifact, Base, ForkError, sha256_of

SDIST_PARTS = ("vllm/", "tests/", "pyproject.toml")
LINKED = ("vllm", "tests")
STATE = "vllm-fork.json"
WHEEL_MANIFEST = "vllm-fork-wheel.json"
VERSION_FILE = "vllm/_version.py"
TEST_BY_PRODUCTS = frozenset({".hypothesis", ".pytest_cache", "__pycache__"})


def tree_dir(base: Base) -> Path:
    return pins.ROOT / ".fork" / "trees" / base.name


def version(base: Base, wheel: Artifact | None = None) -> str:
    """``<release>+fork.<label>``: the label changes with the code that ships
    with ``wheel`` (default: this machine's), and only then."""
    return f"{base.version}+fork.{series.label_id(base, wheel)}"


def read_state(tree: Path) -> dict:
    path = tree / ".git" / STATE
    return json.loads(path.read_text()) if path.exists() else {}


def record(tree: Path, base: Base) -> None:
    """Remember the queue, the pins and the commit the tree now matches."""
    state = {
        "queue": series.queue_id(base),
        "head": git.out(tree, "rev-parse", "HEAD"),
        "patches": series.digests(base),
        "pins": {artifact.file: artifact.sha256 for artifact in base.artifacts},
    }
    (tree / ".git" / STATE).write_text(json.dumps(state, indent=2) + "\n")
    _write_version(tree, base)


def unexported(tree: Path) -> list[str]:
    """Files whose edits in ``tree`` are not in the patches yet."""
    if not (tree / ".git").exists():
        return []
    changed = set(wheel_edits(tree))
    changed.update(line[3:] for line in uncommitted(tree))
    head = read_state(tree).get("head")
    if head and git.out(tree, "rev-parse", "HEAD") != head:
        changed.update(git.out(tree, "diff", "--name-only", head, "HEAD").split())
        changed = changed or {"(commits not exported)"}
    return sorted(changed)


def uncommitted(tree: Path) -> list[str]:
    """``git status --porcelain`` lines of what is changed or new in ``tree``,
    without what test runs leave there."""
    status = git.run(tree, "status", "--porcelain", "--untracked-files=all").stdout
    return [line for line in status.splitlines() if not _is_test_by_product(line)]


def _is_test_by_product(status_line: str) -> bool:
    """An untracked file that running tests leaves (pytest's cache,
    hypothesis' example database, bytecode): never an edit."""
    parts = Path(status_line[3:]).parts
    return status_line.startswith("?? ") and bool(TEST_BY_PRODUCTS.intersection(parts))


def wheel_edits(tree: Path) -> list[str]:
    """Files laid from the wheel that no longer hold the wheel's bytes."""
    return [
        name
        for name, sha256 in wheel_manifest(tree).get("sha256", {}).items()
        if not (tree / name).is_file() or sha256_of(tree / name) != sha256
    ]


def wheel_manifest(tree: Path) -> dict:
    path = tree / ".git" / WHEEL_MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


def wheel_edits_problem(tree: Path, edited: list[str]) -> str:
    """Why the wheel's files ``edited`` in ``tree`` block, and how to restore them."""
    extract = (
        "import sys, zipfile; "
        "zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2], sys.argv[3:])"
    )
    wheel = wheel_manifest(tree)["wheel"]
    restore = shlex.join(["python3", "-c", extract, wheel, str(tree), *edited])
    return (
        f"{', '.join(edited)} in {tree}: laid from the wheel and not tracked by "
        f"git, so no patch can carry an edit there. Restore: {restore}"
    )


def refuse_if_unexported(tree: Path, doing: str) -> None:
    files = unexported(tree)
    if files:
        listed = "\n  ".join(files[:20])
        more = f"\n  … and {len(files) - 20} more" if len(files) > 20 else ""
        raise ForkError(
            f"refusing to {doing}: {tree} has edits that are not exported to "
            f"patches/:\n  {listed}{more}\nCommit them in the tree and run "
            "`make export`, or discard them (git -C <tree> reset --hard "
            f"<commit>) if you really mean to.{_wheel_edits_hint(tree)}"
        )


def _wheel_edits_hint(tree: Path) -> str:
    edited = wheel_edits(tree)
    return f"\n{wheel_edits_problem(tree, edited)}" if edited else ""


def is_current(base: Base) -> bool:
    tree = tree_dir(base)
    return read_state(tree).get("queue") == series.queue_id(base)


def ensure(base: Base) -> Path:
    """The base's tree, (re)built when its queue changed. Idempotent."""
    tree = tree_dir(base)
    if is_current(base):
        _write_version(tree, base)
        return tree
    with tree_lock(base):
        if not is_current(base):
            refuse_if_unexported(tree, f"rebuild the {base.name} tree")
            _build(base)
    return tree


def _write_version(tree: Path, base: Base) -> None:
    """``vllm/_version.py`` as this tooling labels the tree (a tree built
    by an older one keeps its queue, not its label)."""
    text = _version_module(version(base), series.queue_id(base))
    path = tree / VERSION_FILE
    if not path.exists() or path.read_text() != text:
        replace_atomically(path, text.rstrip("\n"))


def tree_lock(base: Base):
    """Held while a run rebuilds or exports the base's tree in this clone."""
    lock = pins.ROOT / ".fork" / "locks" / f"tree-{base.name}.lock"
    return file_locks.held(lock, f"to build or export the {base.name} tree")


def build(base: Base) -> Path:
    """Materialize into a staging directory, then swap it into place."""
    with tree_lock(base):
        return _build(base)


def _build(base: Base) -> Path:
    tree = tree_dir(base)
    staging = tree.with_name(f".{base.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    try:
        print(f"vllm-fork: materializing the {base.name} tree", file=sys.stderr)
        clone_pristine(pristine(base), staging)
        series.apply(base, staging)
        record(staging, base)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    swap_in(staging, tree)
    return tree


def pristine_path(base: Base) -> Path:
    wheel = base.wheel_for_this_machine()
    key = f"{base.name}-{base.sdist.sha256[:12]}-{wheel.sha256[:12]}"
    return download.cache_dir() / "pristine" / key


def pristine_here(base: Base) -> Path | None:
    """The base's pristine tree if it is built; nothing is downloaded."""
    path = pristine_path(base)
    return path if (path / ".git" / WHEEL_MANIFEST).exists() else None


def pristine(base: Base) -> Path:
    """The base's pristine tree (sdist committed, wheel files laid), shared by
    every clone through the download cache; built once per pinned artifacts."""
    here = pristine_here(base)
    if here is not None and "metadata" in wheel_manifest(here):
        return here
    path = pristine_path(base)
    lock = download.lock_file(f"pristine-{path.name}")
    with file_locks.held(lock, f"to build the {base.name} pristine tree"):
        if not path.is_dir():
            _build_pristine(base, path)
        if "metadata" not in wheel_manifest(path):  # built by older tooling
            write_wheel_manifest(path, download.fetch(base.wheel_for_this_machine()))
    return path


def _build_pristine(base: Base, path: Path) -> None:
    """Build in a staging directory beside ``path`` (under the pristine lock),
    readable by every user of the shared cache, as a plain mkdir makes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for leftover in path.parent.glob(f".{glob.escape(path.name)}.*"):
        shutil.rmtree(leftover, ignore_errors=True)  # a killed build's
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)
    try:
        extract_sdist(download.fetch(base.sdist), staging)
        git.run(staging, "init", "--quiet", "--initial-branch=fork")
        commit_pristine(base, staging)
        overlay_wheel(download.fetch(base.wheel_for_this_machine()), staging)
        with contextlib.suppress(OSError):  # older tooling, which takes no lock
            staging.rename(path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def clone_pristine(source: Path, tree: Path) -> None:
    """A tree of its own from the shared pristine one: git objects and the
    wheel's files hard-linked where the file system allows, but its Python
    files copied; sources checked out, nothing pointing back at the cache."""
    git.run(source, "clone", "--quiet", "--local", "--branch", "fork", ".", str(tree))
    git.run(tree, "remote", "remove", "origin")
    for kept in (Path(".git", "info", "exclude"), Path(".git", WHEEL_MANIFEST)):
        shutil.copy(source / kept, tree / kept)
    copied = wheel_manifest(tree)["sha256"]
    for name in wheel_files(tree):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        if name in copied:
            shutil.copy(source / name, tree / name)
            continue
        try:
            os.link(source / name, tree / name)
        except OSError:
            shutil.copy2(source / name, tree / name)


def swap_in(staging: Path, tree: Path) -> None:
    """Replace ``tree`` by the finished ``staging`` directory."""
    old = tree.with_name(f".{tree.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if tree.exists():
        tree.rename(old)
    staging.rename(tree)
    shutil.rmtree(old, ignore_errors=True)


def extract_sdist(sdist: Path, dest: Path) -> None:
    with tarfile.open(sdist) as archive:
        members = []
        for member in archive.getmembers():
            _, _, inner = member.name.partition("/")
            if inner.startswith(SDIST_PARTS[:2]) or inner == SDIST_PARTS[2]:
                member.name = inner
                members.append(member)
        # The "data" filter (Python 3.12, backported to 3.10.12/3.11.4) refuses
        # links and paths that would escape dest.
        safety = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        archive.extractall(dest, members=members, **safety)


def commit_pristine(base: Base, tree: Path, tag: str = "base") -> None:
    """Commit the extracted sdist in ``tree`` as it is, and tag the commit."""
    (tree / VERSION_FILE).unlink(missing_ok=True)
    date = {"GIT_AUTHOR_DATE": git.BASE_DATE, "GIT_COMMITTER_DATE": git.BASE_DATE}
    git.run(tree, "add", "--all", "--force")
    message = f"vLLM {base.version} ({base.sdist.file})"
    git.run(tree, "commit", "--quiet", "--no-verify", "-m", message, env=date)
    git.run(tree, "tag", tag)


def overlay_wheel(wheel: Path, tree: Path) -> None:
    """Add what only the wheel ships; git ignores it, exports never see it."""
    ignored = ["__pycache__/", "*.pyc"]
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            name = info.filename
            if name == VERSION_FILE or not name.startswith("vllm/"):
                continue
            if not (tree / name).exists():
                archive.extract(info, tree)
                ignored.append(f"/{name}")
                if mode := info.external_attr >> 16:
                    (tree / name).chmod(mode & 0o777)
    exclude = tree / ".git" / "info" / "exclude"
    exclude.write_text("\n".join([*ignored, f"/{VERSION_FILE}"]) + "\n")
    write_wheel_manifest(tree, wheel)


def write_wheel_manifest(tree: Path, wheel: Path) -> None:
    """Record the sha256 of each Python file laid from ``wheel`` (what a
    clone copies), and where to restore them from."""
    copied = [name for name in wheel_files(tree) if name.endswith(".py")]
    manifest = {
        "wheel": str(wheel),
        "sha256": {name: sha256_of(tree / name) for name in copied},
        "metadata": dataclasses.asdict(metadata.read(wheel)),
    }
    replace_atomically(tree / ".git" / WHEEL_MANIFEST, json.dumps(manifest, indent=1))


def replace_atomically(path: Path, text: str) -> None:
    """Write ``path`` through a file of this writer's own beside it: readers
    see the old or the new text, never part of it, whoever else writes."""
    handle, partial = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text + "\n")
        os.chmod(partial, 0o644)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def wheel_metadata(base: Base) -> metadata.WheelMetadata:
    """The upstream wheel's metadata, as recorded when the selected tree's
    pristine tree was laid from the verified wheel; read from the wheel (hashed
    again) where an older manifest lacks it."""
    recorded = wheel_manifest(tree_dir(base)).get("metadata")
    if recorded:
        return metadata.WheelMetadata(**recorded)
    return metadata.read(download.fetch(base.wheel_for_this_machine()))


def wheel_files(tree: Path) -> list[str]:
    """The files laid from the wheel (as listed in the tree's git excludes)."""
    exclude = (tree / ".git" / "info" / "exclude").read_text().splitlines()
    return [
        line[1:]
        for line in exclude
        if line.startswith("/vllm/") and line[1:] != VERSION_FILE
    ]


def _version_module(text: str, queue_id: str) -> str:
    public = text.split("+", 1)[0]
    numbers = ", ".join(public.split("."))
    return (
        "# Generated by vllm-fork: the upstream release plus the patch queue.\n"
        f"__version__ = version = {text!r}\n"
        f"__version_tuple__ = version_tuple = ({numbers}, {text.split('+')[1]!r})\n"
        "__commit_id__ = commit_id = None\n"
        "# The exact queue (patches, messages, pins), for support; the version\n"
        "# label follows only the code that ships on this platform.\n"
        f"__fork_queue__ = {queue_id!r}\n"
    )


def select(base: Base) -> None:
    """Point the root ``vllm`` and ``tests`` at the base's tree."""
    lock = pins.ROOT / ".fork" / "locks" / "select.lock"
    with file_locks.held(lock, f"to switch vllm/ and tests/ to {base.name}"):
        _select(base)


def _select(base: Base) -> None:
    tree = tree_dir(base)
    for name in LINKED:
        link = pins.ROOT / name
        target = tree.relative_to(pins.ROOT) / name
        if link.is_symlink():
            if Path(link.readlink()) == target:
                continue
            current = (pins.ROOT / link.readlink()).parent
            refuse_if_unexported(current, f"switch to {base.name}")
            link.unlink()
        elif link.exists():
            raise ForkError(
                f"{link} is a real directory, not a link to a fork tree; move it "
                "away (it is not part of this repository) and run again"
            )
        link.symlink_to(target, target_is_directory=True)
    (pins.ROOT / ".fork" / "selected").write_text(base.name + "\n")


def selected() -> str | None:
    path = pins.ROOT / ".fork" / "selected"
    return path.read_text().strip() if path.exists() else None
