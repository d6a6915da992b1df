"""``make rebase``: pin a release, replay the queue, classify, report."""

import json
import sys
from pathlib import Path

import pytest

from forktools import proof
from forktools.queue import check, export, materialize, pins, rebase, series
from forktools import cli
from forktools.environments import venv
from forktools.queue.pins import ForkError

from forktools.tests import conftest
from forktools.tests.conftest import CORE, git, publish, sha256

NEW = "9.9.10"
TRAILER = "Upstream-Status: Pending [issue 1]"


def _message(subject: str) -> str:
    return f"{subject}\n\nWhy and how.\n\n{TRAILER}\nSigned-off-by: A <a@example.com>"


def _queue(project, *changes: tuple[str, str, str]) -> list[str]:
    """Commit each (path, old, new) replacement as one patch and export."""
    materialize.ensure(project.base)
    for number, (path, old, new) in enumerate(changes, 1):
        file = project.tree / path
        text = file.read_text() if file.exists() else ""
        file.parent.mkdir(parents=True, exist_ok=True)
        new_text = text.replace(old, new) if old else text + new
        project.commit(path, new_text, _message(f"[Bugfix] Fix {number}"))
    return export.export(project.base)


def _report(project) -> dict:
    return json.loads((project.root / "patches" / f"v{NEW}" / "rebase.json").read_text())


def _outcomes(project) -> list[str]:
    return [patch["outcome"] for patch in _report(project)["patches"]]


def _files(root) -> dict:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and ".fork" not in path.parts
    }


SHIFTED = "# a new header line upstream\n\n" + CORE


def rebase_onto_release_with_fix_1(project) -> Path:
    """Two patches; the new release holds the first and shifts the second."""
    _queue(
        project,
        ("vllm/core.py", "return 3\n", "return 33\n"),
        ("vllm/core.py", "return 10\n", "return 100\n"),
    )
    publish(project.index, NEW, SHIFTED.replace("return 3\n", "return 33\n"))
    return rebase.rebase(NEW)


def test_absorbed_patch_is_dropped_and_moved_one_refreshed(project):
    report = rebase_onto_release_with_fix_1(project)
    assert _outcomes(project) == ["upstream", "refreshed"]
    first, second = _report(project)["patches"]
    assert "reverse-applies on pristine 9.9.10" in first["evidence"][0]
    assert second["evidence"] == ["vllm/core.py: hunk 1 moved +2 lines"]
    assert second["new_patch"].startswith("0001-Bugfix-Fix-2")
    new_base = pins.load().get(f"v{NEW}")
    assert [w.file.split("2_17_")[1] for w in new_base.wheels] == [
        "x86_64.whl",
        "aarch64.whl",
    ]
    assert new_base.sdist.sha256 == sha256(project.index / f"vllm-{NEW}.tar.gz")
    assert "| 1 | `0001-Bugfix-Fix-1" in report.read_text()
    tree = materialize.tree_dir(new_base)
    assert "return 100" in (tree / "vllm/core.py").read_text()
    assert materialize.unexported(tree) == []


def test_source_hunks_that_empty_out_drop_the_patch(project):
    _queue(project, ("vllm/core.py", "return 3\n", "return 33\n"))
    _queue(project, ("tests/test_three.py", "", "def test_three():\n    pass\n"))
    text = (project.tree / "vllm/core.py").read_text()
    git(project.tree, "reset", "-q", "--soft", "HEAD~2")
    git(project.tree, "commit", "-q", "-m", _message("[Bugfix] Fix with test"))
    export.export(project.base)
    publish(project.index, NEW, text)
    rebase.rebase(NEW)
    [patch] = _report(project)["patches"]
    assert patch["outcome"] == "upstream"
    assert "source hunks empty out" in patch["evidence"][0]
    assert "tests/test_three.py" in patch["evidence"][1]
    assert (project.root / "patches" / f"v{NEW}" / "series").read_text().count(
        ".patch"
    ) == 0


THREE_TEST = "from vllm.core import layer_3\n\n\ndef test_three():\n    assert layer_3() == 33\n"


def _queue_fix_with_test(project) -> None:
    _queue(project, ("vllm/core.py", "return 3\n", "return 33\n"))
    _queue(project, ("tests/test_three.py", "", THREE_TEST))
    git(project.tree, "reset", "-q", "--soft", "HEAD~2")
    git(project.tree, "commit", "-q", "-m", _message("[Bugfix] Fix with test"))
    export.export(project.base)


