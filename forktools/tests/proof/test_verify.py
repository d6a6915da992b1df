import json
import random
import re
import shutil
import sys
from pathlib import Path

import pytest

from forktools.queue import check, commits, download, export, materialize
from forktools.environments import venv
from forktools.proof import ledger, machine, runner, symptoms, verify
from forktools.proof import machine as machines
from forktools.queue.pins import ForkError
from forktools.proof.runner import Outcome
from forktools.proof.symptoms import Declared, Symptom

from forktools.tests.conftest import git, open_project

LAYER_3 = "def test_layer_3():\n    from vllm import core\n\n    assert core.layer_3() == 33\n"
LAYER_5 = "def test_layer_5():\n    from vllm import core\n\n    assert core.layer_5() == 55\n"
AGAIN = "def test_layer_3_again():\n    from vllm import core\n\n    assert core.layer_3() != 3\n"


def _outcome(calls: dict[str, str], kind: str = "AssertionError") -> Outcome:
    failures = {n: f"{kind}: assert 3 == 33" for n, o in calls.items() if o == "failed"}
    return Outcome(calls, failures, [])


def _declared(**symptoms: Symptom) -> Declared:
    return Declared("patches/v9/symptoms.toml", symptoms)


THREE = Symptom("AssertionError", r"assert 3 == 33")
SPARED = Symptom(no_regression="pristine has nothing to get wrong here")


def test_judge_accepts_declared_assertion_failures_and_no_regression_tests():
    with_fix = _outcome({"a": "passed", "b": "passed"})
    without = _outcome({"a": "failed", "b": "passed"})
    assert verify._judge(with_fix, without, _declared(a=THREE, b=SPARED)) == ""
    assert symptoms.summary(without, _declared(a=THREE, b=SPARED)) == (
        "1 matched, 1 no-regression"
    )


def test_judge_names_each_test_its_declarations_do_not_cover():
    with_fix = _outcome({"a": "passed", "b": "passed"})
    problem = verify._judge(with_fix, _outcome({"a": "failed", "b": "passed"}))
    assert "a failed (AssertionError: assert 3 == 33): no symptom in symptoms.toml" in (
        problem
    )
    assert "b passes without the fix: make it fail there, or say why" in problem
    both = _outcome({"a": "failed", "b": "failed"})
    problem = verify._judge(with_fix, both, _declared(a=THREE, b=SPARED))
    assert problem == (
        "without the fix: b is declared no-regression in patches/v9/symptoms.toml "
        "but fails (AssertionError: assert 3 == 33)"
    )


def test_judge_rejects_import_errors_without_fix():
    problem = verify._judge(
        _outcome({"a": "passed"}), _outcome({"a": "failed"}, "ImportError"), _declared(a=THREE)
    )
    assert problem == (
        "without the fix: a failed with ImportError: assert 3 == 33, not its "
        "declared symptom AssertionError matching 'assert 3 == 33'"
    )


def test_judge_takes_a_declared_symptom_and_no_other_crash():
    with_fix = _outcome({"t.py::test_a[x]": "passed"})
    without = Outcome(
        {"t.py::test_a[x]": "failed"},
        {"t.py::test_a[x]": "OSError: [Errno 28] No space left on device: '/c/i.py'"},
        [],
    )
    full = _declared(**{"t.py::test_a": Symptom("OSError", r"No space .*i\.py")})
    assert verify._judge(with_fix, without, full) == ""
    other = _declared(**{"t.py::test_a": Symptom("OSError", "Read-only")})
    assert "not its declared symptom OSError matching 'Read-only'" in verify._judge(
        with_fix, without, other
    )


def test_a_case_declared_on_its_own_wins_over_its_function():
    without = Outcome(
        {"t.py::test_a[x]": "failed", "t.py::test_a[y]": "failed"},
        {
            "t.py::test_a[x]": "OSError: [Errno 20] Not a directory: '/c'",
            "t.py::test_a[y]": "OSError: [Errno 17] File exists: '/c'",
        },
        [],
    )
    function = Symptom("OSError", r"Errno 20\] Not a directory")
    declared = _declared(**{"t.py::test_a": function})
    assert symptoms.problems(without, declared) == [
        "t.py::test_a[y] failed with OSError: [Errno 17] File exists: '/c', not its "
        "declared symptom OSError matching 'Errno 20\\\\] Not a directory'"
    ]
    y = Symptom("OSError", r"Errno 17\] File exists")
    declared = _declared(**{"t.py::test_a": function, "t.py::test_a[y]": y})
    assert symptoms.problems(without, declared) == []


def test_a_case_that_passes_while_its_siblings_fail_says_why():
    without = Outcome(
        {"t.py::test_a[x]": "failed", "t.py::test_a[y]": "passed"},
        {"t.py::test_a[x]": "AssertionError: assert 3 == 33"},
        [],
    )
    declared = _declared(**{"t.py::test_a": THREE})
    [problem] = symptoms.problems(without, declared)
    assert problem.startswith(
        "t.py::test_a[y] passes without the fix while other cases of it fail: "
        'declare ["t.py::test_a[y]"] no_regression in patches/v9/symptoms.toml'
    )
    spared = _declared(**{"t.py::test_a": THREE, "t.py::test_a[y]": SPARED})
    assert symptoms.problems(without, spared) == []


