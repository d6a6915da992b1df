import subprocess
import sys

from forktools.queue import materialize
from forktools.proof import readonly, runner, verify

from forktools.tests.conftest import git

READ_ONLY = "def test_read_only_cache(tmp_path):\n    pass\n\n\ndef test_other():\n    pass\n"


def test_read_only_tests_are_those_of_the_queue(project):
    materialize.ensure(project.base)
    (project.tree / "tests" / "test_core.py").write_text(
        "def test_read_only_upstream():\n    pass\n"
    )
    git(project.tree, "add", "tests/test_core.py")
    project.commit("tests/test_cache.py", READ_ONLY, "[Bugfix] Cache read-only")

    # test_core.py is the release's own file, changed by the queue.
    assert readonly.read_only_tests(project.tree) == [
        "tests/test_cache.py::test_read_only_cache",
        "tests/test_core.py::test_read_only_upstream",
    ]


def test_a_skipped_case_or_a_test_not_run_is_named():
    nodeids = ["a.py::test_read_only_x", "a.py::test_read_only_y"]
    skip = "a.py::test_read_only_x[split]: skipped: cannot mount read-only"
    outcome = runner.Outcome(
        calls={
            "a.py::test_read_only_x[mega]": "passed",
            "a.py::test_read_only_x[split]": "skipped",
        },
        errors=[skip],
    )

    assert readonly.problems(nodeids, outcome) == [
        "a.py::test_read_only_x[split]: skipped",
        "a.py::test_read_only_y: did not run",
        skip,
    ]
    passed = runner.Outcome(calls={f"{nodeids[0]}[mega]": "passed"})
    assert readonly.problems(nodeids[:1], passed) == []


def test_the_stand_in_python_cannot_write_past_file_modes(tmp_path):
    read_only = tmp_path / "read-only"
    read_only.mkdir(mode=0o555)
    python = readonly._python_without_capabilities(
        sys.executable, tmp_path
    )

    proc = subprocess.run(
        [python, "-c", f"open({str(read_only / 'file')!r}, 'w')"],
        capture_output=True,
        text=True,
    )

    assert "PermissionError" in proc.stderr
    assert not (read_only / "file").exists()


def test_a_passing_run_is_kept_and_reused_while_its_key_holds(
    project, monkeypatch, capsys
):
    materialize.ensure(project.base)
    project.commit("tests/test_cache.py", READ_ONLY, "[Bugfix] Cache read-only")
    runs = []

    def run_tests(python, tree, nodeids, engine=None, label="", harness=None):
        runs.append(nodeids)
        return runner.Outcome({n: "passed" for n in nodeids}, {}, [])

    monkeypatch.setattr(runner, "run_tests", run_tests)
    monkeypatch.setattr(readonly.venv, "ensure", lambda base: sys.executable)
    monkeypatch.setattr(readonly.venv, "environments", lambda base: {"test": ["a==1"]})
    monkeypatch.setattr(readonly.shutil, "which", lambda name: "/usr/bin/setpriv")
    monkeypatch.setattr(readonly, "_in_turn", lambda base, turn, slots: False)
    base = project.base
    assert readonly.main([base]) == 0 and len(runs) == 1
    record = readonly.recorded(base)
    assert record["calls"] == {"tests/test_cache.py::test_read_only_cache": "passed"}

    capsys.readouterr()
    assert readonly.main([base]) == 0 and len(runs) == 1
    assert f"reused (key {record['key'][:12]}, " in capsys.readouterr().out
    assert readonly.main([base], fresh=True) == 0 and len(runs) == 2

    monkeypatch.setattr(readonly.venv, "environments", lambda base: {"test": ["a==2"]})
    assert readonly.main([base]) == 0 and len(runs) == 3

    (base.patch_dir / readonly.RECORD).write_text("{ torn")
    assert readonly.main([base]) == 0 and len(runs) == 4
    assert readonly.recorded(base)["key"] != record["key"]


def test_a_record_is_audited_in_its_turn_of_the_rotation_in_a_clean_checkout(
    project, monkeypatch, capsys
):
    materialize.ensure(project.base)
    project.commit("tests/test_cache.py", READ_ONLY, "[Bugfix] Cache read-only")
    (project.tree / "tests" / "stray.py").write_text("left behind by a test run\n")
    seen = []

    def run_tests(python, tree, nodeids, engine=None, label="", harness=None):
        seen.append((tree, (tree / "tests" / "stray.py").exists()))
        return runner.Outcome({n: "passed" for n in nodeids}, {}, [])

    monkeypatch.setattr(runner, "run_tests", run_tests)
    monkeypatch.setattr(readonly.venv, "ensure", lambda base: sys.executable)
    monkeypatch.setattr(readonly.venv, "environments", lambda base: {"test": ["a==1"]})
    monkeypatch.setattr(readonly.shutil, "which", lambda name: "/usr/bin/setpriv")
    monkeypatch.setattr(readonly.verify, "slot_count", lambda *sized: 4)
    base = project.base
    assert readonly.main([base], seed=0) == 0
    [(tree, stray)] = seen
    assert tree != project.tree and not stray  # a checkout, not the live tree
    assert readonly.recorded(base)["seconds"] >= 0
    slot = verify.slot_of(f"{base.name}/read-only", 4)
    turns = {turn: verify.turn_slot(turn, 4) == slot for turn in range(100, 104)}
    capsys.readouterr()
    for turn, audited in turns.items():
        assert readonly.main([base], seed=turn) == 0
        said = capsys.readouterr().out
        assert ("auditing its record" in said) == audited
        assert ("reused (key" in said) == (not audited)
    assert len(seen) == 1 + sum(turns.values()) == 2
