"""``make apply ONTO=``: the fixes a user's vLLM checkout needs, each proved
there, on a branch of its own."""

import subprocess
import sys
from pathlib import Path

import pytest

from forktools.shipping import apply, releases
from forktools import cli, proof
from forktools.queue import check, export, materialize, pins, series
from forktools.queue.pins import ForkError

from forktools.tests.conftest import CORE, VERSION, git
from .test_pr import _pin_newer
from forktools.tests.proof.test_verify import LAYER_3, LAYER_5, SYMPTOMS


HERE = apply.TestEnvironment(Path(sys.executable))


def _fix(project, layer: int, test: str) -> None:
    (project.tree / f"tests/test_layer_{layer}.py").write_text(test)
    git(project.tree, "add", f"tests/test_layer_{layer}.py")
    core = (project.tree / "vllm/core.py").read_text()
    fixed = core.replace(f"return {layer}\n", f"return {layer}{layer}\n")
    message = (
        f"[Bugfix][Core] Make layer {layer} return {layer}{layer}\n\nWhy.\n\n"
        f"Upstream-Status: Pending [issue {layer}]"
    )
    project.commit("vllm/core.py", fixed, message)


def _layer_3_rewritten(core: str) -> str:
    return core.replace("    return 3\n", "    value = 3\n    return value\n")


def _fix_layer_3_again(project, repository: Path) -> None:
    """Layer 3's fix and test written again on its rewritten code, with the
    queue's message."""
    core = (repository / "vllm/core.py").read_text()
    fixed = core.replace("value = 3\n", "value = 33\n")
    (repository / "vllm/core.py").write_text(fixed)
    (repository / "tests/test_layer_3.py").write_text(LAYER_3)
    git(repository, "add", "vllm/core.py", "tests/test_layer_3.py")
    message = git(project.tree, "log", "--format=%B", "-n", "1", "HEAD~1")
    git(repository, "commit", "-q", "-s", "-m", message)


@pytest.fixture
def fixes(project) -> list[str]:
    """A queue of two fixes, layer 3 and layer 5, with their symptoms."""
    materialize.ensure(project.base)
    _fix(project, 3, LAYER_3)
    _fix(project, 5, LAYER_5)
    (project.base.patch_dir).mkdir(parents=True, exist_ok=True)
    names = export.export(project.base)
    (project.base.patch_dir / "symptoms.toml").write_text(SYMPTOMS)
    return names


def _checkout(project, tmp_path, edit=None) -> Path:
    """A user's checkout of the release, with one commit of their own."""
    checkout = tmp_path / "vllm"
    pristine = materialize.pristine(project.base)
    subprocess.run(["git", "clone", "-q", str(pristine), str(checkout)], check=True)
    core = (checkout / "vllm/core.py").read_text()
    (checkout / "vllm/core.py").write_text(edit(core) if edit else "# ours\n" + core)
    git(checkout, "commit", "-qam", "Our own change")
    (checkout / "vllm/_version.py").write_text(f"__version__ = version = '{VERSION}'\n")
    return checkout


def _apply(checkout: Path, *python: str) -> int:
    args = ["apply", "--onto", str(checkout)]
    return cli.main(args + (["--python", *python] if python else []))


def _report(project, checkout: Path) -> str:
    return (project.root / "apply" / checkout.name / "APPLY.md").read_text()


def test_each_fix_the_checkout_lacks_is_applied_and_proved_there(
    project, fixes, tmp_path, capsys
):
    # The checkout has layer 5's fix already (it reverse-applies).
    checkout = _checkout(
        project,
        tmp_path,
        lambda core: "# ours\n" + core.replace("return 5\n", "return 55\n"),
    )
    head = git(checkout, "rev-parse", "HEAD").strip()
    assert _apply(checkout, sys.executable) == 0
    assert git(checkout, "branch", "--show-current").strip() == "vllm-fork/fixes-v9.9.9"
    assert git(checkout, "rev-parse", "HEAD~1").strip() == head
    assert "return 33" in (checkout / "vllm/core.py").read_text()
    report = _report(project, checkout)
    assert f"- checkout: `{head[:12]} Our own change`, vLLM {VERSION} (read from" in (
        report
    )
    assert f"vLLM {VERSION} (read from vllm/_version.py)" in report
    assert f"| {fixes[0]} | applied | clean | proved: 1/1 passed with it, " in report
    assert f"| {fixes[1]} | has it | its source changes reverse-apply | - |" in report
    assert f"apply: {fixes[0]}: applied" in capsys.readouterr().out


