"""Each failure stops with a clear message and a non-zero exit."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from forktools import cli
from forktools.queue import export, materialize, pins
from forktools.environments import tools
from forktools.queue.pins import ROOT, ForkError

from .conftest import BASE, tool_lock


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


def test_an_unknown_base_names_where_it_came_from(project, monkeypatch, capsys):
    assert cli.main(["fork", "--base", "v9"]) != 0
    assert f"unknown base 'v9': upstream.toml pins {BASE}" in capsys.readouterr().err
    monkeypatch.setenv("VLLM_FORK_BASE", "v8")
    assert cli.main(["fork"]) != 0
    said = capsys.readouterr().err
    assert f"unknown base 'v8' (from VLLM_FORK_BASE): upstream.toml pins {BASE}" in said


def test_make_names_a_variable_it_does_not_read():
    for typed in ("base=v0.33.0", "BAES=v0.33.0"):
        made = subprocess.run(
            ["make", "-C", str(ROOT), "help", typed], capture_output=True, text=True
        )
        assert made.returncode == 2
        assert f"{typed} is not a variable of this Makefile; it reads PYTHON BASE" in (
            made.stderr
        )
    made = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "fixes", "BASE=v0.33.0", "VLLM_FORK_X=0"],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr


@pytest.mark.parametrize(
    "given, said",
    [
        (["status", "FRESH=1"], "FRESH=1 is not read by make status: status reads "),
        (["help", "BASE=v0.33.0"], "BASE=v0.33.0 is not read by make help: help "),
        (["check", "lint", "JOBS=2"], "check reads BASE; lint reads BASE;"),
        (["rebase", "TO=0.35.0", "BASE=v0.34.0"], "rebase reads TO PROBE PORTED;"),
    ],
)
def test_make_refuses_a_variable_its_target_does_not_read(given, said):
    made = subprocess.run(
        ["make", "-n", "-C", str(ROOT), *given], capture_output=True, text=True
    )
    assert made.returncode == 2
    assert said in made.stderr and "nothing was run" in made.stderr
    assert "forktools" not in made.stdout


def test_each_target_says_what_it_reads():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z-]+):.*## ", makefile, re.M))
    listed = set(re.findall(r"^reads_([a-z-]+) :=", makefile, re.M))
    assert targets == listed
    for target in targets:
        recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)*)", makefile, re.M)
        switches = set(re.findall(r"\$\(([A-Z][A-Z_]*)\)", recipe.group(1)))
        read = re.search(rf"^reads_{target} :=(.*)$", makefile, re.M).group(1).split()
        assert switches - {"PYTHON"} - MAKE_OWN_VARIABLES <= set(read), target


MAKE_OWN_VARIABLES = {"MAKE", "MAKEFILE_LIST", "MAKEFLAGS", "MAKECMDGOALS", "CURDIR"}


def test_make_accepts_every_variable_its_targets_read():
    makefile = (ROOT / "Makefile").read_text()
    known = re.search(r"^known_vars := (.*)$", makefile, re.M)
    assert known is not None
    read = set(re.findall(r"\$\(([A-Z][A-Z_]*)\)", makefile)) - MAKE_OWN_VARIABLES
    assert read - set(known.group(1).split()) == set()


def test_an_old_python_gets_one_line():
    old_python = (
        "import runpy, sys; sys.version_info = (3, 10, 13, 'final', 0); "
        "runpy.run_module('forktools', run_name='__main__')"
    )
    ran = subprocess.run(
        [sys.executable, "-c", old_python, "status"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 1
    [line] = ran.stderr.splitlines()
    assert line.startswith("python -m forktools needs Python 3.11 or newer;")


def test_a_closed_pipe_is_quiet(tmp_path):
    script = tmp_path / "long_status.py"
    script.write_text(
        "import sys\n"
        "from forktools import cli\n\n\n"
        "def long_table(args):\n"
        "    \"\"\"A table longer than a pipe holds.\"\"\"\n"
        "    print('row\\n' * 10**6)\n"
        "    return 0\n\n\n"
        "cli.COMMANDS['status'] = long_table\n"
        "sys.exit(cli.main(['status']))\n"
    )
    ran = subprocess.run(
        f"{sys.executable} {script} | head -1; exit ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "row\n", "")


def test_a_release_candidate_pins_and_sorts_before_its_release(project):
    pinned = project.root / "upstream.toml"
    text = pinned.read_text()
    rc = text.replace(BASE, "v10.0.0rc1").replace('"9.9.9"', '"10.0.0rc1"')
    pinned.write_text(text + rc.split("\n", 1)[1])
    assert [b.name for b in pins.load().newest_first()] == ["v10.0.0rc1", BASE]
    pinned.write_text(text.replace('"9.9.9"', '"9.9.x"'))
    with pytest.raises(ForkError, match=r"upstream.toml: malformed pin file .*'9.9.x'"):
        pins.load()


def test_check_here_downloads_and_builds_nothing(project, capsys):
    assert cli.main(["check", "--here"]) == 0
    said = capsys.readouterr()
    assert f"{BASE}: not checked, its tree is not built" in said.err
    assert said.out == "check: nothing checked (no base's tree is built for its queue)\n"
    assert not (project.root / ".fork").exists()
    assert not materialize.download.cache_dir().exists()
    materialize.ensure(project.base)
    (project.tree / "vllm/core.py").write_text("edited\n")
    assert cli.main(["check", "--here"]) == 1
    assert "unexported edit in vllm/core.py" in capsys.readouterr().err


def test_make_test_passes_its_arguments_to_every_stage(project, capsys):
    args = cli.parser().parse_args(["test"])
    assert cli.cmd_check(args) == 0
    assert cli.cmd_verify(args) == 0
    assert "every queue is empty" in capsys.readouterr().out


def test_make_test_lints_beside_the_environments_then_runs_the_rest(
    project, monkeypatch, capsys
):
    import threading

    linting = threading.Event()
    ran = []

    def environments(bases):
        assert linting.wait(10), "lint did not start beside the environments"
        ran.append("environments")
        return [Path(sys.executable)]

    def stage(name):
        return lambda *args, **kwargs: ran.append(name) or 0

    monkeypatch.setattr(cli, "_environments", environments)
    monkeypatch.setattr(cli, "cmd_lint", lambda args: linting.set() or 0)
    monkeypatch.setattr(cli, "_tooling_tests", stage("tooling"))
    monkeypatch.setattr(cli, "cmd_check", stage("check"))
    monkeypatch.setattr(cli, "cmd_verify", stage("verify"))
    monkeypatch.setattr(cli, "cmd_read_only", stage("read-only"))
    assert cli.cmd_test(cli.parser().parse_args(["test"])) == 0
    assert ran == ["environments", "tooling", "check", "verify", "read-only"]
    assert "stages: 6 passed, 0 failed" in capsys.readouterr().out


@pytest.mark.parametrize(
    "module",
    sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in (ROOT / "forktools").rglob("*.py")
        if path.stem not in {"__main__", "engine_run"}
        and not {"tests", "harness", "benchmarks"} & set(path.parts)
    ),
)
def test_every_tooling_module_imports(module):
    """A command whose module does not import fails only when somebody runs
    it, perhaps once a release (``make bench``); catch that here."""
    subprocess.run(
        [sys.executable, "-c", f"import {module}"], cwd=ROOT, check=True
    )


def _tooling_run(monkeypatch, packages) -> tuple[list[str], dict[str, str]]:
    """The command and environment the tooling tests would run under."""
    seen = {}

    def run(command, cwd, env):
        seen.update(command=command, env=env)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(tools, "packages", packages)
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert cli.main(["test-tooling"]) == 0
    return seen["command"], seen["env"]


def test_tooling_tests_spread_over_the_cpus(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", "/theirs")
    command, env = _tooling_run(monkeypatch, lambda requirements: tmp_path)
    assert command[-4:] == ["-n", "2", "--dist", "loadfile"]
    assert env["PYTHONPATH"] == f"{tmp_path}{os.pathsep}/theirs"


def test_tooling_tests_without_an_index_run_in_one_process(monkeypatch, capsys):
    def offline(requirements):
        raise ForkError("could not install pytest-xdist==3.8.0 (no index)")

    command, _ = _tooling_run(monkeypatch, offline)
    assert command[-2:] == ["-q", "forktools/tests"]
    assert capsys.readouterr().err == (
        "tooling tests in one process: could not install pytest-xdist==3.8.0 "
        "(no index)\n"
    )


def test_a_package_that_cannot_be_installed_is_named_and_leaves_nothing(project):
    tool_lock(tools.packages_name(("nothing-here==1.0",)), "nothing-here==1.0")
    with pytest.raises(ForkError, match=r"could not install nothing-here==1\.0 \("):
        tools.packages(("nothing-here==1.0",))
    assert not (project.root.parent / "cache" / "tools" / "nothing-here-1.0").exists()


@pytest.mark.parametrize("value", ["", "0", "no", "false", "off", "1", "yes"])
def test_a_make_switch_is_off_when_empty_0_no_false_or_off(value):
    made = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "verify", f"FRESH={value}"],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    assert ("--fresh" in made.stdout) == (value in ("1", "yes"))


def test_make_verify_refuses_patch_without_hunks():
    for switches in ([], ["HUNKS=0"]):
        made = subprocess.run(
            ["make", "-n", "-C", str(ROOT), "verify", "PATCH=2", *switches],
            capture_output=True,
            text=True,
        )
        assert made.returncode == 2
        assert "PATCH=2 goes with HUNKS=1 (make verify HUNKS=1 PATCH=n)" in made.stderr
        assert "forktools verify" not in made.stdout


def test_tooling_tests_leave_the_hosts_pytest_plugins_out(monkeypatch, tmp_path):
    ran = []
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(tools, "packages", lambda requirements: tmp_path)
    monkeypatch.setattr(
        subprocess,
        "run",
        lambda command, **kwargs: ran.append((command, kwargs["env"]))
        or subprocess.CompletedProcess(command, 0),
    )
    assert cli._tooling_tests(sys.executable) == 0
    [(command, env)] = ran
    assert env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    assert command[command.index("-p") + 1] == "xdist.plugin"
    assert str(tmp_path) in env["PYTHONPATH"].split(os.pathsep)


def test_every_command_honours_or_refuses_vllm_fork_base(project, monkeypatch, capsys):
    monkeypatch.setenv("VLLM_FORK_BASE", "v0.1.0")
    assert cli.main(["status"]) == 2
    said = capsys.readouterr().err
    assert f"unknown base 'v0.1.0' (from VLLM_FORK_BASE): upstream.toml pins {BASE}" in said
    monkeypatch.setenv("VLLM_FORK_BASE", BASE)
    assert [base.name for base in cli._bases(cli.parser().parse_args(["status"]))] == [
        BASE
    ]


def test_a_base_is_named_with_or_without_its_v(project):
    assert pins.load().get(BASE.removeprefix("v")).name == BASE
    from forktools.queue import rebase

    assert rebase._plain_version("v0.35.0") == rebase._plain_version("0.35.0")


@pytest.mark.parametrize(
    "target, said",
    [
        ("pr", "make pr needs PATCH=n: the patch's number in patches/<base>/series"),
        ("rebase", "make rebase needs TO=<release>: the upstream release to move to"),
    ],
)
def test_a_missing_patch_or_to_is_one_line(target, said):
    made = subprocess.run(
        ["make", "-n", "-C", str(ROOT), target], capture_output=True, text=True
    )
    assert made.returncode == 2
    assert said in made.stderr and "usage:" not in made.stderr


def test_make_names_a_target_it_does_not_have():
    made = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "fix", "BASE=v0.33.0"],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 2
    assert "no target fix in this Makefile: `make help` lists them" in made.stderr


@pytest.mark.parametrize("value", ["maybe", "2", "on please"])
def test_make_refuses_a_switch_that_is_neither_on_nor_off(value):
    made = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "verify", f"FRESH={value}"],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 2
    assert f"FRESH={value}: a switch is on (1 yes" in made.stderr
    assert "--fresh" not in made.stdout


def test_make_help_lists_the_users_commands_first():
    made = subprocess.run(["make", "-C", str(ROOT), "-s", "help"], capture_output=True, text=True)
    listed = [line.split()[1] for line in made.stdout.splitlines() if line.startswith("  make ")]
    users = ["fixes", "status", "wheel", "pr", "apply"]
    assert listed[: len(users)] == users and len(listed) == len(set(listed)) > 15
    assert made.stdout.index("pip install -e .") < made.stdout.index("make fixes")


def test_make_help_fits_80_columns():
    made = subprocess.run(["make", "-C", str(ROOT), "-s", "help"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    lines = made.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    assert any(line.startswith("  make fixes ") for line in lines)
