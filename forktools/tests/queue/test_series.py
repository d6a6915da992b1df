import json
from dataclasses import replace

import pytest

from forktools.queue import check, export, materialize, pins, series
from forktools.queue.pins import ForkError

from forktools.tests.conftest import BASE, VERSION, WHEEL_FILES, _wheel, git

FIX = "[Bugfix][Core] Make layer 3 return 33"


def _fix(project, message=FIX):
    text = (project.tree / "vllm/core.py").read_text()
    project.commit("vllm/core.py", text.replace("return 3\n", "return 33\n"), message)


def test_tree_holds_sdist_wheel_extras_and_version(project):
    tree = materialize.ensure(project.base)
    assert (tree / "vllm/core.py").exists()
    assert (tree / "tests/test_core.py").exists()
    assert not (tree / "setup.py").exists()
    assert (tree / "vllm/_C.abi3.so").read_text() == "\x7fELF compiled kernels"
    version = materialize.version(project.base)
    assert version.startswith(f"{VERSION}+fork.")
    assert repr(version) in (tree / "vllm/_version.py").read_text()
    assert materialize.unexported(tree) == []
    assert git(tree, "ls-files", "vllm/_C.abi3.so") == ""


def test_select_links_root_to_tree(project):
    materialize.ensure(project.base)
    materialize.select(project.base)
    assert (project.root / "vllm/core.py").read_text() == (
        project.tree / "vllm/core.py"
    ).read_text()
    assert materialize.selected() == BASE


def test_export_round_trip_is_byte_identical(project):
    materialize.ensure(project.base)
    _fix(project)
    [name] = export.export(project.base)
    patch = (project.base.patch_dir / name).read_bytes()
    assert b"Subject: [PATCH] [Bugfix][Core] Make layer 3 return 33" in patch
    assert b"Signed-off-by: Test Author <author@example.com>" in patch
    listed = (project.base.patch_dir / "series").read_text()
    assert f"{name}  # {series.NO_STATUS}" in listed

    assert export.export(project.base) == [name]
    assert (project.base.patch_dir / name).read_bytes() == patch

    materialize.build(project.base)
    assert git(project.tree, "log", "-1", "--format=%s") == f"{FIX}\n"
    assert export.export(project.base) == [name]
    assert (project.base.patch_dir / name).read_bytes() == patch
    assert check.problems(project.base) == []


def test_series_comment_follows_the_trailer_and_is_not_read(project):
    materialize.ensure(project.base)
    status = "Upstream-Status: Submitted [PR 1]"
    _fix(project, f"{FIX}\n\n{status}\nSigned-off-by: A <a@example.com>")
    [name] = export.export(project.base)
    series_file = project.base.patch_dir / "series"
    assert f"{name}  # Submitted [PR 1]" in series_file.read_text()
    series_file.write_text(
        series_file.read_text().replace("Submitted [PR 1]", "anything")
    )
    [entry] = series.entries(project.base)
    assert str(entry.upstream_status(project.base)) == "Submitted [PR 1]"


def test_version_follows_the_queue(project):
    materialize.ensure(project.base)
    before = materialize.version(project.base)
    _fix(project)
    export.export(project.base)
    after = materialize.version(project.base)
    assert before != after
    assert repr(after) in (project.tree / "vllm/_version.py").read_text()


def test_the_version_label_follows_only_the_code_that_ships(project):
    """vLLM hashes its version into every compile cache key: a queue update
    that ships the same code on this platform must keep the label."""
    materialize.ensure(project.base)
    _fix(project)
    export.export(project.base)
    seen = (materialize.version(project.base), series.queue_id(project.base))

    def after(change) -> tuple[str, str]:
        change()
        export.export(project.base)
        now = materialize.version(project.base), series.queue_id(project.base)
        assert now[1] != seen[1]  # the exact queue is still told apart
        return now

    reworded = f"{FIX}\n\nWhy, in more words.\n\nUpstream-Status: Pending [issue 9]"
    assert after(lambda: git(project.tree, "commit", "-q", "--amend", "-m", reworded))[
        0
    ] == seen[0]
    test = "def test_layer():\n    assert 1\n"
    assert after(lambda: project.commit("tests/test_core.py", test, "[Test] One"))[
        0
    ] == seen[0]
    other = pins.Artifact("vllm-9.9.9-py3-none-manylinux_2_17_other.whl", "0" * 64)
    moved = pins.Artifact(other.file, "1" * 64)
    here = project.base.wheel_for_this_machine()
    assert series.label_id(replace(project.base, wheels=(here, other))) == series.label_id(
        replace(project.base, wheels=(here, moved))
    )
    assert series.label_id(project.base, other) != series.label_id(project.base, moved)

    core = (project.tree / "vllm/core.py").read_text()
    label, queue_id = after(
        lambda: project.commit("vllm/core.py", core.replace("return 4\n", "return 44\n"), "B")
    )
    assert label != seen[0]
    written = (materialize.ensure(project.base) / "vllm/_version.py").read_text()
    assert f"__version__ = version = {label!r}" in written
    assert f"__fork_queue__ = {queue_id!r}" in written