def test_judge_rejects_tests_that_do_not_bite():
    assert "do not bite" in verify._judge(_outcome({"a": "passed"}), _outcome({"a": "passed"}))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('["t.py::test_a"]\nexception = "OSError"\n', "has exception; declare"),
        ('["t.py::test_a"]\nexeption = "OSError"\nmessage = "x"\n', "exeption"),
        ('["t.py::test_a"]\nexception = "E"\nmessage = "("\n', "not a regular"),
        ('["t.py::test_a"\n', "patches/v9.9.9/symptoms.toml: "),
    ],
    ids=["no message", "misspelt", "bad pattern", "not TOML"],
)
def test_a_wrong_declaration_names_the_file_and_the_test(project, text, says):
    project.base.patch_dir.mkdir(parents=True, exist_ok=True)
    (project.base.patch_dir / "symptoms.toml").write_text(text)
    with pytest.raises(ForkError, match=re.escape(says)):
        symptoms.load(project.base)


def test_judge_rejects_collection_errors_skips_and_failures_with_the_fix():
    errored = Outcome({}, {}, ["x error in collect"])
    assert verify._judge(_outcome({"a": "passed"}), errored)
    skipped = Outcome({"a": "skipped"}, {}, ["a skipped"])
    assert verify._judge(skipped, _outcome({"a": "failed"}))
    problem = verify._judge(_outcome({"a": "failed"}), _outcome({"a": "failed"}))
    assert "with the fix: 1 failed: a: AssertionError: assert 3 == 33" in problem


def test_summarize_keeps_each_failure_and_phase_error():
    records = [
        {"nodeid": "a", "when": "setup", "outcome": "passed", "exception": None},
        {"nodeid": "a", "when": "call", "outcome": "failed",
         "exception": "AssertionError", "message": "assert 1 == 2"},
        {"nodeid": "b", "when": "setup", "outcome": "failed", "exception": "KeyError"},
    ]
    outcome = runner.summarize(records)
    assert (outcome.passed, outcome.failed) == (0, 1)
    assert outcome.failures == {"a": "AssertionError: assert 1 == 2"}
    assert outcome.failure_types == {"AssertionError"}
    assert outcome.errors == ["b failed in setup (KeyError)"]


def test_test_runs_see_a_fixed_environment(monkeypatch):
    unseen = {
        "VLLM_USE_AOT_COMPILE": "0",
        "TORCHINDUCTOR_CACHE_DIR": "/elsewhere",
        "VLLM_FORK_ENGINE_PYTHON": "/stale",
        "PYTEST_ADDOPTS": "-x",
        "CXX": "clang++",
        "OMP_NUM_THREADS": "1",
        "LD_PRELOAD": "/lib/evil.so",
        "MASTER_PORT": "29500",
    }
    seen = {"LANG": "C.UTF-8", "HTTPS_PROXY": "http://proxy:3128", "no_proxy": "x"}
    for name, value in {**unseen, **seen}.items():
        monkeypatch.setenv(name, value)
    kept = runner.caller_environment()
    assert seen.items() <= kept.items()
    assert not unseen.keys() & kept.keys()


UPSTREAM_TESTS = """\
import pytest


def helper():
    return 1


def test_upstream():
    assert helper() == 1


def test_untouched():
    assert True
"""


def test_the_test_finder_sees_methods_async_tests_and_changed_upstream_tests(tmp_path):
    tree = tmp_path / "tree"
    (tree / "tests").mkdir(parents=True)
    module = tree / "tests" / "test_x.py"
    module.write_text(UPSTREAM_TESTS)
    (tree / "tests" / "helpers.py").write_text("def test_not_a_test():\n    pass\n")
    git(tree, "init", "-q")
    git(tree, "add", ".")
    git(tree, "commit", "-qm", "upstream")
    module.write_text(
        UPSTREAM_TESTS.replace("helper() == 1", "helper() == 1, 'changed'")
        + "\n\n@pytest.mark.asyncio\nasync def test_async():\n    assert True\n"
        + "\n\nclass TestCache:\n    def test_method(self):\n        assert True\n\n"
        + "    def helper(self):\n        pass\n"
    )
    (tree / "tests" / "helpers.py").write_text("def test_not_a_test():\n    pass  # x\n")
    git(tree, "commit", "-qam", "fix")
    assert commits.added_tests(tree, "HEAD") == [
        "tests/test_x.py::test_upstream",
        "tests/test_x.py::test_async",
        "tests/test_x.py::TestCache::test_method",
    ]


def test_variant_is_the_first_parametrization_id():
    assert runner.variant_of("t.py::test_a[mega-empty]") == "mega"
    assert runner.variant_of("t.py::test_a[split]") == "split"
    assert runner.variant_of("t.py::test_a") == ""


def test_shared_variants_are_those_of_several_test_functions():
    nodeids = [
        "t.py::test_a[mega-empty]",
        "t.py::test_a[mega-random]",
        "t.py::test_b[mega]",
        "t.py::test_a[split-empty]",
        "t.py::test_c[only_here]",
        "t.py::test_d",
    ]
    assert verify.shared_variants(nodeids) == ["mega"]