def test_a_fix_whose_context_the_checkout_changed_is_applied_three_way(
    project, fixes, tmp_path
):
    # The checkout's own change touches a line of layer 3's patch context.
    checkout = _checkout(
        project,
        tmp_path,
        lambda core: core.replace("def layer_4():\n", "def layer_4():  # ours\n"),
    )
    assert _apply(checkout, sys.executable) == 0
    report = _report(project, checkout)
    assert (
        f"| {fixes[0]} | applied | three-way | proved: 1/1 passed with it, " in report
    )
    core = (checkout / "vllm/core.py").read_text()
    assert "return 33\n" in core and "def layer_4():  # ours\n" in core


def test_without_python_the_fixes_are_applied_but_not_proved(project, fixes, tmp_path):
    checkout = _checkout(project, tmp_path)
    assert _apply(checkout) == 1
    report = _report(project, checkout)
    assert report.count("| applied | clean | not proved here (PYTHON=") == 2


def test_a_fix_whose_tests_pass_without_it_is_not_needed_and_left_off(
    project, fixes, tmp_path
):
    # Layer 3 is given its right value elsewhere: the fix applies, but the
    # bug is not there.
    checkout = _checkout(
        project, tmp_path, lambda core: core + "\n\ndef layer_3():\n    return 33\n"
    )
    assert _apply(checkout, sys.executable) == 0
    report = _report(project, checkout)
    assert (
        f"| {fixes[0]} | not needed | its tests pass without it here | 1/1 passed without it; left off |"
        in report
    )
    log = git(checkout, "log", "--format=%s", "-n", "2").splitlines()
    assert log == ["[Bugfix][Core] Make layer 5 return 55", "Our own change"]


def test_a_conflict_stops_naming_the_lines_and_a_second_run_goes_on(
    project, fixes, tmp_path
):
    checkout = _checkout(
        project, tmp_path, lambda core: core.replace("return 3\n", "return 300\n")
    )
    ours = git(checkout, "branch", "--show-current").strip()
    with pytest.raises(ForkError) as stopped:
        apply.main(checkout, None, None)
    said = str(stopped.value)
    branch = "vllm-fork/fixes-v9.9.9"
    assert f"git am --abort && git switch {ours} && git branch -D {branch}" in said
    assert said.startswith(f"patches/v9.9.9/{fixes[0]} does not apply onto ")
    assert "vllm/core.py: conflict at lines" in said
    assert "git am --continue" in said and "run make apply again" in said
    assert said.endswith(
        "(upstream lacks it, its source changes do not reverse-apply) "
        "and no queue's version of the fix applies: the code moved, "
        "the fix needs a port for this release."
    )
    assert f"| {fixes[0]} | conflict | applies from no queue |" in _report(
        project, checkout
    )

    core = (checkout / "vllm/core.py").read_text()
    resolved = (
        core.split("<<<<<<<")[0]
        + "    return 33\n"
        + core.split(">>>>>>>")[1].split("\n", 1)[1]
    )
    (checkout / "vllm/core.py").write_text(resolved)
    git(checkout, "add", "vllm/core.py")
    subprocess.run(
        ["git", "-C", str(checkout), "am", "--continue"],
        check=True,
        capture_output=True,
    )
    # Proved again: without it, the checkout's own 300 shows, which is not
    # the bug's declared symptom; the fix is not proved there.
    assert apply.main(checkout, None, HERE) == 1
    report = _report(project, checkout)
    earlier = "applied | on the branch from an earlier run | NOT proved: without it, "
    assert f"| {fixes[0]} | {earlier}" in report
    assert "assert 300 == 33, not its declared symptom" in report
    assert f"| {fixes[1]} | applied | clean | proved: " in report