def test_unexported_edits_refuse_rebuild_and_lose_nothing(project):
    materialize.ensure(project.base)
    _fix(project)
    export.export(project.base)
    (project.tree / "vllm/core.py").write_text("edited, not exported\n")
    (project.base.patch_dir / "series").write_text("")
    with pytest.raises(ForkError, match="vllm/core.py"):
        materialize.ensure(project.base)
    assert (project.tree / "vllm/core.py").read_text() == "edited, not exported\n"


def test_unexported_commit_refuses_switch(project):
    materialize.ensure(project.base)
    materialize.select(project.base)
    _fix(project)
    with pytest.raises(ForkError, match="vllm/core.py"):
        materialize.select(_other_base(project))
    assert "return 33" in (project.tree / "vllm/core.py").read_text()


def _other_base(project):
    from dataclasses import replace

    return replace(project.base, name="v0.0.1")


def test_export_refuses_uncommitted_changes(project):
    materialize.ensure(project.base)
    (project.tree / "vllm/core.py").write_text("uncommitted\n")
    with pytest.raises(ForkError, match="vllm/core.py"):
        export.export(project.base)


def test_export_passes_over_what_test_runs_leave_in_the_tree(project):
    materialize.ensure(project.base)
    _fix(project)
    for by_product in (".hypothesis/constants/0a1b", "tests/__pycache__/t.pyc"):
        (project.tree / by_product).parent.mkdir(parents=True, exist_ok=True)
        (project.tree / by_product).write_text("left by a test run\n")
    (project.tree / "notes.txt").write_text("an edit\n")
    with pytest.raises(ForkError) as error:
        export.export(project.base)
    assert "notes.txt" in str(error.value)
    assert ".hypothesis" not in str(error.value)
    (project.tree / "notes.txt").unlink()
    assert export.export(project.base)


def test_patch_that_no_longer_applies_is_named_with_its_file(project):
    materialize.ensure(project.base)
    _fix(project)
    [name] = export.export(project.base)
    patch = project.base.patch_dir / name
    patch.write_text(patch.read_text().replace("return 3\n", "return 3000\n"))
    with pytest.raises(ForkError) as error:
        materialize.build(project.base)
    assert name in str(error.value)
    assert "vllm/core.py" in str(error.value)
    assert "return 33" in (project.tree / "vllm/core.py").read_text()


def test_of_two_patches_the_one_that_no_longer_applies_is_named(project):
    materialize.ensure(project.base)
    _fix(project)
    text = (project.tree / "vllm/core.py").read_text()
    project.commit("vllm/core.py", text.replace("return 33\n", "return 34\n"), FIX)
    first, second = export.export(project.base)
    patch = project.base.patch_dir / second
    patch.write_text(patch.read_text().replace("-    return 33\n", "-    return 35\n"))
    with pytest.raises(ForkError) as error:
        materialize.build(project.base)
    assert f"patches/{BASE}/{second} no longer applies" in str(error.value)
    assert first not in str(error.value)


def test_check_flags_hand_edited_patch(project):
    materialize.ensure(project.base)
    _fix(project)
    [name] = export.export(project.base)
    patch = project.base.patch_dir / name
    patch.write_text(patch.read_text().replace("layer 3", "layer three"))
    [problem] = check.problems(project.base)
    assert name in problem