def test_judge_names_a_variant_that_does_not_bite():
    calls = {
        "t.py::test_a[mega]": "passed",
        "t.py::test_b[mega]": "passed",
        "t.py::test_a[split]": "passed",
        "t.py::test_b[split]": "passed",
    }
    declared = _declared(**{"t.py::test_a": THREE, "t.py::test_b": THREE})
    with_fix = _outcome(calls)
    without = _outcome(
        {**calls, "t.py::test_a[mega]": "failed", "t.py::test_b[mega]": "failed"}
    )
    assert "[split]" in verify._judge(with_fix, without, declared)
    without = _outcome({**without.calls, "t.py::test_b[split]": "failed"})
    assert "t.py::test_a[split] passes without the fix while other cases" in (
        verify._judge(with_fix, without, declared)
    )
    spared = _declared(**declared.symptoms, **{"t.py::test_a[split]": SPARED})
    assert verify._judge(with_fix, without, spared) == ""
    lines = verify._variant_lines(
        verify.Row("b", "p", 2, with_fix, without, nodeids=["t.py::test_a"])
    )
    assert [line[1:5] for line in lines] == [
        ("  [mega]", "", "2/2 passed", "2/2 failed"),
        ("  [split]", "", "2/2 passed", "1/2 failed"),
    ]


# The ledger, end to end on a miniature release: two fixes and a test-only
# patch whose without-fix diff puts the first bug back.


SYMPTOMS = """\
["tests/test_layer_3.py::test_layer_3"]
exception = "AssertionError"
message = "assert 3 == 33"

["tests/test_layer_5.py::test_layer_5"]
exception = "AssertionError"
message = "assert 5 == 55"

["tests/test_layer_3_again.py::test_layer_3_again"]
exception = "AssertionError"
message = "assert 3 != 3"
"""


def _fix(project, layer: int, test: str) -> None:
    core = (project.tree / "vllm/core.py").read_text()
    core = core.replace(f"return {layer}\n", f"return {layer}{layer}\n")
    (project.tree / f"tests/test_layer_{layer}.py").write_text(test)
    (project.tree / "vllm/core.py").write_text(core)
    _commit_all(project, f"[Bugfix] Layer {layer} returns {layer}{layer}")


def _commit_all(project, message: str) -> None:
    git(project.tree, "add", "-A")
    git(project.tree, "commit", "-q", "-s", "-m", f"{message}\n\nUpstream-Status: Pending [x]")


@pytest.fixture(scope="module")
def proved(tmp_path_factory) -> tuple[Path, list[str]]:
    """The miniature project with its queue of three, proved once for the
    module (each test works on a copy); its test runs use this Python."""
    path = tmp_path_factory.mktemp("proved")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(venv, "ensure", lambda base: Path(sys.executable))
        monkeypatch.setattr(venv, "ensure_engine", lambda base: None)
        project = open_project(path, monkeypatch)
        materialize.ensure(project.base)
        _fix(project, 3, LAYER_3)
        _fix(project, 5, LAYER_5)
        (project.tree / "tests/test_layer_3_again.py").write_text(AGAIN)
        _commit_all(project, "[Test] Layer 3 again")
        names = export.export(project.base)
        diff = project.base.patch_dir / "verify" / f"{names[2]}.without-fix.diff"
        diff.parent.mkdir()
        diff.write_text(
            "--- a/vllm/core.py\n+++ b/vllm/core.py\n@@ -10,3 +10,3 @@ def layer_2():\n"
            " def layer_3():\n-    return 33\n+    return 3\n \n"
        )
        (project.base.patch_dir / "symptoms.toml").write_text(SYMPTOMS)
        assert verify.main([project.base], 2, audit=0) == 0
    return path, names


@pytest.fixture
def project(proved, tmp_path, monkeypatch):
    """A copy of the proved project, in this test's own directory."""
    shutil.copytree(proved[0], tmp_path, symlinks=True, dirs_exist_ok=True)
    monkeypatch.setattr(venv, "ensure", lambda base: Path(sys.executable))
    monkeypatch.setattr(venv, "ensure_engine", lambda base: None)
    return open_project(tmp_path, monkeypatch, publish=False)


@pytest.fixture
def queue(proved) -> list[str]:
    return proved[1]


def _plan(project) -> dict[str, str]:
    run = verify.prepare(project.base, fresh=False)
    return {p.subject.entry.name[:4]: p.why for p in run.rows()}


def test_a_first_verify_proves_every_row_and_a_second_reuses_them(
    project, queue, capsys
):
    data = json.loads(ledger.path(project.base).read_text())
    rows = {row["patch"]: row for row in data["rows"]}
    assert list(rows) == queue
    for row in rows.values():
        assert len(row["inputs"]["tree_with_fix"]) == 40
        assert len(row["inputs"]["tree_without_fix"]) == 40
        assert list(row["without_fix"]["calls"].values()).count("failed") == 1
        assert row["machine"] == machines.fingerprint()
        assert set(row["with_fix"]["seconds"]) == set(row["with_fix"]["calls"])
    assert rows[queue[0]]["without_fix"]["failures"] == {
        "tests/test_layer_3.py::test_layer_3": "AssertionError: assert 3 == 33\n"
        " +  where 3 = <function layer_3 at "
        + rows[queue[0]]["without_fix"]["failures"][
            "tests/test_layer_3.py::test_layer_3"
        ].split(" at ", 1)[1]
    }
    capsys.readouterr()
    assert verify.main([project.base], 2, audit=0) == 0
    out = capsys.readouterr().out
    assert out.count("reused (key ") == 3 and "proved in" not in out
    assert "  puts back: vllm/core.py" in out
    assert verify.stale(project.base) == []


