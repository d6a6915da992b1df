"""pytest plugin: write each test phase's outcome and exception as JSON.

``make verify`` needs to tell an assertion failure from an import, fixture or
collection error, and its ledger keeps what each failure said; junit XML does
not record the exception type. It only reads pytest's reports, so it cannot
change an outcome. Each phase's seconds are kept too: where a proof's time
goes, case by case.
"""

import json
import os

import pytest

# A long message keeps its start (what the test says went wrong) and its end:
# a test of a child process quotes the child's output last, and the child's
# exception, the bug's own symptom, ends it.
MESSAGE_HEAD = 600
MESSAGE_TAIL = 1400
_records = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    _records.append(
        {
            "nodeid": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "exception": call.excinfo.typename if call.excinfo else None,
            "message": _message(call.excinfo),
            "seconds": report.duration,
        }
    )


def _message(excinfo) -> str:
    """The exception's message, cut to what a ledger row can carry."""
    if excinfo is None:
        return ""
    text = str(excinfo.value).strip()
    left_out = len(text) - MESSAGE_HEAD - MESSAGE_TAIL
    if left_out <= 0:
        return text
    head, tail = text[:MESSAGE_HEAD], text[-MESSAGE_TAIL:]
    return f"{head}\n[... {left_out} characters ...]\n{tail}"


def pytest_collectreport(report):
    if report.failed:
        _records.append(
            {
                "nodeid": report.nodeid,
                "when": "collect",
                "outcome": "error",
                "exception": None,
            }
        )


def pytest_sessionfinish(session):
    path = os.environ.get("VLLM_FORK_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(_records, f, indent=1)
