"""pytest plugin: write each test phase's outcome and exception as JSON.

``make verify`` needs to tell an assertion failure from an import, fixture or
collection error, and its ledger keeps what each failure said; junit XML does
not record the exception type. It only reads pytest's reports, so it cannot
change an outcome.
"""

import json
import os

import pytest

MESSAGE_LIMIT = 600
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
        }
    )


def _message(excinfo) -> str:
    """The exception's message, cut to what a ledger row can carry."""
    if excinfo is None:
        return ""
    text = str(excinfo.value).strip()
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT] + " [...]"


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