def test_verify_prints_its_plan_before_it_builds_an_environment(
    project, queue, monkeypatch, capsys
):
    said_before_build = []

    def ensure(base):
        said_before_build.append(capsys.readouterr().err)
        return Path(sys.executable)

    monkeypatch.setattr(venv, "ensure", ensure)
    monkeypatch.setattr(venv, "missing", lambda base: ["test"])
    data = json.loads(ledger.path(project.base).read_text())
    data["rows"] = data["rows"][1:]  # the first row is proved again
    ledger.path(project.base).write_text(json.dumps(data))
    capsys.readouterr()
    verify.main([project.base], 2, audit=1, seed=0)
    [err] = said_before_build
    plan = err[err.index("verify: plan\n") :].splitlines()
    assert re.fullmatch(
        r"  v9\.9\.9: 3 rows: 1 to prove, 2 reused, 1 of them audited; about \d+ "
        r"min of test runs",
        plan[1],
    ), plan
    assert plan[2].startswith("  about ") and "min on 2 CPU(s)" in plan[2]
    assert plan[3].startswith("  environments to build first: v9.9.9 test; about 10 GB")


def test_each_changed_input_invalidates_exactly_its_rows(
    project, queue, monkeypatch, tmp_path
):
    assert _plan(project) == {"0001": "", "0002": "", "0003": ""}

    diff = project.base.patch_dir / "verify" / f"{queue[2]}.without-fix.diff"
    original = diff.read_text()
    diff.write_text(original.replace("return 3\n", "return 4\n"))
    plan = _plan(project)
    assert plan["0001"] == plan["0002"] == ""
    assert plan["0003"].startswith("changed: the tree without the fix")
    assert [p for p in verify.stale(project.base) if "stale" in p] == [
        f"patches/{project.base.name}/proof.json: {queue[2]} is stale: the tree "
        f"without the fix ({plan['0003'].split('(')[1].split(')')[0]}); run "
        f"`make verify BASE={project.base.name}`"
    ]
    assert verify.stale(project.base, proving=True) == []  # make test proves it
    diff.write_text(original)

    project.lock("test", "x==2 --hash=sha256:" + "0" * 64)
    assert all("locked environments" in why for why in _plan(project).values())
    assert len([p for p in verify.stale(project.base) if "locked environments" in p]) == 3
    project.lock("test", "x==2 --hash=sha256:" + "1" * 64)  # the same version
    assert all("locked environments" in why for why in _plan(project).values())
    project.lock("test")
    assert _plan(project) == {"0001": "", "0002": "", "0003": ""}

    harness = tmp_path / "harness"
    shutil.copytree(runner.HARNESS, harness)
    monkeypatch.setattr(runner, "HARNESS", harness)
    assert _plan(project) == {"0001": "", "0002": "", "0003": ""}
    (harness / "vllm_fork_report.py").write_text("# changed\n", encoding="utf-8")
    assert all("forktools/engine/harness/" in why for why in _plan(project).values())
    monkeypatch.setattr(runner, "HARNESS", runner.ROOT / "forktools" / "engine" / "harness")

    keyed = ledger.KEYED_CODE
    monkeypatch.setattr(ledger, "KEYED_CODE", (*keyed, "a changed piece"))
    assert all("code that shapes a run" in why for why in _plan(project).values())
    monkeypatch.setattr(ledger, "KEYED_CODE", keyed)

    _fix(project, 7, LAYER_5.replace("5", "7"))
    export.export(project.base)
    plan = _plan(project)
    assert plan["0004"] == "no row in the ledger"
    assert all("the queue's tree" in plan[n] for n in ("0001", "0002", "0003"))
    assert "0002" not in plan["0001"] and "tests run" not in plan["0001"]


def _edit_row(project, index: int, half: str, nodeid: str) -> dict:
    """Record by hand that ``nodeid`` passed in one half of a ledger row."""
    file = ledger.path(project.base)
    data = json.loads(file.read_text())
    row = data["rows"][index]
    row[half]["calls"][nodeid] = "passed"
    file.write_text(json.dumps(data))
    return row


def test_a_run_stopped_part_way_keeps_the_rows_it_proved(project, queue, monkeypatch):
    before = {p.patch: p.key for p in ledger.load(project.base).proofs.values()}
    run_tests = runner.run_tests

    def stopped_in_the_third_row(python, tree, nodeids, engine=None, label=""):
        if "0003 without" in label:
            raise KeyboardInterrupt("out of time")
        return run_tests(python, tree, nodeids, engine, label)

    monkeypatch.setattr(runner, "run_tests", stopped_in_the_third_row)
    monkeypatch.setattr(ledger, "coarse_platform", lambda: "Linux elsewhere")
    with pytest.raises(KeyboardInterrupt):
        verify.main([project.base], 1, audit=0)
    after = ledger.load(project.base)
    assert after.problems == []
    kept = {p.patch: p.inputs.platform for p in after.proofs.values()}
    assert kept[queue[0]] == kept[queue[1]] == "Linux elsewhere"
    # The row stopped part-way keeps its record from before the run.
    assert after.proofs[queue[2]].key == before[queue[2]]