def test_the_version_comes_from_a_release_tag_else_the_version_file_else_refused(
    project, tmp_path
):
    checkout = tmp_path / "vllm"
    checkout.mkdir()
    git(checkout, "init", "-q")
    git(checkout, "commit", "-q", "--allow-empty", "-m", "start")
    with pytest.raises(ForkError, match="cannot tell its vLLM version .* give BASE="):
        apply.checkout_version(checkout)
    (checkout / "vllm").mkdir()
    (checkout / "vllm/_version.py").write_text("__version__ = version = '9.9.12'\n")
    assert apply.checkout_version(checkout) == ("9.9.12", "vllm/_version.py")
    git(checkout, "tag", "v9.9.11")
    git(checkout, "commit", "-q", "--allow-empty", "-m", "later")
    assert apply.checkout_version(checkout) == (
        "9.9.11",
        "the tag v9.9.11 on its history",
    )
    assert apply.base_for("9.9.11", pins.load()).name == "v9.9.9"
    with pytest.raises(ForkError, match="older than the oldest pinned base, v9.9.9"):
        apply.base_for("9.9.8", pins.load())


def test_a_checkout_with_changes_is_refused_and_nothing_moves(project, fixes, tmp_path):
    checkout = _checkout(project, tmp_path)
    (checkout / "vllm/core.py").write_text("# changed by hand\n")
    with pytest.raises(
        ForkError, match="has uncommitted changes .* run make apply again"
    ):
        apply.main(checkout, None, None)
    assert git(checkout, "branch", "--show-current").strip() != "vllm-fork/fixes-v9.9.9"


def test_another_queues_version_of_a_fix_is_taken_where_the_bases_does_not_apply(
    project, fixes, tmp_path
):
    # A newer release writes layer 3 another way; its queue carries the same
    # fix written for that code, under the same subject.
    name = _pin_newer(project, "9.9.10", _layer_3_rewritten(CORE))
    newer = pins.load().get(name)
    _fix_layer_3_again(project, materialize.ensure(newer))
    [ported] = export.export(newer)
    (newer.patch_dir / "symptoms.toml").write_text(SYMPTOMS)  # judged by its own
    # An internal build of newer code, told to take the v9.9.9 queue.
    checkout = tmp_path / "vllm"
    pristine = materialize.pristine(newer)
    subprocess.run(["git", "clone", "-q", str(pristine), str(checkout)], check=True)
    dev = "__version__ = version = '9.9.11.dev3+g1e98434'\n"  # no release: BASE= says
    (checkout / "vllm/_version.py").write_text(dev)
    assert apply.main(checkout, "v9.9.9", HERE) == 0
    report = _report(project, checkout)
    assert f"| {fixes[0]} | applied | clean, v9.9.10's version of it ({ported}) |" in (
        report
    )
    assert f"| {fixes[1]} | applied | clean | proved: " in report
    assert "vLLM 9.9.9 (read from BASE=v9.9.9: none of its own)" in report
    assert "value = 33" in (checkout / "vllm/core.py").read_text()


def test_a_port_is_taken_where_no_queue_has_a_version_that_applies(
    project, fixes, tmp_path, monkeypatch
):
    # Release 9.9.10, pinned by no queue, writes layer 3 another way; the
    # v9.9.9 queue keeps a port of its fix written on that release.
    release = _checkout(project, tmp_path / "release", _layer_3_rewritten)
    _fix_layer_3_again(project, release)
    port = project.base.patch_dir / "ports" / "9.9.10" / fixes[0]
    port.parent.mkdir(parents=True)
    port.write_text(git(release, "format-patch", "-1", "--stdout"))
    monkeypatch.setattr(apply.release_sdists, "checkout_of", lambda version: release)
    checkout = _checkout(project, tmp_path / "user", _layer_3_rewritten)
    entries = series.fixes(project.base)
    cell = apply.try_alone(checkout, project.base, entries[0], VERSION, pins.load())
    assert cell == "applies as the 9.9.10 port"
    assert apply.main(checkout, None, HERE) == 0
    report = _report(project, checkout)
    taken = f"clean, its port to 9.9.10 (ports/9.9.10/{fixes[0]}) | proved: "
    assert f"| {fixes[0]} | applied | {taken}" in report
    assert "value = 33" in (checkout / "vllm/core.py").read_text()


