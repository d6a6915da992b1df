"""The harness's g++ output cache, run as Inductor runs it: by name on PATH,
with a counting g++ behind it that says when the real compiler ran."""

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forktools.proof import compiler_cache, runner

sys.path.insert(0, str(runner.HARNESS))
import vllm_cxx_cache  # noqa: E402

sys.path.remove(str(runner.HARNESS))

REAL_GXX = shutil.which("g++", path="/usr/local/bin:/usr/bin:/bin")
pytestmark = pytest.mark.skipif(REAL_GXX is None, reason="no g++ on this machine")


@pytest.fixture
def compiler(tmp_path):
    """Runs ``g++ args`` in the session folder ``session`` through the shim;
    returns its exit status. ``compiler.runs`` counts the real compiler's."""
    counted = tmp_path / "counted"
    counted.mkdir()
    calls = tmp_path / "calls"
    (counted / "g++").write_text(f'#!/bin/sh\necho >> {calls}\nexec {REAL_GXX} "$@"\n')
    (counted / "g++").chmod(0o755)
    cache = tmp_path / "cache"

    def run(session: Path, *args: str, cache: Path = cache) -> int:
        (session / "tmp").mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": os.pathsep.join(
                [
                    str(runner.COMPILER_SHIM),
                    str(Path(sys.executable).parent),
                    str(counted),
                    *runner.SYSTEM_PATH,
                ]
            ),
            "TMPDIR": str(session / "tmp"),
            vllm_cxx_cache.CACHE_ENV: str(cache),
        }
        return subprocess.run(["g++", *args], env=env, cwd=session).returncode

    run.runs = lambda: len(calls.read_text().splitlines()) if calls.exists() else 0
    run.cache = cache
    return run


def _session(root: Path, value: int) -> tuple[Path, Path]:
    """A session folder with a kernel that includes a header from its scratch
    folder by absolute path, as Inductor's do; returns it and the source."""
    (root / "tmp" / "prefix").mkdir(parents=True)
    (root / "tmp" / "prefix" / "prefix.h").write_text(f"#define VALUE {value}\n")
    source = root / "tmp" / "kernels" / "kernel.cpp"
    source.parent.mkdir()
    include = root / "tmp" / "prefix" / "prefix.h"
    source.write_text(
        f'#include "{include}"\nextern "C" int value() {{ return VALUE; }}\n'
    )
    return root, source


def _compile(compiler, session: Path, source: Path, **kwargs) -> int:
    output = source.with_suffix(".so")
    return compiler(
        session, str(source), "-shared", "-fPIC", "-O2", "-o", str(output), **kwargs
    )


def test_a_kernel_compiled_in_another_session_is_served_with_the_same_bytes(
    compiler, tmp_path
):
    first, first_source = _session(tmp_path / "a", 3)
    second, second_source = _session(tmp_path / "b", 3)
    assert _compile(compiler, first, first_source) == 0
    assert _compile(compiler, second, second_source) == 0
    assert compiler.runs() == 1
    built, served = first_source.with_suffix(".so"), second_source.with_suffix(".so")
    assert served.read_bytes() == built.read_bytes()
    assert stat.S_IMODE(served.stat().st_mode) == stat.S_IMODE(built.stat().st_mode)


def test_a_header_with_other_content_compiles_again(compiler, tmp_path):
    first, first_source = _session(tmp_path / "a", 3)
    second, second_source = _session(tmp_path / "b", 4)
    assert _compile(compiler, first, first_source) == 0
    assert _compile(compiler, second, second_source) == 0
    assert compiler.runs() == 2
    assert (
        first_source.with_suffix(".so").read_bytes()
        != second_source.with_suffix(".so").read_bytes()
    )


def test_a_quoted_include_is_read_beside_the_source_that_moved(compiler, tmp_path):
    sources = []
    for folder, value in (("a", 3), ("b", 4)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "beside.h").write_text(f"#define VALUE {value}\n")
        source = tmp_path / folder / "kernel.cpp"
        source.write_text('#include "beside.h"\nint value() { return VALUE; }\n')
        assert _compile(compiler, tmp_path, source) == 0
        sources.append(source)
    assert compiler.runs() == 2


def test_other_arguments_compile_again(compiler, tmp_path):
    session, source = _session(tmp_path / "a", 3)
    assert _compile(compiler, session, source) == 0
    assert compiler(session, str(source), "-shared", "-fPIC", "-O0", "-o", "k.so") == 0
    assert compiler.runs() == 2