def test_a_row_whose_with_fix_half_fails_is_never_written(
    project, queue, monkeypatch, capsys
):
    before = {p.patch: p.key for p in ledger.load(project.base).proofs.values()}
    run_tests = runner.run_tests

    def failing_with_the_second_fix(python, tree, nodeids, engine=None, label=""):
        outcome = run_tests(python, tree, nodeids, engine, label)
        if "0002 with" in label:
            outcome.calls = dict.fromkeys(outcome.calls, "failed")
        return outcome

    monkeypatch.setattr(runner, "run_tests", failing_with_the_second_fix)
    monkeypatch.setattr(ledger, "coarse_platform", lambda: "Linux elsewhere")
    assert verify.main([project.base], 1, audit=0) == 1
    after = ledger.load(project.base).proofs
    assert after[queue[0]].inputs.platform == "Linux elsewhere"
    assert queue[1] not in after and queue[1] in before  # proved again next run
    assert "0/1 passed" in capsys.readouterr().out


def test_a_hand_edited_row_is_caught_by_the_audit_and_fresh_proves_it_again(
    project, queue, capsys
):
    file = ledger.path(project.base)
    row = _edit_row(project, 1, "without_fix", "tests/test_layer_5.py::test_layer_5")
    capsys.readouterr()
    assert verify.main([project.base], 2, audit=3, seed=0) == 1
    out = capsys.readouterr().out
    assert out.count("audited in") == 3
    assert (
        "NO: audit of the row with key "
        f"{row['key'][:12]}: proved again without the fix, "
        "tests/test_layer_5.py::test_layer_5 failed (AssertionError), the ledger "
        "says passed" in out
    )
    kept = json.loads(file.read_text())["rows"][1]  # for a person to look at
    assert kept["without_fix"]["calls"] == row["without_fix"]["calls"]

    assert verify.main([project.base], 2, fresh=True, audit=3) == 0
    out = capsys.readouterr().out
    assert out.count("proved in") == 3 and "reused" not in out
    calls = json.loads(file.read_text())["rows"][1]["without_fix"]["calls"]
    assert list(calls.values()).count("failed") == 1


def test_reused_rows_run_no_test_and_keep_their_recorded_halves(project, queue, capsys):
    capsys.readouterr()
    assert verify.main([project.base], 2, audit_minutes=0) == 0
    captured = capsys.readouterr()
    assert " with: the whole queue" not in captured.err
    assert "verify: auditing no row, within 0 min" in captured.err
    assert captured.out.count("reused (key ") == 3
    assert captured.out.count("1/1 passed") == 3


def test_a_hand_edited_with_fix_record_is_caught_by_an_audit_that_picks_it(
    project, queue, capsys
):
    row = _edit_row(project, 0, "with_fix", "tests/test_layer_3.py::test_layer_3_gone")
    capsys.readouterr()
    assert verify.main([project.base], 2, audit_minutes=0) == 0  # not picked
    assert verify.main([project.base], 2, audit=3, seed=0) == 1
    out = capsys.readouterr().out
    assert (
        f"NO: audit of the row with key {row['key'][:12]}: proved again with the "
        "fix, tests/test_layer_3.py::test_layer_3_gone not run, the ledger says "
        "passed" in out
    )


def test_an_audit_judges_fresh_failures_against_the_declared_symptoms(
    project, queue, capsys
):
    file = ledger.path(project.base)
    data = json.loads(file.read_text())
    failures = data["rows"][1]["without_fix"]["failures"]
    [nodeid] = failures
    failures[nodeid] = "AssertionError: assert 5 == 7"
    file.write_text(json.dumps(data))
    declared = project.base.patch_dir / "symptoms.toml"
    declared.write_text(declared.read_text().replace("assert 5 == 55", "assert 5 == 7"))
    capsys.readouterr()
    assert verify.main([project.base], 2, audit_minutes=0) == 0  # the record holds
    assert verify.main([project.base], 2, audit=3, seed=0) == 1
    out = capsys.readouterr().out
    assert (
        "proved again without the fix, tests/test_layer_5.py::test_layer_5 failed "
        "with AssertionError: assert 5 == 55, not its declared symptom "
        "AssertionError matching 'assert 5 == 7'" in out
    )


def _row(
    seconds: float, why: str = "", machine: dict | None = None, name: str = "0001"
) -> verify.Planned:
    here = machine if machine is not None else machines.fingerprint()
    fields = {"seconds": seconds, "with_fix_seconds": seconds, "machine": here}
    recorded = type("Recorded", (), fields)()
    entry = type("Entry", (), {"name": f"{name}-fix.patch"})()
    subject = type("Subject", (), {"tests": ["t"], "entry": entry})()
    return verify.Planned(subject, None, recorded, why)


def _run(rows: list, base: str = "v9.9.9"):
    named = type("Base", (), {"name": base})()
    return type("Run", (), {"rows": lambda self: rows, "base": named})()


def _slot(planned, half: str, slots: int, base: str = "v9.9.9") -> int:
    return verify.slot_of(f"{base}/{planned.subject.entry.name} {half}", slots)


def _in_slot(rows: list, slots: int, number: int) -> list:
    """The rows with a half in slot ``number``."""
    return [
        row for row in rows if any(_slot(row, h, slots) == number for h in verify.HALVES)
    ]


def test_turns_audit_slots_that_nest_so_any_n_consecutive_turns_cover_every_slot():
    for slots in (1, 2, 4, 8, 16):
        for start in (0, 5, 1000):
            window = range(start, start + slots)
            assert sorted(verify.turn_slot(t, slots) for t in window) == list(
                range(slots)
            )
            # A turn's slot lies in its slot of every coarser rotation.
            for turn in window:
                assert verify.turn_slot(turn, slots) // 2 == verify.turn_slot(
                    turn, max(1, slots // 2)
                )


