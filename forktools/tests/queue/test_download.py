import concurrent.futures
import time

import pytest

from forktools.queue import download, materialize
from forktools.queue.pins import ForkError

from forktools.tests.conftest import sha256


def test_fetch_verifies_and_caches(project):
    path = download.fetch(project.base.sdist)
    assert path.read_bytes() == project.sdist.read_bytes()
    assert path.parent == download.cache_dir() / "downloads"


def test_hash_mismatch_refused_and_nothing_kept(project, capsys):
    project.pin(sdist_sha="0" * 64)
    with pytest.raises(ForkError) as error:
        materialize.ensure(project.base)
    message = str(error.value)
    assert project.sdist.name in message
    assert "0" * 64 in message
    assert sha256(project.sdist) in message
    assert list((download.cache_dir() / "downloads").iterdir()) == []
    assert not project.tree.exists()


def test_warm_cache_works_offline(project, monkeypatch):
    download.fetch(project.base.sdist)
    monkeypatch.setenv("PIP_FIND_LINKS", str(project.root / "nowhere"))
    assert download.fetch(project.base.sdist).exists()


def test_partial_download_is_not_trusted(project):
    cached = download.cache_dir() / "downloads" / project.sdist.name
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"half a file")
    cached.with_name(cached.name + ".part").write_bytes(b"left by a crash")
    assert download.fetch(project.base.sdist).read_bytes() == project.sdist.read_bytes()
    assert not cached.with_name(cached.name + ".part").exists()


def test_unknown_file_names_the_file(project):
    project.sdist.unlink()
    with pytest.raises(ForkError, match=project.sdist.name):
        download.fetch(project.base.sdist)


def test_progress_is_reported(project, capsys):
    download.fetch(project.base.sdist)
    assert f"downloading {project.sdist.name}" in capsys.readouterr().err


def test_two_runs_at_once_download_once(project, monkeypatch, capsys):

    def download_slowly(*args, original=download._download):
        time.sleep(0.5)
        original(*args)

    monkeypatch.setattr(download, "_download", download_slowly)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(download.fetch, project.base.sdist) for _ in range(2)]
        paths = [run.result() for run in runs]

    assert paths[0] == paths[1]
    assert paths[0].read_bytes() == project.sdist.read_bytes()
    err = capsys.readouterr().err
    assert err.count(f"downloading {project.sdist.name}") == 1
    lock = download.lock_file(f"download-{project.sdist.name}")
    assert f"waiting for another run to download {project.sdist.name}" in err
    assert str(lock) in err
    assert sorted(p.name for p in paths[0].parent.iterdir()) == [project.sdist.name]


def test_temporary_files_are_this_runs_own(project, monkeypatch):
    seen = []

    def record_destination(url, dest, *args):
        seen.append(dest)
        dest.write_bytes(project.sdist.read_bytes())

    monkeypatch.setattr(download, "_download", record_destination)
    download.fetch(project.base.sdist)
    cached = download.cache_dir() / "downloads" / project.sdist.name
    assert seen[0].parent == cached.parent
    assert seen[0] != cached.with_name(cached.name + ".part")
