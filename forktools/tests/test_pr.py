import pytest

from forktools import export, materialize, pr, verify
from forktools.pins import ForkError
from forktools.verify import Outcome, Row

MESSAGE = """[Bugfix][Core] Make layer 3 return 33

Layer 3 returned 3, which broke everything downstream.

Upstream status: not upstream.

Signed-off-by: Test Author <author@example.com>"""


def _queue_of_one(project) -> str:
    materialize.ensure(project.base)
    text = (project.tree / "vllm/core.py").read_text()
    project.commit("vllm/core.py", text.replace("return 3\n", "return 33\n"), MESSAGE)
    [name] = export.export(project.base)
    return name


def test_pr_body_comes_from_message_and_verify_row(project):
    name = _queue_of_one(project)
    row = Row(
        project.base.name,
        name,
        1,
        Outcome(1, 0, [], set()),
        Outcome(0, 1, [], {"AssertionError"}),
        12.0,
        nodeids=["tests/test_core.py::test_layer"],
        undone_by="reverted vllm/core.py",
    )
    verify._save(project.base, [row])
    text = pr.body(project.base, 1)
    assert text.startswith("Title: [Bugfix][Core] Make layer 3 return 33\n")
    assert "## Purpose\n\nLayer 3 returned 3" in text
    assert "Signed-off-by" not in text
    assert "    tests/test_core.py::test_layer" in text
    assert "with the fix 1/1 passed; without it 1/1 failed (AssertionError)" in text


def test_pr_needs_a_verify_row_for_the_current_queue(project):
    _queue_of_one(project)
    with pytest.raises(ForkError, match="make verify"):
        pr.body(project.base, 1)
    with pytest.raises(ForkError, match="no #2"):
        pr.body(project.base, 2)