def test_check_flags_a_missing_series_and_unlisted_patches(project):
    materialize.ensure(project.base)
    _fix(project)
    [name] = export.export(project.base)
    series_file = project.base.patch_dir / "series"
    kept = series_file.read_text()
    series_file.unlink()
    assert check.problems(project.base) == [
        f"patches/{project.base.name}/series is missing, and 1 patch(es) are "
        f"there: {name}; restore it (git checkout) or write it, one patch per "
        "line in order"
    ]
    series_file.write_text(kept.replace(name, "# " + name))
    assert check.problems(project.base) == [
        f"patches/{project.base.name}/{name} is not listed in series; list it, "
        "or remove the file"
    ]


def test_check_flags_a_port_under_no_release_or_of_no_fix(project):
    materialize.ensure(project.base)
    _fix(project)
    [name] = export.export(project.base)
    fix = (project.base.patch_dir / name).read_text()
    ports = project.base.patch_dir / "ports"
    for place, text in [
        (f"9.9.10/{name}", fix),  # a good one
        (f"latest/{name}", fix),
        ("9.9.10/0009-Unknown.patch", fix),
        ("9.9.10/symptoms.toml", ""),  # its own symptoms: fine
        ("9.9.10/notes.txt", ""),
        (f"9.9.11/{name}", fix.replace("layer 3 return 33", "layer 3 right")),
    ]:
        (ports / place).parent.mkdir(parents=True, exist_ok=True)
        (ports / place).write_text(text)
    shown = f"patches/{project.base.name}/ports"
    assert check.problems(project.base) == [
        f"{shown}/9.9.10/notes.txt is neither a port (<the fix's patch file>) nor "
        "its symptoms.toml; remove it",
        f"{shown}/9.9.10/0009-Unknown.patch ports no fix of the {project.base.name} "
        "queue: name it as the fix's patch file",
        f"{shown}/9.9.11/{name}: its subject is not its fix's ({FIX!r}); a port "
        "keeps the fix's subject and message",
        f"{shown}/latest/{name}: latest is not a release version; a port goes in "
        f"patches/{project.base.name}/ports/<the release it was written on>/",
    ]


def test_check_flags_a_without_fix_diff_that_changes_tests_or_names_no_patch(
    project,
):
    materialize.ensure(project.base)
    _fix(project)
    [name] = export.export(project.base)
    verify = project.base.patch_dir / "verify"
    verify.mkdir()
    (verify / f"{name}.without-fix.diff").write_text(
        "--- a/tests/test_core.py\n+++ b/tests/test_core.py\n@@ -1 +1 @@\n-a\n+b\n"
    )
    (verify / "0009-Gone.patch.without-fix.diff").write_text(
        "--- a/vllm/core.py\n+++ b/vllm/core.py\n@@ -1 +1 @@\n-a\n+b\n"
    )
    where = f"patches/{project.base.name}/verify"
    assert check.problems(project.base) == [
        f"{where}/{name}.without-fix.diff changes tests (tests/test_core.py): it "
        "must put the bug back in the sources and leave the tests as the patch "
        "has them",
        f"{where}/0009-Gone.patch.without-fix.diff: series lists no "
        "0009-Gone.patch; rename the diff after the patch whose bug it puts "
        "back, or remove it",
    ]


def test_files_that_tests_leave_are_not_edits(project):
    materialize.ensure(project.base)
    for left in (".hypothesis/examples/ab/cd", "tests/.pytest_cache/v/x", "vllm/__pycache__/core.pyc"):
        (project.tree / left).parent.mkdir(parents=True, exist_ok=True)
        (project.tree / left).write_text("by-product\n")
    assert materialize.unexported(project.tree) == []
    (project.tree / "tests/test_new.py").write_text("def test_new():\n    pass\n")
    assert materialize.unexported(project.tree) == ["tests/test_new.py"]


def test_check_flags_unexported_edit(project):
    materialize.ensure(project.base)
    (project.tree / "vllm/core.py").write_text("edited\n")
    assert any("vllm/core.py" in p for p in check.problems(project.base))


def test_check_flags_patch_that_needs_another(project):
    materialize.ensure(project.base)
    _fix(project)
    text = (project.tree / "vllm/core.py").read_text()
    project.commit(
        "vllm/core.py", text.replace("return 33\n", "return 333\n"), "[Bugfix] Again"
    )
    names = export.export(project.base)
    [problem] = check.problems(project.base)
    assert names[1] in problem and "alone" in problem