def test_the_slots_are_the_fewest_whose_share_of_every_row_fits_the_budget():
    assert verify.audit_slots(0, 600) == 1
    assert verify.audit_slots(600, 600) == 1
    assert verify.audit_slots(601, 600) == 2
    assert verify.audit_slots(5131, 1200) == 8


def test_the_slots_grow_until_a_cluster_of_costly_halves_fits_but_no_further():
    rows = [_row(100, name=f"{n:04d}") for n in range(8)]
    share = verify.audit_slots(sum(200 for _ in rows), 600)
    assert verify._slots([_run(rows)], 600) == share  # 1,600 test-seconds
    clustered = [*rows, _row(1000, name="0100")]  # both halves over budget
    assert verify._slots([_run(clustered)], 600) == (
        verify.audit_slots(3600, 600) * verify.SLOTS_OVER_SHARE
    )


def test_any_n_consecutive_commits_audit_every_half_while_the_rows_change():
    """The rows reused, their seconds, the run's own proofs and so the
    number of slots change from run to run; each half of a row that stays
    is audited at least once in any 64 consecutive turns (64: the most
    slots these rows ever need), in a full run of its slot whatever the run
    proves besides."""
    rng = random.Random(45)
    budget_minutes, workers = 10, 2  # 1,200 test-seconds a run
    for trial in range(100):
        start = rng.randrange(10_000)
        audited_at = {half: [] for half in verify.HALVES}
        for turn in range(start, start + 64):
            watched = _row(rng.uniform(0, 300), name=f"{trial:04d}-watched")
            others = [
                _row(rng.uniform(0, 300), why=rng.choice(["", "", "changed"]), name=f"{n:04d}")
                for n in rng.sample(range(60), rng.randrange(40))
            ]
            rows = [watched, *others]
            rng.shuffle(rows)
            picked, number, slots = verify.pick_rotation(
                [_run(rows)], budget_minutes, workers, turn
            )
            assert slots <= 64
            for half in watched.audited:
                audited_at[half].append(turn)
                assert _slot(watched, half, slots) == number
        for half, turns in audited_at.items():
            assert turns, f"trial {trial}: the watched row's {half} half is never audited"


def test_a_run_whose_own_proofs_spend_the_budget_still_audits_its_slot():
    rows = [_row(100, name=f"{n:04d}") for n in range(8)]
    proving = [_row(1000, why="changed: the queue's tree", name="0100")]
    picked, number, slots = verify.pick_rotation([_run(rows + proving)], 10, 1, 0)
    assert slots == 8  # 3,600 test-seconds in slots of 600
    assert picked == _in_slot(rows, slots, number)
    assert all(_slot(row, h, slots) == number for row in picked for h in row.audited)
    instant = [_row(0), _row(0, name="0002")]  # rows too quick to count a second
    assert verify.pick_rotation([_run(instant)], 0, 2, 0)[0] == []
    assert verify.pick_rotation([_run(instant)], 1, 2, 0)[0] == instant


def another_kind_of_machine() -> dict:
    """This machine with avx512f toggled: another kind, whatever this is."""
    here = machines.fingerprint()
    return {**here, "cpu_flags": sorted(set(here["cpu_flags"]) ^ {"avx512f"})}


