"""`make wheel`: the upstream wheel with the queue in place, reproducible."""

import base64
import csv
import hashlib
import io
import os
import platform
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from forktools.shipping import build_backend, wheel
from forktools import cli
from forktools.queue import export, materialize, status

from forktools.tests.conftest import (
    BASE,
    SDIST_FILES,
    VERSION,
    WHEEL_FILES,
    _sdist,
    copy_tooling,
    git,
    installable_wheel,
    sha256,
)
from .test_editable_install import build_wheelhouse  # noqa: F401 (a fixture)

DIST_INFO = f"vllm-{VERSION}.dist-info"
UPSTREAM = {
    **WHEEL_FILES,
    "vllm/legacy.py": "OLD = True\n",
    "vllm/launch.sh": "#!/bin/sh\nexec vllm serve\n",
    f"{DIST_INFO}/WHEEL": (
        "Wheel-Version: 1.0\nGenerator: setuptools (80.10.2)\n"
        "Root-Is-Purelib: false\nTag: py3-none-linux_{arch}\n\n"
    ),
    f"{DIST_INFO}/licenses/LICENSE": "Apache License 2.0\n",
}
EXECUTABLE = {"vllm/launch.sh", "vllm/_C.abi3.so"}
PATCHED_CORE = SDIST_FILES["vllm/core.py"].replace("return 3\n", "return 33\n")
ADDED = "ADDED = 'by the queue'\n"


def upstream_wheel(path: Path, arch: str) -> None:
    """A wheel as setuptools writes it: deflated, modes, WHEEL and RECORD."""
    files = {name: text.format(arch=arch).encode() for name, text in UPSTREAM.items()}
    rows = [[name, *wheel._hash(data)] for name, data in files.items()]
    files[f"{DIST_INFO}/RECORD"] = wheel._csv([*rows, [f"{DIST_INFO}/RECORD", "", ""]])
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 11, 1, 9, 25, 6))
            info.compress_type = zipfile.ZIP_DEFLATED
            mode = 0o755 if name in EXECUTABLE else 0o644
            info.external_attr = (0o100000 | mode) << 16
            archive.writestr(info, data)


def wheel_name(arch: str) -> str:
    return f"vllm-{VERSION}-py3-none-manylinux_2_17_{arch}.whl"


@pytest.fixture
def fleet(project):
    """The miniature release pinned for x86_64 and aarch64, and a one-patch
    queue that changes vllm/core.py, adds vllm/added.py, removes
    vllm/legacy.py and touches tests/ (which no wheel ships)."""
    _sdist(project.sdist, VERSION, {**SDIST_FILES, "vllm/legacy.py": "OLD = True\n"})
    wheels = [project.index / wheel_name(arch) for arch in ("x86_64", "aarch64")]
    for path, arch in zip(wheels, ("x86_64", "aarch64"), strict=False):
        upstream_wheel(path, arch)
    project.pin(wheels=wheels)
    tree = materialize.ensure(project.base)
    (tree / "vllm/core.py").write_text(PATCHED_CORE)
    (tree / "vllm/added.py").write_text(ADDED)
    (tree / "tests/test_core.py").write_text("def test_layer_3():\n    pass\n")
    git(tree, "rm", "-q", "vllm/legacy.py")
    git(tree, "add", "vllm", "tests")
    git(tree, "commit", "-q", "-s", "-m", "[Bugfix][Core] Make layer 3 return 33")
    export.export(project.base)
    return project


def this_machine() -> str:
    return wheel_name(platform.machine())


def build(project, out: Path) -> wheel.Built:
    artifact = project.base.wheel_for_this_machine()
    return wheel.build(project.base, artifact, out)