def test_a_second_run_judges_a_port_on_the_branch_by_the_ports_symptoms(
    project, fixes, tmp_path, monkeypatch
):
    # The port's own symptoms say how layer 3 fails on its release; the
    # base's, for its own code, would not match there.
    release = _checkout(project, tmp_path / "release", _layer_3_rewritten)
    _fix_layer_3_again(project, release)
    message = git(release, "log", "-1", "--format=%B")
    ported = message.replace("Why.", "Why.\n\nPort: written on 9.9.10.")
    git(release, "commit", "-q", "--amend", "-m", ported)
    folder = project.base.patch_dir / "ports" / "9.9.10"
    folder.mkdir(parents=True)
    (folder / fixes[0]).write_text(git(release, "format-patch", "-1", "--stdout"))
    (folder / "symptoms.toml").write_text(SYMPTOMS)
    (project.base.patch_dir / "symptoms.toml").write_text(
        SYMPTOMS.replace("assert 3 == 33", "assert 30 == 33")
    )
    monkeypatch.setattr(apply.release_sdists, "checkout_of", lambda version: release)
    checkout = _checkout(project, tmp_path / "user", _layer_3_rewritten)
    assert apply.main(checkout, None, HERE) == 0
    assert apply.main(checkout, None, HERE) == 0  # both fixes on the branch now
    again = f"| {fixes[0]} | applied | on the branch from an earlier run | proved: "
    assert again in _report(project, checkout)


def test_each_fix_alone_on_a_release_as_the_release_table_shows_it(
    project, fixes, tmp_path
):
    pinned = pins.load()
    entries = series.fixes(project.base)
    plain = _checkout(project, tmp_path / "plain")
    fixed = _checkout(
        project,
        tmp_path / "fixed",
        lambda core: core.replace("return 3\n", "return 33\n"),
    )
    moved = _checkout(project, tmp_path / "moved", lambda core: "")
    git(moved, "rm", "-q", "vllm/core.py")
    git(moved, "commit", "-qm", "core.py moved away")
    competing = _checkout(
        project,
        tmp_path / "competing",
        lambda core: core.replace("return 3\n", "return 300\n"),
    )
    cells = {
        name: apply.try_alone(checkout, project.base, entries[0], VERSION, pinned)
        for name, checkout in [
            ("plain", plain),
            ("fixed", fixed),
            ("moved", moved),
            ("competing", competing),
        ]
    }
    assert cells == {
        "plain": "applies",
        "fixed": "has it (code)",
        "moved": "no code",
        "competing": "port needed",
    }
    for checkout in (plain, competing):  # left as it was
        assert git(checkout, "log", "-1", "--format=%s").strip() == "Our own change"
        assert git(checkout, "status", "--porcelain", "--untracked-files=no") == ""


def test_the_release_table_takes_the_latest_patch_of_each_minor_in_the_pinned_range(
    project, monkeypatch
):
    name = _pin_newer(project, "9.11.0", CORE)
    assert name == "v9.11.0"
    offered = ["9.9.8", "9.9.9", "9.10.0", "9.10.2", "9.10.3rc1", "9.11.0", "9.12.0"]
    offered += ["9.10.1.dev4", "9.10.1.post1"]
    candidates = [type("Candidate", (), {"version": v})() for v in offered]
    monkeypatch.setattr(
        releases.download, "_pip_candidates", lambda project: candidates
    )
    assert releases.releases(pins.load()) == ["9.9.9", "9.10.2", "9.11.0"]


def test_on_a_machine_without_a_gpu_the_tests_run_under_the_cpu_harness(
    tmp_path, monkeypatch, capsys
):
    harnesses = []

    def run_tests(python, checkout, tests, label="", harness=proof.HARNESS):
        harnesses.append(sorted(p.name for p in harness.glob("*.py")))
        return proof.Outcome()

    monkeypatch.setattr(apply.proof, "run_tests", run_tests)
    for cpu in (False, True):
        apply._run(
            tmp_path, apply.TestEnvironment(Path(sys.executable), cpu), [], "with"
        )
    plain, cpu = harnesses
    assert plain == ["vllm_fork_report.py"]
    assert {"sitecustomize.py", "vllm_c_op_stubs.py", "vllm_fork_report.py"} <= set(cpu)
    assert cli.main(["apply", "--onto", str(tmp_path), "--cpu"]) != 0
    assert "--cpu goes with --python" in capsys.readouterr().err


def test_the_version_written_on_the_code_nearest_the_checkouts_comes_first(project):
    base = project.base  # v9.9.9
    versions = [
        apply.Version(base, Path("own")),
        apply.Version(base, Path("port"), "9.9.11"),
        apply.Version(base, Path("port"), "9.9.13"),
    ]
    for release, first in [
        ("9.9.9", "9.9.9"),  # its own base
        ("9.9.10", "9.9.9"),  # the only one at or below
        ("9.9.12", "9.9.11"),  # the newest at or below
        ("9.9.14", "9.9.13"),
    ]:
        nearest = sorted(versions, key=apply._nearest_code(release))[0]
        assert nearest.written_on == first


