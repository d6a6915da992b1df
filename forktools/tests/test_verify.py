import threading
from types import SimpleNamespace

from forktools import verify
from forktools.verify import Outcome


def _outcome(passed=0, failed=0, errors=(), types=()):
    return Outcome(passed, failed, list(errors), set(types))


def test_judge_accepts_assertion_failures_without_fix():
    assert verify._judge(_outcome(passed=2), _outcome(failed=1, passed=1,
                         types={"AssertionError"})) == ""


def test_judge_rejects_import_errors_without_fix():
    problem = verify._judge(_outcome(passed=1), _outcome(failed=1, types={"ImportError"}))
    assert "ImportError" in problem


def test_judge_rejects_tests_that_do_not_bite():
    assert "do not bite" in verify._judge(_outcome(passed=1), _outcome(passed=1))


def test_judge_rejects_collection_errors_and_skips():
    assert verify._judge(_outcome(passed=1), _outcome(errors=["x error in collect"]))
    assert verify._judge(_outcome(errors=["x skipped"]), _outcome(failed=1))


def test_summarize_counts_phases():
    records = [
        {"nodeid": "a", "when": "setup", "outcome": "passed", "exception": None},
        {"nodeid": "a", "when": "call", "outcome": "failed", "exception": "AssertionError"},
        {"nodeid": "b", "when": "setup", "outcome": "failed", "exception": "KeyError"},
    ]
    outcome = verify._summarize(records)
    assert (outcome.passed, outcome.failed) == (0, 1)
    assert outcome.failure_types == {"AssertionError"}
    assert outcome.errors == ["b failed in setup (KeyError)"]


def test_variant_is_the_first_parametrization_id():
    assert verify.variant_of("t.py::test_a[mega-empty]") == "mega"
    assert verify.variant_of("t.py::test_a[split]") == "split"
    assert verify.variant_of("t.py::test_a") == ""


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
    with_fix = _outcome(passed=4)
    with_fix.calls = {
        "t.py::test_a[mega]": "passed",
        "t.py::test_b[mega]": "passed",
        "t.py::test_a[split]": "passed",
        "t.py::test_b[split]": "passed",
    }
    without = _outcome(passed=3, failed=1, types={"AssertionError"})
    without.calls = {**with_fix.calls, "t.py::test_a[mega]": "failed"}
    assert verify._judge(with_fix, without) == ""
    assert "[split]" in verify._judge_variants(with_fix, without)
    without.calls["t.py::test_b[split]"] = "failed"
    assert verify._judge_variants(with_fix, without) == ""
    lines = verify._variant_lines(
        verify.Row("b", "p", 2, with_fix, without, 1.0, nodeids=["t.py::test_a"])
    )
    assert [line[1:5] for line in lines] == [
        ("  [mega]", "", "2/2 passed", "1/2 failed"),
        ("  [split]", "", "2/2 passed", "1/2 failed"),
    ]


def test_bases_are_verified_side_by_side_and_listed_in_order(monkeypatch, capsys):
    # Each base only returns once both are in flight: run one after the
    # other, the first would wait for the second and the barrier break.
    both_running = threading.Barrier(2, timeout=30)
    bases = [SimpleNamespace(name="v2.0.0"), SimpleNamespace(name="v1.0.0")]

    def verify_base(base):
        both_running.wait()
        return [verify.Row(base.name, "0001-fix.patch", 1, None, None, 0.0)]

    monkeypatch.setattr(verify, "verify_base", verify_base)
    monkeypatch.setattr(verify, "_save", lambda base, rows: None)
    monkeypatch.setattr(verify.materialize, "ensure", lambda base: base)
    monkeypatch.setattr(verify.materialize, "refuse_if_unexported", lambda *a: None)
    assert verify.main(bases, jobs=2) == 0
    table = capsys.readouterr().out
    assert table.index("v2.0.0") < table.index("v1.0.0")