def read_all(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def test_fork_wheel_is_upstream_with_the_queue_in_place(fleet, tmp_path):
    built = build(fleet, tmp_path / "dist")
    version = materialize.version(fleet.base)
    fork_info = f"vllm-{version}.dist-info"

    assert built.path.name == f"vllm-{version}-py3-none-manylinux_2_17_{platform.machine()}.whl"
    upstream, fork = read_all(fleet.index / this_machine()), read_all(built.path)
    assert fork["vllm/core.py"].decode() == PATCHED_CORE
    assert fork["vllm/added.py"].decode() == ADDED
    assert "vllm/legacy.py" not in fork
    assert not [name for name in fork if name.startswith(("tests/", DIST_INFO))]
    assert f"__version__ = version = {version!r}" in fork["vllm/_version.py"].decode()
    for name in ("vllm/_C.abi3.so", "vllm/__init__.py", "vllm/launch.sh"):
        assert fork[name] == upstream[name]
    for name in ("WHEEL", "entry_points.txt", "licenses/LICENSE"):
        assert fork[f"{fork_info}/{name}"] == upstream[f"{DIST_INFO}/{name}"]
    metadata = fork[f"{fork_info}/METADATA"].decode()
    upstream_metadata = upstream[f"{DIST_INFO}/METADATA"].decode()
    assert metadata == upstream_metadata.replace(
        f"Version: {VERSION}\n", f"Version: {version}\n"
    )
    with zipfile.ZipFile(built.path) as archive:
        modes = {info.filename: info.external_attr >> 16 for info in archive.infolist()}
    assert modes["vllm/_C.abi3.so"] == modes["vllm/launch.sh"] == 0o100755
    assert modes["vllm/core.py"] == modes["vllm/added.py"] == 0o100644


def test_record_lists_every_file_with_its_hash(fleet, tmp_path):
    built = build(fleet, tmp_path / "dist")
    files = read_all(built.path)
    record_name = f"vllm-{materialize.version(fleet.base)}.dist-info/RECORD"

    assert list(files)[-1] == record_name
    rows = list(csv.reader(io.StringIO(files.pop(record_name).decode())))
    assert rows[-1] == [record_name, "", ""]
    recorded = {name: (digest, size) for name, digest, size in rows[:-1]}
    assert sorted(recorded) == sorted(files)
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
        assert recorded[name] == (f"sha256={digest.rstrip(b'=').decode()}", str(len(data)))


def test_two_builds_are_byte_identical(fleet, tmp_path):
    first = build(fleet, tmp_path / "first")
    materialize.build(fleet.base)  # a fresh tree: new commit dates, same queue
    (fleet.tree / "vllm/core.py").write_text("unexported edit\n")
    second = build(fleet, tmp_path / "second")

    assert first.path.read_bytes() == second.path.read_bytes()
    assert first.sha256 == second.sha256 == sha256(second.path)


def _version_for(base, arch: str) -> str:
    """The version label of the fork wheel made from ``arch``'s wheel."""
    [artifact] = [w for w in base.wheels if w.file.endswith(f"_{arch}.whl")]
    return materialize.version(base, artifact)


def test_manifest_and_status_name_the_inputs_and_the_wheel(fleet, capsys):
    assert cli.main(["wheel", "--all-platforms", "--no-lock"]) == 0
    dist = fleet.root / "dist"
    version = materialize.version(fleet.base)

    built = sorted(path.name for path in dist.glob("*.whl"))
    assert built == sorted(
        f"vllm-{_version_for(fleet.base, arch)}-py3-none-manylinux_2_17_{arch}.whl"
        for arch in ("aarch64", "x86_64")
    )
    # Each platform's label follows its own compiled code.
    assert _version_for(fleet.base, "aarch64") != _version_for(fleet.base, "x86_64")
    [x86, aarch] = [
        m for arch in ("x86_64", "aarch64")
        for m in wheel.manifests(fleet.base) if arch in m["wheel"]
    ]  # fmt: skip
    assert aarch["upstream_wheel"] == {
        "file": wheel_name("aarch64"),
        "sha256": sha256(fleet.index / wheel_name("aarch64")),
    }
    assert x86["sha256"] == sha256(dist / x86["wheel"])
    assert x86["version"] == version and x86["base"] == BASE
    assert len(x86["queue"]["patches"]) == 1
    assert x86["changed"] == ["vllm/added.py", "vllm/core.py"]
    assert x86["removed"] == ["vllm/legacy.py"]
    lines = wheel.status_lines([fleet.base])
    assert f"wheel: dist/{x86['wheel']} sha256 {x86['sha256']}, from " in "".join(lines)
    assert x86["sha256"] in capsys.readouterr().out


def test_beside_the_wheel_a_hashed_node_lock_and_its_constraints(fleet, capsys):
    numpy = installable_wheel(fleet.index / "numpy-2.0-py3-none-any.whl")
    assert cli.main(["wheel"]) == 0
    [built] = (fleet.root / "dist").glob("*.whl")
    python = ".".join(platform.python_version_tuple()[:2])
    stem = f"{built.name}.python{python}"
    lock = (fleet.root / "dist" / f"{stem}.lock.txt").read_text()
    assert f"numpy==2.0 \\\n    --hash=sha256:{sha256(numpy)}\n" in lock
    assert "six" not in lock  # its marker is false on this Python
    assert (fleet.root / "dist" / f"{stem}.constraints.txt").read_text() == "numpy==2.0\n"
    assert f"lock {built}.python{python}.lock.txt" in capsys.readouterr().out


def test_a_requirement_the_index_lacks_is_one_line_and_the_wheel_is_kept(
    fleet, capsys
):
    assert cli.main(["wheel", "--all-platforms"]) == 1
    why = {
        arch: "the package index serves no numpy"
        if arch == platform.machine()
        else "pip resolves environment markers for the machine it runs on; "
        f"run `make wheel` on an {arch} machine"
        for arch in ("x86_64", "aarch64")
    }
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "no lock for" in line] == [
        "vllm-fork: no lock for "
        f"{wheel.fork_wheel_name(wheel_name(arch), _version_for(fleet.base, arch))}: "
        + why[arch]
        for arch in ("x86_64", "aarch64")
    ]
    assert len(list((fleet.root / "dist").glob("*.whl"))) == 2


