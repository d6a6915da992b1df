"""A content-keyed cache of the C++ compiler's outputs, shared by test runs.

Why: Inductor on CPU builds each kernel, its precompiled prefix header and
its vector-ISA probes with g++, and every proof session starts with an empty
``TMPDIR``, so the same sources were compiled again in each of the 84
sessions of ``make verify FRESH=1``: about a fifth of their CPU time.
Why it is safe: a hit hands back the bytes g++ wrote for the same compiler,
CPU, arguments, environment and the content of every file the compiler read
(its own ``-MD`` list), with the session's scratch folder written as a
placeholder wherever it appears (so only the output's debug information and
file-name strings can name another session's folder). Every call still goes
through g++'s name, Inductor's caches see nothing of it, and any error here
runs the real compiler.

The ``g++`` in ``cxx-cache-bin/`` runs ``main``; where ``VLLM_FORK_CXX_CACHE``
is unset, or the call is not a compile to one output file, it is the real g++.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

CACHE_ENV = "VLLM_FORK_CXX_CACHE"
VERSION = "1"
SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp")
# Arguments whose output this cache does not reproduce: the preprocessor
# alone, dependency files, assembly, queries, response files, stdin.
UNCACHED_PREFIXES = ("-E", "-M", "-S", "-v", "--", "-###", "-dump", "-print", "@")
UNCACHED = {"-", "-save-temps", "-fsyntax-only"}
# What g++ reads from its environment besides its arguments.
COMPILER_ENV = (
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "LIBRARY_PATH",
    "COMPILER_PATH",
    "GCC_EXEC_PREFIX",
    "SOURCE_DATE_EPOCH",
    "DEPENDENCIES_OUTPUT",
    "SUNPRO_DEPENDENCIES",
)
SCRATCH = "<scratch>"


def main(argv: list[str]) -> int:
    real = real_compiler(argv[0])
    args = argv[1:]
    cache = os.environ.get(CACHE_ENV)
    job = compile_job(args) if cache else None
    if job is None:
        os.execv(real, [real, *args])
    try:
        found = lookup(cache, real, args, *job)
    except Exception:  # a damaged or unreadable cache entry: compile
        found = False
    if found:
        return 0
    return compile_and_store(cache, real, args, *job)


def real_compiler(invoked: str) -> str:
    """The compiler of the invoked name on PATH after this shim's folder."""
    own = os.path.dirname(os.path.realpath(invoked))
    name = os.path.basename(invoked)
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(folder, name)
        if os.path.realpath(folder) != own and os.access(candidate, os.X_OK):
            return candidate
    sys.exit(f"vllm_cxx_cache: no {name} on PATH besides {own}")


def compile_job(args: list[str]) -> tuple[str, list[str]] | None:
    """The output and the source files of a compile this cache can serve,
    else None."""
    if any(a in UNCACHED or a.startswith(UNCACHED_PREFIXES) for a in args):
        return None
    if args.count("-o") != 1 or args.index("-o") == len(args) - 1:
        return None
    output = args[args.index("-o") + 1]
    sources = [a for a in args if a.endswith(SOURCE_SUFFIXES) and os.path.isfile(a)]
    if not sources or any(name in os.environ for name in COMPILER_ENV[-2:]):
        return None
    return output, sources


def scratch_root() -> str:
    """The session's scratch folder, which differs from run to run: the
    folder holding TMPDIR."""
    tmp = os.environ.get("TMPDIR", "")
    return os.path.dirname(os.path.abspath(tmp)) if tmp else ""


def placeholder(text: str, scratch: str) -> str:
    return text.replace(scratch, SCRATCH) if scratch else text


def in_session(text: str, scratch: str) -> str:
    return text.replace(SCRATCH, scratch) if scratch else text


def content_digest(path: str, scratch: str) -> str:
    with open(path, "rb") as file:
        data = file.read()
    if scratch:
        data = data.replace(scratch.encode(), SCRATCH.encode())
    return hashlib.sha256(data).hexdigest()