@pytest.fixture
def probe_python(monkeypatch):
    monkeypatch.setattr(venv, "ensure", lambda base: Path(sys.executable))


def test_fix_upstream_made_its_own_way_is_dropped_by_its_tests(project, probe_python):
    _queue_fix_with_test(project)
    publish(project.index, NEW, CORE.replace("return 3\n", "return 30 + 3\n"))
    assert cli.main(["rebase", "--to", NEW, "--probe-tests"]) == 0
    [patch] = _report(project)["patches"]
    assert patch["outcome"] == "upstream"
    assert "tests pass on 9.9.10 without it (1 passed, 0 failed of 1)" in (
        patch["evidence"][0]
    )
    assert "tests/test_three.py::test_three" in patch["evidence"][1]
    tree = project.root / ".fork" / "trees" / f"v{NEW}"
    assert git(tree, "rev-parse", "HEAD") == git(tree, "rev-parse", "base")


def test_probe_keeps_upstream_tests_added_in_the_same_place(project, probe_python):
    core_tests = conftest.SDIST_FILES["tests/test_core.py"]
    _queue(
        project,
        ("vllm/core.py", "return 3\n", "return 33\n"),
        ("tests/test_core.py", "", "\n\n" + THREE_TEST.replace("three", "3")),
    )
    git(project.tree, "reset", "-q", "--soft", "HEAD~2")
    git(project.tree, "commit", "-q", "-m", _message("[Bugfix] Fix with test"))
    export.export(project.base)
    upstream_test = "\n\ndef test_layer_3_upstream():\n    assert True\n"
    core = CORE.replace("return 3\n", "return 30 + 3\n")
    publish(project.index, NEW, core, tests=core_tests + upstream_test)
    rebase.rebase(NEW, probe=proof.probe_tests)
    [patch] = _report(project)["patches"]
    assert patch["outcome"] == "upstream"
    assert patch["evidence"][0].startswith("its tests pass on 9.9.10 without it")
    assert patch["evidence"][2] == (
        "its test hunks conflict with upstream's tests in tests/test_core.py; "
        "probed with both kept (union merge)"
    )


def test_fix_whose_tests_fail_without_it_is_kept_with_that_evidence(
    project, probe_python
):
    _queue_fix_with_test(project)
    publish(project.index, NEW, SHIFTED)
    rebase.rebase(NEW, probe=proof.probe_tests)
    [patch] = _report(project)["patches"]
    assert patch["outcome"] == "refreshed"
    assert patch["evidence"][-1] == (
        "its tests without it on 9.9.10: 0 passed, 1 failed of 1, on assertions: "
        "still needed"
    )


def test_fix_whose_tests_break_on_the_new_api_proves_nothing(project, probe_python):
    _queue_fix_with_test(project)
    publish(project.index, NEW, CORE.replace("layer_3():", "layer_3(scale):"))
    assert cli.main(["rebase", "--to", NEW, "--probe-tests"]) == 1
    [patch] = _report(project)["patches"]
    assert patch["outcome"] == "conflict"
    assert patch["evidence"][-1] == (
        "its tests without it on 9.9.10 (0 passed, 1 failed of 1) did not run as "
        "written, so they prove nothing: failed with TypeError"
    )


def test_conflict_names_file_and_hunk_and_loses_nothing(project, capsys):
    [name] = _queue(project, ("vllm/core.py", "return 3\n", "return 33\n"))
    before = (project.base.patch_dir / name).read_bytes()
    publish(project.index, NEW, CORE.replace("return 3\n", "return 7\n"))
    assert cli.main(["rebase", "--to", NEW]) == 1
    [patch] = _report(project)["patches"]
    assert patch["outcome"] == "conflict"
    assert patch["evidence"] == ["vllm/core.py: conflict at lines 14-18 (in def layer_3)"]
    assert "git cherry-pick --continue" in capsys.readouterr().out
    assert (project.base.patch_dir / name).read_bytes() == before
    tree = project.root / ".fork" / "trees" / f"v{NEW}"
    assert (tree / ".git" / "CHERRY_PICK_HEAD").exists()
    assert "return 33" in git(tree, "show", f"{rebase.PREVIOUS}:vllm/core.py")

    with pytest.raises(ForkError, match="still being resolved"):
        rebase.rebase(NEW)
    (tree / "vllm/core.py").write_text(CORE.replace("return 3\n", "return 77\n"))
    git(tree, "add", "vllm/core.py")
    git(tree, "-c", "core.editor=true", "cherry-pick", "--continue")
    assert cli.main(["rebase", "--to", NEW]) == 0
    assert _outcomes(project) == ["resolved"]
    [new_name] = (project.root / "patches" / f"v{NEW}").glob("0001-*.patch")
    assert "+    return 77" in new_name.read_text()


