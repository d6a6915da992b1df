"""Environments built from committed locks, and the locks' errors."""

import hashlib
import platform
import subprocess

import pytest

from forktools.environments import lockfiles, tools, venv
from forktools.queue.pins import ForkError

from forktools.tests.conftest import BASE, VERSION, installable_wheel

TINY = "tinydep"


def _tiny_wheel(index, version: str = "1.0", body: str = "") -> str:
    """A pure-Python wheel ``tinydep`` in ``index``; its lock line."""
    wheel = installable_wheel(index / f"{TINY}-{version}-py3-none-any.whl", body)
    return f"{TINY}=={version} --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}"


@pytest.fixture
def installable(project):
    """The project, its pinned vLLM wheel one that pip installs."""
    installable_wheel(project.wheel)
    project.pin()
    return project


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> list[str]:
    """What ``python -m venv`` puts in, locked with any hash: pip finds it
    installed already and fetches nothing."""
    fresh = tmp_path_factory.mktemp("seeds")
    venv.make_venv(fresh)
    listed = lockfiles.installed_set(fresh / "bin" / "python")[1:]
    return [f"{seed} --hash=sha256:{'0' * 64}" for seed in listed]


def test_environment_from_a_lock_in_an_empty_cache_holds_exactly_the_lock(
    installable, seeds
):
    project = installable
    project.lock("test", *seeds, _tiny_wheel(project.index))
    python = venv.ensure(project.base)
    listed = lockfiles.installed_set(python)
    assert listed == venv.environment(project.base, "test")
    assert f"{TINY}==1.0" in listed and f"vllm=={VERSION}" in listed
    assert listed[0] == f"python {platform.python_version()} {platform.machine()}"


def test_a_file_whose_hash_differs_is_refused_in_one_line(project, seeds):
    locked = _tiny_wheel(project.index)
    _tiny_wheel(project.index, body="# another build under the same version\n")
    project.lock("test", *seeds, locked)
    with pytest.raises(ForkError) as refused:
        venv.ensure(project.base)
    said = str(refused.value)
    assert "\n" not in said
    assert f"{TINY}==1.0: the file the index serves" in said
    assert f"locks/{BASE}/test.txt pins {locked.split(':')[-1]}: refused" in said
    assert not list((project.root.parent / "cache" / "venvs").glob(f"{BASE}-*"))


def test_a_lock_the_index_cannot_serve_names_the_distribution_and_make_lock(
    project, seeds
):
    _tiny_wheel(project.index)
    project.lock("test", *seeds, f"{TINY}==2.0 --hash=sha256:{'1' * 64}")
    with pytest.raises(ForkError) as unservable:
        venv.ensure(project.base)
    said = str(unservable.value)
    assert "\n" not in said
    assert f"no longer serves {TINY}==2.0, which locks/{BASE}/test.txt pins" in said
    assert f"`make lock BASE={BASE}`" in said


def test_an_environment_that_is_not_its_lock_is_refused(installable, seeds):
    project = installable
    project.lock("test", *seeds, _tiny_wheel(project.index))
    env = venv.ensure(project.base).parent.parent
    project.lock("test", *seeds)  # as if tinydep had been installed by hand
    with pytest.raises(ForkError, match=rf"holds {TINY}==1\.0\. Remove {env}"):
        venv._check_locked_set(project.base, "test", env)


def test_an_editable_install_in_the_working_directory_is_not_the_environment(
    installable, seeds, tmp_path, monkeypatch
):
    project = installable
    project.lock("test", *seeds, _tiny_wheel(project.index))
    env = venv.ensure(project.base).parent.parent
    clone = tmp_path / "clone"  # where `pip install -e .` left its metadata
    (clone / "vllm.egg-info").mkdir(parents=True)
    (clone / "vllm.egg-info" / "PKG-INFO").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}+fork.1e98434ccc\n"
    )
    monkeypatch.chdir(clone)
    monkeypatch.setenv("PYTHONPATH", str(clone))
    venv._check_locked_set(project.base, "test", env)