def call_key(real: str, args: list[str], output: str, sources: list[str]) -> str:
    """What decides the output besides the files the compiler reads: the
    compiler, assembler and linker, the CPU (``-march=native``), the
    arguments with the output and sources as roles and the scratch folder as
    a placeholder, the working folder where an argument is relative to it,
    the environment g++ reads, the libraries named, the sources' content."""
    scratch = scratch_root()
    roles = {output: "<output>", **{s: f"<source {i}>" for i, s in enumerate(sources)}}
    parts = {
        "version": VERSION,
        "compiler": [
            program(real),
            program(shutil.which("as")),
            program(shutil.which("ld")),
        ],
        "cpu": cpu_identity(),
        "cwd": os.getcwd() if relative_paths(args) else None,
        "args": [roles.get(a) or placeholder(a, scratch) for a in args],
        "environment": {n: os.environ.get(n) for n in COMPILER_ENV},
        "libraries": libraries(args),
        "sources": [content_digest(s, scratch) for s in sources],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def program(path: str | None) -> list | None:
    """Which program ``path`` is: where it lives, its size and time."""
    if path is None:
        return None
    real = os.path.realpath(path)
    found = os.stat(real)
    return [real, found.st_size, found.st_mtime_ns]


def relative_paths(args: list[str]) -> bool:
    """Whether an argument names a file or folder relative to the working
    folder."""
    paths = [a[2:] if a.startswith(("-I", "-L")) else a for a in args]
    return any(p and not os.path.isabs(p) and os.path.exists(p) for p in paths)


def cpu_identity() -> list[str]:
    """The lines of /proc/cpuinfo that say what ``-march=native`` picks."""
    wanted = ("vendor_id", "cpu family", "model", "model name", "flags")
    with open("/proc/cpuinfo") as file:
        first = file.read().split("\n\n")[0]
    return [line for line in first.splitlines() if line.split(":")[0].strip() in wanted]


def libraries(args: list[str]) -> list:
    """Each ``-l`` library found in a ``-L`` folder, with its size and time."""
    folders = [a[2:] for a in args if a.startswith("-L")]
    names = [a[2:] for a in args if a.startswith("-l")]
    found = []
    for name in names:
        for folder in folders:
            path = os.path.join(folder, f"lib{name}.so")
            if os.path.exists(path):
                stat = os.stat(path)
                found.append([path, stat.st_size, stat.st_mtime_ns])
                break
    return found


def lookup(cache: str, real: str, args: list[str], output: str, sources) -> bool:
    """Copies a stored output to ``output`` when every file the compile read
    then has the same content now."""
    key = call_key(real, args, output, sources)
    entries = read_manifest(cache, key)
    scratch = scratch_root()
    for entry in entries:
        if all(
            os.path.isfile(where_read(path, sources, scratch))
            and content_digest(where_read(path, sources, scratch), scratch) == digest
            for path, digest in entry["read"]
        ):
            stored = os.path.join(cache, "outputs", entry["output"])
            write_output(stored, output, entry["mode"])
            with contextlib.suppress(OSError):
                os.utime(stored)  # the last use, which trimming the cache reads
            return True
    return False


def write_output(stored: str, output: str, mode: int) -> None:
    """``output`` as a new file with the stored bytes, written in place as
    g++ writes it, and removed if the copy fails."""
    if os.path.lexists(output):
        os.unlink(output)
    try:
        with open(stored, "rb") as source, open(output, "xb") as target:
            shutil.copyfileobj(source, target)
        os.chmod(output, mode)
    except BaseException:
        if os.path.lexists(output):
            os.unlink(output)
        raise


def compile_and_store(cache: str, real: str, args: list[str], output, sources) -> int:
    """Runs the real compiler, asked for the list of files it reads (kept in
    the cache, not the session's folders); a success is stored, every failure
    of the store ignored."""
    try:
        os.makedirs(cache, exist_ok=True)
        fd, depfile = tempfile.mkstemp(dir=cache, prefix=".deps-")
        os.close(fd)
    except OSError:
        os.execv(real, [real, *args])
    try:
        status = subprocess.call([real, *args, "-MD", "-MF", depfile])
        if status == 0:
            with contextlib.suppress(Exception):
                key = call_key(real, args, output, sources)
                store(cache, key, output, sources, depfile)
    finally:
        os.unlink(depfile)
    return status


def read_files(depfile: str) -> list[str]:
    """The files a ``-MD`` dependency file lists, as absolute paths."""
    with open(depfile) as file:
        text = file.read().replace("\\\n", " ")
    tokens = re.findall(r"(?:\\.|[^\s\\])+", text)
    rules = [t for t in tokens if t.endswith(":")]
    if not rules:
        raise ValueError(f"{depfile}: no rule")
    after = tokens[tokens.index(rules[0]) + 1 :]
    return [os.path.abspath(re.sub(r"\\(.)", r"\1", t)) for t in after]


def store(cache: str, key: str, output: str, sources, depfile: str) -> None:
    """Keeps a copy of ``output`` and, under ``key``, the content of every
    file the compile read besides its sources."""
    scratch = scratch_root()
    paths = read_files(depfile)
    own = {os.path.abspath(s) for s in sources}
    read = [
        [placeholder(as_read(p, sources), scratch), content_digest(p, scratch)]
        for p in paths
        if p not in own
    ]
    name = hashlib.sha256(json.dumps([key, read]).encode()).hexdigest()
    outputs = os.path.join(cache, "outputs")
    os.makedirs(outputs, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=outputs, prefix=".")
    with open(output, "rb") as source, os.fdopen(fd, "wb") as target:
        shutil.copyfileobj(source, target)
    os.replace(partial, os.path.join(outputs, name))
    mode = os.stat(output).st_mode & 0o7777
    entries = [e for e in read_manifest(cache, key) if e["read"] != read]
    entries.append({"read": read, "output": name, "mode": mode})
    manifest = os.path.join(cache, "manifests", key + ".json")
    os.makedirs(os.path.dirname(manifest), exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=os.path.dirname(manifest), prefix=".")
    with os.fdopen(fd, "w") as file:
        json.dump(entries, file)
    os.replace(partial, manifest)


def as_read(path: str, sources: list[str]) -> str:
    """``path`` named from its source's folder where it lies there (a quoted
    include is found beside the file that includes it)."""
    for i, source in enumerate(sources):
        folder = os.path.dirname(os.path.abspath(source)) + os.sep
        if path.startswith(folder):
            return f"<source {i} folder>{os.sep}{path[len(folder) :]}"
    return path


def where_read(path: str, sources: list[str], scratch: str) -> str:
    """The file a manifest's ``path`` names in this call."""
    for i, source in enumerate(sources):
        role = f"<source {i} folder>"
        if path.startswith(role):
            return os.path.dirname(os.path.abspath(source)) + path[len(role) :]
    return in_session(path, scratch)


def read_manifest(cache: str, key: str) -> list[dict]:
    """The well-formed entries of ``key``'s manifest; none where it is
    missing or damaged."""
    try:
        with open(os.path.join(cache, "manifests", key + ".json")) as file:
            entries = json.load(file)
    except (OSError, ValueError):
        return []
    return [e for e in entries if well_formed(e)] if isinstance(entries, list) else []


def well_formed(entry) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("output"), str)
        and isinstance(entry.get("mode"), int)
        and isinstance(entry.get("read"), list)
        and all(
            isinstance(item, list)
            and len(item) == 2
            and all(isinstance(v, str) for v in item)
            for item in entry["read"]
        )
    )