def test_rerun_of_a_finished_rebase_changes_nothing(project):
    _queue(project, ("vllm/core.py", "return 10\n", "return 100\n"))
    publish(project.index, NEW, SHIFTED)
    rebase.rebase(NEW)
    tree = project.root / ".fork" / "trees" / f"v{NEW}"
    before = _files(project.root), git(tree, "rev-parse", "HEAD")
    rebase.rebase(f"v{NEW}")
    assert (_files(project.root), git(tree, "rev-parse", "HEAD")) == before


def _rebase_then_change_source(project) -> None:
    """A finished rebase to NEW whose source queue then changes."""
    _queue(project, ("vllm/core.py", "return 10\n", "return 100\n"))
    publish(project.index, NEW, SHIFTED)
    rebase.rebase(NEW)
    _queue(project, ("vllm/core.py", "return 11\n", "return 111\n"))


def test_changed_source_queue_stops_a_rerun(project):
    _rebase_then_change_source(project)
    with pytest.raises(ForkError, match="has changed since.*PORTED=1"):
        rebase.rebase(NEW)


def test_a_recorded_port_makes_the_rebase_current_again(project):
    _rebase_then_change_source(project)
    target = pins.load().get(f"v{NEW}")
    assert any("has changed since" in p for p in check.problems(target))
    report = rebase.rebase(NEW, ported=True)
    assert not any("has changed since" in p for p in check.problems(target))
    assert "were ported into this queue by hand" in report.read_text()
    made = json.loads(report.with_name(rebase.REPORT_JSON).read_text())
    assert made["ported_from"]["queue"] == series.patches_id(project.base)
    tree = project.root / ".fork" / "trees" / f"v{NEW}"
    before = _files(project.root), git(tree, "rev-parse", "HEAD")
    assert cli.main(["rebase", "--to", NEW]) == 0
    assert (_files(project.root), git(tree, "rev-parse", "HEAD")) == before


def test_a_port_is_not_recorded_into_an_unexported_queue(project):
    _queue(project, ("vllm/core.py", "return 10\n", "return 100\n"))
    publish(project.index, NEW, SHIFTED)
    rebase.rebase(NEW)
    tree = project.root / ".fork" / "trees" / f"v{NEW}"
    (tree / "vllm/core.py").write_text("edited\n")
    report = project.root / "patches" / f"v{NEW}" / rebase.REPORT_JSON
    before = report.read_text()
    with pytest.raises(ForkError, match="(?s)not the exported tree.*unexported edit"):
        rebase.rebase(NEW, ported=True)
    assert report.read_text() == before


def test_a_port_is_recorded_before_make_verify_proves_it(project):
    _rebase_then_change_source(project)
    target = pins.load().get(f"v{NEW}")
    # What verify settles, not export: a declaration the port made stale.
    (target.patch_dir / "symptoms.toml").write_text("[unclosed\n")

    rebase.rebase(NEW, ported=True)

    assert check.problems(target) == []
    [problem] = proof.symptom_problems(target)
    assert "symptoms.toml" in problem


def test_published_hash_mismatch_names_the_file_and_pins_nothing(project):
    _queue(project, ("vllm/core.py", "return 10\n", "return 100\n"))
    publish(project.index, NEW, SHIFTED)
    sdist = f"vllm-{NEW}.tar.gz"
    links = [
        f'<a href="{path.as_uri()}#sha256={"0" * 64 if path.name == sdist else sha256(path)}">'
        f"{path.name}</a>"
        for path in sorted(project.index.glob(f"vllm-{NEW}*"))
    ]
    page = project.index.parent / "simple.html"
    page.write_text("<html><body>" + "\n".join(links) + "</body></html>")
    pin_file = (project.root / "upstream.toml").read_text()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PIP_FIND_LINKS", str(page))
        with pytest.raises(ForkError) as error:
            rebase.rebase(NEW)
    assert f"sha256 mismatch for {sdist}" in str(error.value)
    assert (project.root / "upstream.toml").read_text() == pin_file
    assert not (project.root / "patches" / f"v{NEW}").exists()


def test_unknown_release_is_named(project):
    _queue(project, ("vllm/core.py", "return 10\n", "return 100\n"))
    with pytest.raises(ForkError, match="vllm 9.9.11 is not offered"):
        rebase.rebase("9.9.11")