def test_fixes_are_the_patches_that_change_vllm(project):
    materialize.ensure(project.base)
    project.commit("tests/test_core.py", "def test_layer():\n    assert 1\n", "[Test] A")
    _fix(project)
    names = export.export(project.base)
    assert [entry.name for entry in series.fixes(project.base)] == [names[1]]


def test_check_flags_a_fix_that_needs_a_test_patch_before_it(project):
    materialize.ensure(project.base)
    core = project.tree / "vllm/core.py"
    test = "def test_layer():\n    pass\n"

    def fix(old: str, new: str, assertion: str, message: str) -> None:
        core.write_text(core.read_text().replace(old, new))
        git(project.tree, "add", "vllm/core.py")
        project.commit("tests/test_core.py", test.replace("pass", assertion), message)

    fix("return 3\n", "return 33\n", "assert 1", "A")
    project.commit("tests/test_core.py", test, "[Test] Undo A's test")
    fix("return 4\n", "return 44\n", "assert 2", "B")
    names = export.export(project.base)
    problems = check.problems(project.base)
    # B applies alone; the test patch between the fixes does not, as said too.
    assert [p for p in problems if names[2] in p] == [
        f"patches/{BASE}/{names[2]}: does not apply on pristine {VERSION} after "
        "the fixes before it (make fixes), without the test patches: error: patch "
        "failed: tests/test_core.py:1\nerror: tests/test_core.py: patch does not "
        "apply"
    ]


def test_repin_rebuilds_the_tree_and_changes_the_version(project):
    materialize.ensure(project.base)
    before = materialize.version(project.base)
    _wheel(project.wheel, {**WHEEL_FILES, "vllm/_C.abi3.so": "\x7fELF rebuilt"})
    project.pin()
    assert materialize.version(project.base) != before
    tree = materialize.ensure(project.base)
    assert (tree / "vllm/_C.abi3.so").read_text() == "\x7fELF rebuilt"
    version = materialize.version(project.base)
    assert repr(version) in (tree / "vllm/_version.py").read_text()


def _as_built_before_the_pull(project):
    """The tree and its state as they were before ``patches/`` changed."""
    state = (project.tree / ".git" / materialize.STATE).read_text()
    return lambda: (
        git(project.tree, "reset", "-q", "--hard", "base"),
        (project.tree / ".git" / materialize.STATE).write_text(state),
    )


def test_export_refuses_to_drop_an_incoming_patch_and_names_it(project):
    materialize.ensure(project.base)
    back_before_the_pull = _as_built_before_the_pull(project)
    _fix(project)
    [name] = export.export(project.base)
    back_before_the_pull()

    with pytest.raises(ForkError) as error:
        export.export(project.base)
    assert f"patches/{BASE}/{name} (new)" in str(error.value)
    assert f"make fork BASE={BASE}" in str(error.value)
    assert [entry.name for entry in series.entries(project.base)] == [name]


def test_export_names_how_to_carry_own_commits_over_an_incoming_patch(project):
    materialize.ensure(project.base)
    back_before_the_pull = _as_built_before_the_pull(project)
    _fix(project)
    [name] = export.export(project.base)
    back_before_the_pull()
    text = (project.tree / "vllm/core.py").read_text()
    project.commit("vllm/core.py", text.replace("return 7\n", "return 77\n"), "[X] y")

    with pytest.raises(ForkError, match=name) as error:
        export.export(project.base)
    assert "format-patch" in str(error.value) and "git -C" in str(error.value)
    assert [entry.name for entry in series.entries(project.base)] == [name]


def test_export_of_a_tree_recorded_by_older_tooling(project):
    materialize.ensure(project.base)
    _fix(project)
    export.export(project.base)
    state_file = project.tree / ".git" / materialize.STATE
    head = git(project.tree, "rev-parse", "HEAD").strip()
    legacy = {"queue": series.patches_id(project.base), "head": head}
    state_file.write_text(json.dumps(legacy))
    text = (project.tree / "vllm/core.py").read_text()
    project.commit("vllm/core.py", text.replace("return 7\n", "return 77\n"), "[X] y")
    assert len(export.export(project.base)) == 2

    state_file.write_text(json.dumps({**legacy, "queue": "0123456789"}))
    git(project.tree, "reset", "-q", "--hard", "HEAD~2")
    with pytest.raises(ForkError, match="0002-X-y.patch"):
        export.export(project.base)
