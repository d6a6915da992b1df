"""Each failure stops with a clear message and a non-zero exit."""

from forktools import cli, export, materialize

from .conftest import BASE


def _fork(capsys) -> tuple[int, str]:
    code = cli.main(["fork", "--base", BASE])
    return code, capsys.readouterr().err


def test_fork_links_tree_and_reports_version(project, capsys):
    assert cli.main(["fork"]) == 0
    assert "vllm/ and tests/ are vLLM 9.9.9+fork." in capsys.readouterr().out
    assert (project.root / "vllm").is_symlink()


def test_wrong_sha256_exits_non_zero(project, capsys):
    project.pin(sdist_sha="f" * 64)
    code, err = _fork(capsys)
    assert code != 0
    assert "sha256 mismatch" in err and project.sdist.name in err


def test_offline_with_warm_cache_works(project, monkeypatch, capsys):
    assert _fork(capsys)[0] == 0
    materialize.tree_dir(project.base).rename(project.root / "old-tree")
    monkeypatch.setenv("PIP_FIND_LINKS", str(project.root / "no-wheelhouse"))
    assert _fork(capsys)[0] == 0


def test_offline_with_cold_cache_names_the_file(project, monkeypatch, capsys):
    monkeypatch.setenv("PIP_FIND_LINKS", str(project.root / "no-wheelhouse"))
    code, err = _fork(capsys)
    assert code != 0
    assert project.sdist.name in err


def test_patch_that_no_longer_applies_exits_non_zero(project, capsys):
    materialize.ensure(project.base)
    text = (project.tree / "vllm/core.py").read_text()
    project.commit("vllm/core.py", text.replace("return 5\n", "return 55\n"), "[X] y")
    [name] = export.export(project.base)
    patch = project.base.patch_dir / name
    patch.write_text(patch.read_text().replace("return 5\n", "return 500\n"))
    code, err = _fork(capsys)
    assert code != 0
    assert name in err and "vllm/core.py" in err


def test_unexported_edit_blocks_export_check_and_rebuild(project, capsys):
    materialize.ensure(project.base)
    (project.tree / "vllm/core.py").write_text("mine\n")
    assert cli.main(["export", "--base", BASE]) != 0
    assert cli.main(["check", "--base", BASE]) != 0
    assert "vllm/core.py" in capsys.readouterr().err
    assert (project.tree / "vllm/core.py").read_text() == "mine\n"


def test_every_command_has_help(capsys):
    for command in ("fork", "export", "check", "status", "verify", "lint", "test"):
        try:
            cli.main([command, "--help"])
        except SystemExit as exit:
            assert exit.code == 0
        assert "--base" in capsys.readouterr().out
