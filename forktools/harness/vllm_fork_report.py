"""pytest plugin: write each test phase's outcome and exception type as JSON.

``make verify`` needs to tell an assertion failure from an import, fixture or
collection error; junit XML does not record the exception type.
"""

import json
import os

import pytest

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
        }
    )


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