def test_pip_installs_the_wheel_into_a_fresh_venv(fleet, tmp_path):
    built = build(fleet, tmp_path / "dist")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    subprocess.run([*install, built.path], check=True)

    script = (
        "import importlib.metadata, pathlib, vllm, vllm.added, vllm.core; "
        "print(vllm.__version__, importlib.metadata.version('vllm'), "
        "vllm.core.layer_3(), vllm.added.ADDED, "
        "(pathlib.Path(vllm.__file__).parent / '_C.abi3.so').exists())"
    )
    shown = subprocess.run(
        [python, "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.split()
    version = materialize.version(fleet.base)
    assert shown == [version, version, "33", "by", "the", "queue", "True"]
    assert (venv / "bin" / "vllm").exists()


def test_pip_wheel_of_the_repository_is_the_make_wheel_wheel(
    fleet,
    tmp_path,
    build_wheelhouse,  # noqa: F811
):
    copy_tooling(fleet.root, "setup.py", "pyproject.toml")
    env = {
        **os.environ,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_FIND_LINKS": f"{build_wheelhouse} {fleet.index}",
    }
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", "out", "."]
    result = subprocess.run(
        command, cwd=fleet.root, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr

    [from_pip] = (fleet.root / "out").glob("*.whl")
    from_make = build(fleet, tmp_path / "dist")
    assert from_pip.name == from_make.path.name
    assert from_pip.read_bytes() == from_make.path.read_bytes()
    assert not (fleet.root / "vllm").exists()  # building switched no base


def test_pip_install_dot_refuses_a_tree_with_unexported_edits(project, tmp_path):
    materialize.ensure(project.base)
    (project.tree / "vllm/core.py").write_text("edited\n")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as refused:
        build_backend.build_wheel(str(out))
    said = str(refused.value.code)
    assert "refusing to build the v9.9.9 fork wheel" in said and "vllm/core.py" in said
    assert not out.exists()


def test_sdist_refuses_and_points_to_make_wheel(tmp_path):
    with pytest.raises(SystemExit) as refused:
        build_backend.build_sdist(str(tmp_path))
    assert "`make wheel`" in str(refused.value.code)
    assert list(tmp_path.iterdir()) == []