def test_a_ports_own_symptoms_judge_its_tests_where_the_bug_shows_otherwise(
    project, fixes
):
    # On the port's release the bug returns 30, not 3.
    test = "tests/test_layer_3.py::test_layer_3"
    without = proof.Outcome({test: "failed"}, {test: "AssertionError: assert 30 == 33"})
    folder = project.base.patch_dir / "ports" / "9.9.10"
    folder.mkdir(parents=True)
    [problem] = proof.judge_without_fix(project.base, without, "ports/9.9.10")
    assert "not its declared symptom" in problem
    (folder / "symptoms.toml").write_text(
        f'["{test}"]\nexception = "AssertionError"\nmessage = "assert 30 == 33"\n'
    )
    assert proof.judge_without_fix(project.base, without, "ports/9.9.10") == []
    assert proof.judge_without_fix(project.base, without) != []


LAYER_7 = "def test_layer_7():\n    from vllm import core\n\n    assert core.layer_7() == 77\n"


def _newer_queue_with_its_own_fix(project) -> pins.Base:
    """Release 9.9.10, pinned, whose queue carries a fix no older queue
    has: layer 7, a bug that came in after 9.9.9."""
    name = _pin_newer(project, "9.9.10", CORE)
    newer = pins.load().get(name)
    tree = materialize.ensure(newer)
    (tree / "tests/test_layer_7.py").write_text(LAYER_7)
    (tree / "vllm/core.py").write_text(CORE.replace("return 7\n", "return 77\n"))
    git(tree, "add", "vllm/core.py", "tests/test_layer_7.py")
    message = "[Bugfix][Core] Make layer 7 return 77\n\nWhy.\n\nUpstream-Status: Pending [issue 7]"
    git(tree, "commit", "-q", "-s", "-m", message)
    export.export(newer)
    (newer.patch_dir / "symptoms.toml").write_text(
        '["tests/test_layer_7.py::test_layer_7"]\n'
        'exception = "AssertionError"\nmessage = "assert 7 == 77"\n'
    )
    return newer


def test_a_fix_only_a_newer_queue_carries_is_taken_where_its_bug_is(
    project, fixes, tmp_path
):
    newer = _newer_queue_with_its_own_fix(project)
    [own] = series.fixes(newer)
    taken = [
        (fix.base.name, fix.entry.name)
        for fix in apply.needed(project.base, pins.load())
    ]
    assert taken == [(project.base.name, fixes[0]), (project.base.name, fixes[1])] + [
        (newer.name, own.name)
    ]
    checkout = _checkout(project, tmp_path / "has-the-bug")
    assert apply.main(checkout, None, HERE) == 0
    report = _report(project, checkout)
    assert f"| v9.9.10 {own.name} | applied | clean | proved: 1/1 passed with it, " in (
        report
    )
    assert "return 77" in (checkout / "vllm/core.py").read_text()


def test_below_the_release_its_bug_came_in_with_a_fix_is_not_needed(
    project, fixes, tmp_path
):
    newer = _newer_queue_with_its_own_fix(project)
    [own] = series.fixes(newer)
    (newer.patch_dir / series.BUGS_SINCE).write_text(
        f'["{own.name}"]\nsince = "9.9.10"\nwhy = "layer 7 returns 7 from there"\n'
    )
    assert check._bugs_since(newer) == []
    checkout = _checkout(project, tmp_path / "older")
    cell = apply.try_alone(checkout, newer, own, VERSION, pins.load())
    assert cell == "no bug (came in 9.9.10)"
    assert apply.main(checkout, None, HERE) == 0
    report = _report(project, checkout)
    came_in = "the bug came in with 9.9.10 (layer 7 returns 7 from there)"
    assert f"| v9.9.10 {own.name} | not needed | {came_in} | - |" in report
    assert "return 7\n" in (checkout / "vllm/core.py").read_text()
    (newer.patch_dir / series.BUGS_SINCE).write_text(
        '["0009-No-such-fix.patch"]\nsince = "next"\nwhy = ""\n'
    )
    [problem] = check._bugs_since(newer)
    assert "0009-No-such-fix.patch is no fix of the v9.9.10 queue" in problem