def test_the_cpu_is_in_the_key(monkeypatch, tmp_path):
    _, source = _session(tmp_path, 3)
    args = [str(source), "-march=native", "-o", "k.so"]
    key = vllm_cxx_cache.call_key(REAL_GXX, args, "k.so", [str(source)])
    monkeypatch.setattr(vllm_cxx_cache, "cpu_identity", lambda: ["flags : avx2"])
    assert vllm_cxx_cache.call_key(REAL_GXX, args, "k.so", [str(source)]) != key


def test_a_failed_compile_returns_its_status_and_is_not_kept(compiler, tmp_path):
    (tmp_path / "bad.cpp").write_text("int value() { return\n")
    for _ in range(2):
        assert compiler(tmp_path, "bad.cpp", "-shared", "-o", "bad.so") != 0
    assert compiler.runs() == 2
    assert not (tmp_path / "bad.so").exists()
    assert not list((compiler.cache / "manifests").glob("*"))


@pytest.mark.parametrize("damage", ["not json", '[{"read": 1}]', "[]"])
def test_a_damaged_manifest_compiles_and_is_replaced(compiler, tmp_path, damage):
    first, first_source = _session(tmp_path / "a", 3)
    assert _compile(compiler, first, first_source) == 0
    for manifest in (compiler.cache / "manifests").glob("*.json"):
        manifest.write_text(damage)
    second, second_source = _session(tmp_path / "b", 3)
    assert _compile(compiler, second, second_source) == 0
    third, third_source = _session(tmp_path / "c", 3)
    assert _compile(compiler, third, third_source) == 0
    assert compiler.runs() == 2
    assert third_source.with_suffix(".so").exists()


def test_a_cache_that_cannot_be_written_compiles_every_time(compiler, tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    for name in ("a", "b"):
        session, source = _session(tmp_path / name, 3)
        assert _compile(compiler, session, source, cache=blocker / "cache") == 0
        assert source.with_suffix(".so").exists()
    assert compiler.runs() == 2


def test_a_lost_output_compiles_again(compiler, tmp_path):
    first, first_source = _session(tmp_path / "a", 3)
    assert _compile(compiler, first, first_source) == 0
    shutil.rmtree(compiler.cache / "outputs")
    second, second_source = _session(tmp_path / "b", 3)
    assert _compile(compiler, second, second_source) == 0
    assert compiler.runs() == 2
    assert second_source.with_suffix(".so").exists()


def test_what_is_not_a_compile_to_one_output_goes_to_g_plus_plus(compiler, tmp_path):
    _, source = _session(tmp_path, 3)
    assert compiler(tmp_path, "--version") == 0
    assert compiler(tmp_path, "-E", str(source), "-o", "k.i") == 0
    assert compiler.runs() == 2
    assert not compiler.cache.exists()


def test_a_manifest_names_the_scratch_folder_by_a_placeholder(compiler, tmp_path):
    session, source = _session(tmp_path / "a", 3)
    assert _compile(compiler, session, source) == 0
    (manifest,) = (compiler.cache / "manifests").glob("*.json")
    read = [
        path for entry in json.loads(manifest.read_text()) for path, _ in entry["read"]
    ]
    assert f"{vllm_cxx_cache.SCRATCH}/tmp/prefix/prefix.h" in read
    assert not any(str(tmp_path) in path for path in read)
    assert sorted(os.listdir(session / "tmp")) == ["kernels", "prefix"]


def _aged(path: Path, content: bytes, seconds_ago: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    then = time.time() - seconds_ago
    os.utime(path, (then, then))
    return path


def test_trimming_removes_the_least_recently_used_first(tmp_path):
    oldest = _aged(tmp_path / "outputs" / "a", b"x" * 100, 300)
    older = _aged(tmp_path / "manifests" / "b.json", b"x" * 100, 200)
    recent = _aged(tmp_path / "outputs" / "c", b"x" * 100, 100)
    assert compiler_cache.trim(tmp_path, limit=150) == 200
    assert not oldest.exists() and not older.exists() and recent.exists()
    assert compiler_cache.trim(tmp_path, limit=150) == 0


def test_trimming_removes_what_a_killed_compile_left_behind(tmp_path):
    left = _aged(tmp_path / ".deps-abc", b"x", compiler_cache.LEFT_BEHIND_SECONDS + 60)
    writing = _aged(tmp_path / "outputs" / ".partial", b"x", 10)
    assert compiler_cache.trim(tmp_path) == 1
    assert not left.exists() and writing.exists()


def test_trimming_a_cache_that_is_not_there_removes_nothing(tmp_path):
    assert compiler_cache.trim(tmp_path / "none") == 0
