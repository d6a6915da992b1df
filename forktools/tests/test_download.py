import pytest

from forktools import download, materialize
from forktools.pins import ForkError

from .conftest import sha256


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