def test_a_lock_for_another_python_says_which(project):
    path = project.lock("test")
    path.write_text(path.read_text().replace("for Python 3.", "for Python 2."))
    with pytest.raises(ForkError, match=r"is for Python 2\.\d+ on .*make lock"):
        venv.environments(project.base)


def test_a_lock_that_is_missing_says_make_lock(project):
    lockfiles.path(project.base, "test").unlink()
    with pytest.raises(ForkError, match=rf"no lock for {BASE}'s test.*`make lock"):
        venv.environments(project.base)


def test_the_ledger_text_is_the_locks_set_with_the_wheel(project):
    project.lock(
        "test", f"b==2 --hash=sha256:{'0' * 64}", f"a==1 --hash=sha256:{'0' * 64}"
    )
    assert venv.environments(project.base) == {
        "test": [
            f"python {platform.python_version()} {platform.machine()}",
            "a==1",
            "b==2",
            f"vllm=={VERSION}",
        ]
    }


def test_moves_name_each_distribution_old_and_new(tmp_path):
    def lock(*pinned):
        return lockfiles.Lock(tmp_path, "3.11", "x86_64", pinned)

    a, b = lockfiles.Pinned("a", "1", "0" * 64), lockfiles.Pinned("b", "1", "0" * 64)
    moved = lock(
        lockfiles.Pinned("a", "2", "1" * 64), lockfiles.Pinned("c", "1", "0" * 64)
    )
    assert lockfiles.moves(lock(a, b), moved) == [
        "a 1 -> 2",
        "b 1 -> (gone)",
        "c (none) -> 1",
    ]
    assert lockfiles.moves(lock(a), lock(lockfiles.Pinned("a", "1", "1" * 64))) == [
        f"a 1: another file (sha256 {'1' * 12})"
    ]
    assert lockfiles.moves(lock(a), lock(a)) == []


def test_a_rendered_lock_reads_back(project):
    pinned = (lockfiles.Pinned("torch_c_dlpack_ext", "0.1.5", "a" * 64),)
    lock = lockfiles.read(project.base, "test", platform.python_version())
    written = lockfiles.Lock(lock.path, lock.python, lock.machine, pinned)
    lock.path.write_text(lockfiles.render(written, "test environment"))
    assert lockfiles.read(project.base, "test", platform.python_version()) == written


def test_a_tool_with_a_lock_is_installed_from_it(project, seeds):
    locked = _tiny_wheel(project.index)
    lock = tools.lock_path(tools.environment_name(f"{TINY}==1.0"))
    lock.parent.mkdir(parents=True)
    python = ".".join(platform.python_version_tuple()[:2])
    lock.write_text(f"# for Python {python} on {platform.machine()}\n")
    lock.write_text(lock.read_text() + "".join(f"{line}\n" for line in [*seeds, locked]))
    env = tools.environment(f"{TINY}==1.0")
    assert env.name.startswith(f"{TINY}-1.0@")  # a moved lock gets a new one
    shown = subprocess.run(
        [env / "bin" / "python", "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"{TINY}==1.0" in shown.stdout.split()


def test_a_tool_without_a_lock_is_refused_naming_make_lock(project):
    _tiny_wheel(project.index)  # the index serves it; nothing is taken unlocked
    with pytest.raises(ForkError) as refused:
        tools.environment(f"{TINY}==1.0")
    said = str(refused.value)
    assert "\n" not in said
    assert f"{TINY}==1.0 has no lock (locks/tools/{TINY}-1.0.txt): `make lock`" in said
    with pytest.raises(ForkError, match=r"pytest-xdist==3\.8\.0 execnet==2\.1\.2 has"):
        tools.packages(tools.XDIST)


def test_a_lock_line_without_its_hash_names_the_file_and_the_line(project):
    path = project.lock("test", f"a==1 --hash=sha256:{'0' * 64}", "b==2")
    with pytest.raises(ForkError, match=rf"{path}: 'b==2' is not `name==version"):
        venv.environments(project.base)