def test_rows_proved_on_another_kind_of_machine_are_audited_first():
    elsewhere = another_kind_of_machine()
    rows = [
        _row(50, name=f"{n:04d}", machine=elsewhere if n % 2 else None)
        for n in range(12)
    ]
    # 1,200 test-seconds in slots of a 600 budget, halves of 50.
    picked, number, slots = verify.pick_rotation([_run(rows)], 10, 1, 0)
    slot = _in_slot(rows, slots, number)
    mine = [row for row in slot if row.recorded.machine != elsewhere]
    assert picked[: len(slot)] == [row for row in slot if row not in mine] + mine
    # What the slot leaves of the budget goes to other halves of rows from
    # elsewhere, never to halves of rows proved here.
    halves = [(row, h) for row in rows for h in verify.HALVES]
    in_slot = sum(_slot(row, h, slots) == number for row, h in halves)
    others = sum(
        _slot(row, h, slots) != number
        for row, h in halves
        if row.recorded.machine == elsewhere
    )
    audited = sum(len(row.audited) for row in picked)
    assert audited - in_slot == min((600 - 50 * in_slot) // 50, others)
    assert all(
        _slot(row, h, slots) == number or row.recorded.machine == elsewhere
        for row in picked
        for h in row.audited
    )


def test_an_edited_with_fix_record_is_caught_within_n_commits_while_rows_change(
    project, queue, capsys
):
    """A with-fix outcome edited by hand is caught by the run of the one turn,
    among any N consecutive ones (N: the rotation's slots), whose slot holds
    its with-fix half, while another row is made stale (proved, not reused)
    part-way."""
    row = _edit_row(project, 0, "with_fix", "tests/test_layer_3.py::test_layer_3_gone")
    name = f"{project.base.name}/{queue[0]}"
    minutes = 200 / 120  # 200 test-seconds on 2 CPUs; 100 a half

    def even_seconds(stale: bool = False) -> None:
        file = ledger.path(project.base)
        data = json.loads(file.read_text())
        for each in data["rows"]:
            each["seconds"] = each["with_fix_seconds"] = 100
        if stale:
            data["rows"][2]["inputs"]["tree_without_fix"] = "0" * 40
        file.write_text(json.dumps(data))

    even_seconds()
    window = len(verify.rotation([project.base], minutes, 2))
    caught, holding = [], []
    for turn in range(100, 100 + window):
        even_seconds(stale=turn == 101)
        capsys.readouterr()
        verify.main([project.base], 2, seed=turn, audit_minutes=minutes)
        captured = capsys.readouterr()
        slot = re.search(r"rotation slot (\d+) of (\d+) \(turn", captured.err)
        number, slots = int(slot[1]) - 1, int(slot[2])
        assert slots <= window
        if f"NO: audit of the row with key {row['key'][:12]}" in captured.out:
            caught.append(turn)
        if verify.slot_of(f"{name} with", slots) == number:
            holding.append(turn)
    assert caught == holding
    assert len(caught) == 1


def test_a_shallow_clone_is_deepened_for_the_turn(tmp_path, monkeypatch, capsys):
    origin = tmp_path / "origin"
    origin.mkdir()
    git(origin, "init", "-q")
    for n in range(3):
        git(origin, "commit", "-q", "--allow-empty", "-m", f"commit {n}")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{origin}", str(clone))
    monkeypatch.setattr(verify.pins, "ROOT", clone)
    assert verify.commit_count() == 3
    assert "this clone is shallow; fetching its history" in capsys.readouterr().err
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{origin}", "gone")
    shutil.rmtree(origin)
    monkeypatch.setattr(verify.pins, "ROOT", tmp_path / "gone")
    with pytest.raises(ForkError, match="shallow and `git fetch --unshallow` failed") as e:
        verify.commit_count()
    assert "\n" not in str(e.value) and "AUDIT_SEED=<turn>" in str(e.value)


def test_the_fingerprint_is_data_and_not_in_the_key(project, queue):
    file = ledger.path(project.base)
    data = json.loads(file.read_text())
    recorded = data["rows"][0]["machine"]
    data["rows"][0]["machine"] = {**recorded, "cpus": recorded["cpus"] + 1}
    file.write_text(json.dumps(data))
    assert _plan(project) == {"0001": "", "0002": "", "0003": ""}
    said = ledger.proved_here(project.base)
    assert said.startswith(
        "v9.9.9: 2 of 3 rows proved on a machine like this; the others differ in "
        "the CPU count (how many compiles and workers run side by side). "
        "A machine is data, not key: each `make verify` audits such rows here first"
    )


AVX512 = ["avx2", "avx512bw", "avx512f"]


@pytest.mark.parametrize(
    ("flags", "like_this"),
    [(["avx2"], 0), (AVX512, 3), (["amx_tile", *AVX512], 0)],
    ids=["avx2-only", "avx512", "amx"],
)
def test_rows_proved_on_avx512_read_on_each_kind_of_machine(
    project, queue, monkeypatch, flags, like_this
):
    monkeypatch.delenv(machines.FORCED, raising=False)  # this machine as it is
    proved_on = {**machine.fingerprint(), "cpu_flags": AVX512, "uid": 0}
    file = ledger.path(project.base)
    data = json.loads(file.read_text())
    for row in data["rows"]:
        row["machine"] = proved_on
    file.write_text(json.dumps(data))
    monkeypatch.setenv(machines.FORCED, json.dumps({"cpu_flags": flags, "uid": 0}))
    assert machines.fingerprint() == {**proved_on, "cpu_flags": flags}
    said = ledger.proved_here(project.base)
    assert said.startswith(f"v9.9.9: {like_this} of 3 rows proved on a machine like this")
    assert ("differ in the CPU flags (which vector kernels" in said) == (like_this == 0)


@pytest.mark.parametrize("value", ["{cpu_flags", "[]", '{"gpus": 8}'])
def test_a_forced_machine_that_is_not_an_object_of_its_fields_is_refused(
    monkeypatch, value
):
    monkeypatch.setenv(machines.FORCED, value)
    with pytest.raises(ForkError, match="VLLM_FORK_MACHINE"):
        machines.fingerprint()


def test_renaming_an_input_field_keeps_every_key(project, queue):
    row = next(iter(ledger.load(project.base).proofs.values()))
    renamed = {f"renamed_{name}": value for name, value in vars(row.inputs).items()}
    assert ledger.digest(renamed.values()) == row.key


def test_the_platform_is_in_the_key(project, queue, monkeypatch):
    monkeypatch.setattr(ledger, "coarse_platform", lambda: "Linux aarch64")
    assert all(
        why.startswith("changed: the platform") for why in _plan(project).values()
    )


def test_costs_sum_each_test_files_seconds_from_the_ledger(project, queue):
    from forktools.proof import costs

    files = costs.per_file([project.base])
    cost = files[(project.base.name, "tests/test_layer_3.py")]
    proof = ledger.load(project.base).proofs[queue[0]]
    nodeid = "tests/test_layer_3.py::test_layer_3"
    both = proof.with_fix.seconds[nodeid] + proof.without_fix.seconds[nodeid]
    assert cost.cases["test_layer_3"] == pytest.approx(both)
    assert nodeid in proof.with_fix.seconds and nodeid in proof.without_fix.seconds
    shown = costs.table([project.base])
    assert "tests/test_layer_3.py" in shown and "test-seconds" in shown
    [(halves, _)] = verify.rotation([project.base], 10, 1)
    assert halves == [f"v9.9.9 {name[:4]} {h}" for name in queue for h in verify.HALVES]
    assert "1 slots, so any 1 consecutive commits audit both halves of every row" in (
        costs.rotation_table([project.base])
    )


def test_make_check_reports_a_queue_problem_and_the_stale_rows_both(
    project, queue, capsys
):
    from forktools import cli

    declared = project.base.patch_dir / "symptoms.toml"
    gone = '["tests/test_gone.py::test_gone"]\nexception = "E"\nmessage = "m"\n'
    declared.write_text(declared.read_text() + gone)
    project.lock("test", "x==2 --hash=sha256:" + "0" * 64)
    capsys.readouterr()
    assert cli.main(["check", "--base", project.base.name]) == 1
    said = capsys.readouterr().err
    assert "tests/test_gone.py::test_gone" in said
    assert said.count("is stale: the locked environments") == 3


def test_a_row_whose_key_is_not_its_inputs_digest_is_stale(project, queue):
    file = ledger.path(project.base)
    data = json.loads(file.read_text())
    data["rows"][0]["inputs"]["tree_without_fix"] = "0" * 40
    file.write_text(json.dumps(data))
    assert _plan(project)["0001"] == "no row in the ledger"
    # Its seconds still estimate what proving it again costs.
    planned = verify.prepare(project.base, fresh=False).rows()[0]
    assert planned.recorded is None and planned.last is not None
    assert verify._estimate(planned) == planned.last.seconds
    [problem] = [p for p in verify.stale(project.base) if "edited by hand" in p]
    assert queue[0] in problem and "run `make verify" in problem


def test_check_judges_the_recorded_failures_against_the_declarations(
    project, queue, capsys
):
    file = project.base.patch_dir / "symptoms.toml"
    assert symptoms.ledger_problems(project.base) == []
    file.write_text(
        SYMPTOMS.replace('message = "assert 5 == 55"', 'message = "assert 5 == 7"')
        + '\n["tests/test_gone.py::test_gone"]\nno_regression = "x"\n'
    )
    assert symptoms.ledger_problems(project.base) == [
        f"patches/v9.9.9/symptoms.toml: {queue[1]}: "
        "tests/test_layer_5.py::test_layer_5 failed with AssertionError: assert 5 == "
        "55, not its declared symptom AssertionError matching 'assert 5 == 7'",
        "patches/v9.9.9/symptoms.toml: declares tests/test_gone.py::test_gone, "
        "which no patch's tests run; remove it or correct its name",
    ]
    capsys.readouterr()
    assert verify.main([project.base], 2, audit=0) == 1
    out = capsys.readouterr().out
    assert "NO: without the fix: tests/test_layer_5.py::test_layer_5 failed" in out
    assert out.count("reused (key ") == 3 and "proved in" not in out
    assert "  1 matched " in out


def test_the_key_holds_the_code_that_shapes_a_run_and_not_what_only_observes():
    from forktools.proof import checkouts

    keyed = {getattr(code, "__name__", None) for code in ledger.KEYED_CODE}
    assert {"forktools.proof.runner", "wheel_files", "install_command"} <= keyed
    modules = {getattr(code, "__module__", None) for code in ledger.KEYED_CODE}
    assert not {checkouts.__name__, machine.__name__, verify.__name__} & (
        keyed | modules
    )


def test_a_session_gets_a_fresh_home_tmpdir_and_xdg_roots_and_a_fixed_path(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("HOME", "/root")
    monkeypatch.setenv("XDG_CACHE_HOME", "/root/.cache")
    monkeypatch.setenv("PATH", "/opt/somewhere/bin:/usr/bin")
    python = tmp_path / "env" / "bin" / "python"
    env = {**runner.caller_environment(), **runner.session_environment(python, tmp_path)}
    assert env["HOME"] == str(tmp_path / "home") and env["TMPDIR"] == str(
        tmp_path / "tmp"
    )
    assert all(env[name].startswith(str(tmp_path)) for name in runner.XDG_ROOTS)
    assert all(Path(env[name]).is_dir() for name in ("HOME", "TMPDIR", *runner.XDG_ROOTS))
    assert env["PATH"].split(":") == [
        str(runner.COMPILER_SHIM),
        str(python.parent),
        *runner.SYSTEM_PATH,
    ]
    assert Path(env["VLLM_FORK_CXX_CACHE"]).parent == download.cache_dir()


def test_the_harness_key_holds_every_file_of_the_harness_and_its_mode(tmp_path):
    (tmp_path / "bin").mkdir()
    shim = tmp_path / "bin" / "g++"
    shim.write_text("#!/bin/sh\n")
    (tmp_path / "module.py").write_text("VALUE = 1\n")
    before = ledger.content_digest(tmp_path)
    shim.chmod(0o755)
    executable = ledger.content_digest(tmp_path)
    shim.write_text("#!/bin/sh\nexit 1\n")
    assert len({before, executable, ledger.content_digest(tmp_path)}) == 3
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "module.cpython-311.pyc").write_bytes(b"compiled")
    unchanged = ledger.content_digest(tmp_path)
    (tmp_path / "__pycache__" / "module.cpython-311.pyc").write_bytes(b"again")
    assert ledger.content_digest(tmp_path) == unchanged
