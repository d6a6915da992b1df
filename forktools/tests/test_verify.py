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
