import platform
import subprocess
import sys
from pathlib import Path

import pytest

from forktools import cli
from forktools.queue import export, materialize
from forktools.shipping import pr
from forktools.environments import venv
from forktools.proof import ledger, verify
from forktools.queue.pins import ForkError

from forktools.tests.conftest import CORE, git, publish, sha256

FORK_SIGN_OFF = "Signed-off-by: Test Author <author@example.com>"
MESSAGE = """[Bugfix][Core] Make layer 3 return 33

Layer 3 returned 3, which broke everything downstream.

Upstream status: not upstream.

Upstream-Status: Pending [issue 1]
Co-authored-by: Grace Hopper <grace@navy.mil>"""
ADA = "Ada Lovelace <ada@lovelace.dev>"


def _queue_of_one(project, test: str = "") -> str:
    materialize.ensure(project.base)
    if test:
        (project.tree / "tests/test_layer_3.py").write_text(test)
        git(project.tree, "add", "tests/test_layer_3.py")
    text = (project.tree / "vllm/core.py").read_text()
    project.commit("vllm/core.py", text.replace("return 3\n", "return 33\n"), MESSAGE)
    [name] = export.export(project.base)
    return name


@pytest.fixture
def identity(tmp_path, monkeypatch):
    """Point git at a global config of the test's own; returns its path."""
    config = tmp_path / "gitconfig"
    config.write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    return config


def _set(config, name: str, email: str) -> None:
    config.write_text(f"[user]\n\tname = {name}\n\temail = {email}\n")


def _git(tree, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(tree), *args], check=True, capture_output=True, text=True
    ).stdout


def test_pr_body_comes_from_message_and_quotes_the_ledger_row(project, monkeypatch):
    monkeypatch.setattr(venv, "ensure", lambda base: Path(sys.executable))
    monkeypatch.setattr(venv, "ensure_engine", lambda base: None)
    test = "def test_layer_3():\n    from vllm import core\n\n    assert core.layer_3() == 33\n"
    _queue_of_one(project, test)
    (project.base.patch_dir / "symptoms.toml").write_text(
        '["tests/test_layer_3.py::test_layer_3"]\n'
        'exception = "AssertionError"\nmessage = "assert 3 == 33"\n'
    )
    assert verify.main([project.base], audit=0) == 0
    proof = ledger.load(project.base).proofs[export.export(project.base)[0]]
    assert pr.title(project.base, 1) == "[Bugfix][Core] Make layer 3 return 33"
    text = pr.body(project.base, 1)
    assert text.startswith("## Purpose\n\nLayer 3 returned 3")
    assert "Upstream status" not in text
    assert "The fork's evidence, on vLLM 9.9.9 (CPU) with its whole patch queue" in text
    assert "Signed-off-by" not in text and "Upstream-Status" not in text
    assert "    tests/test_layer_3.py::test_layer_3" in text
    assert f"key `{proof.key}`, proved {proof.proved}" in text
    assert "- with the fix: 1/1 passed\n- without it: 1/1 failed (AssertionError)" in text
    assert "- `tests/test_layer_3.py::test_layer_3`: AssertionError: assert 3 == 33" in text


def test_pr_body_without_verify_row_says_to_run_it(project):
    _queue_of_one(project)
    text = pr.body(project.base, 1)
    assert f"run `make verify BASE={project.base.name}`, then `make pr`" in text
    with pytest.raises(ForkError, match="no #2"):
        pr.body(project.base, 2)


def test_submission_is_signed_off_by_the_submitter_and_applies(
    project, identity, tmp_path, capsys
):
    _set(identity, "Ada Lovelace", "ada@lovelace.dev")
    name = _queue_of_one(project)
    assert cli.main(["pr", "--base", project.base.name, "--patch", "1"]) == 0
    directory = project.root / "pr" / project.base.name / name.removesuffix(".patch")
    [patch] = directory.glob("*.patch")
    assert (directory / "PR.md").read_text().startswith("## Purpose")
    clone = tmp_path / "upstream-clone"
    _git(materialize.pristine(project.base), "clone", "-q", ".", str(clone))
    _git(clone, "am", "--keep-non-patch", str(patch))
    message = _git(clone, "log", "-1", "--format=%B").strip()
    assert message.startswith("[Bugfix][Core] Make layer 3 return 33\n")
    assert message.endswith(
        f"downstream.\n\n"
        f"Co-authored-by: Grace Hopper <grace@navy.mil>\nSigned-off-by: {ADA}"
    )
    assert _git(clone, "log", "-1", "--format=%an <%ae>|%cn <%ce>").strip() == (
        f"{ADA}|{ADA}"
    )
    assert "return 33" in (clone / "vllm/core.py").read_text()
    branch = f"pr/{name.removesuffix('.patch')}"
    assert _git(project.tree, "rev-parse", f"{branch}^") == _git(
        project.tree, "rev-parse", "base"
    )
    out = capsys.readouterr().out
    assert f"signed off by {ADA}" in out
    assert f"newest pinned release: {project.base.name} is the newest" in out
    assert "gh pr create --title '[Bugfix][Core] Make layer 3 return 33'" in out


def test_pr_runs_the_patchs_tests_alone_on_pristine_without_the_harness(
    project, identity, monkeypatch, capsys
):
    _set(identity, "Ada Lovelace", "ada@lovelace.dev")
    monkeypatch.setattr(venv, "ensure", lambda base: Path(sys.executable))
    test = (
        "import os\n\n\ndef test_layer_3():\n    from vllm import core\n\n"
        "    assert 'harness' not in os.environ['PYTHONPATH']\n"
        "    assert core.layer_3() == 33\n"
    )
    name = _queue_of_one(project, test)
    assert cli.main(["pr", "--base", project.base.name, "--patch", "1"]) == 0
    directory = project.root / "pr" / project.base.name / name.removesuffix(".patch")
    text = (directory / "PR.md").read_text()
    assert (
        "On pristine vLLM 9.9.9 with only this patch applied, on CPU" in text
        and "- with the patch: 1/1 passed\n" in text
        and "- its tests without its fix: 1/1 failed (AssertionError)\n" in text
    ), text
    out = capsys.readouterr().out
    assert "alone on pristine v9.9.9: with the patch 1/1 passed; its tests" in out


def test_fork_sign_off_and_status_stay_out_of_the_submission():
    body = f"Why.\n\nUpstream-Status: Pending [issue 1]\n{FORK_SIGN_OFF}\n"
    who = pr.Identity("Ada Lovelace", "ada@lovelace.dev")
    assert pr.submission_message("[Bugfix] X", body, who) == (
        f"[Bugfix] X\n\nWhy.\n\nSigned-off-by: {ADA}\n"
    )


@pytest.mark.parametrize(
    ("name", "email", "says"),
    [
        ("", "", "no git identity (user.name, user.email); set your identity: "),
        ("Ada", "", "no git identity"),
        ("Group", "team@users.noreply.fork.example", "at a made-up domain"),
        ("Group", "team@example.com", "at a made-up domain"),
    ],
    ids=["unset", "no-email", "noreply-example", "example.com"],
)
def test_pr_refuses_without_a_real_identity(project, identity, name, email, says):
    if name or email:
        _set(identity, name, email)
    _queue_of_one(project)
    with pytest.raises(ForkError) as refused:
        pr.prepare(project.base, 1)
    assert says in str(refused.value)
    assert "set your identity: git config --global user.name" in str(refused.value)
    assert not (project.root / "pr").exists()


@pytest.mark.parametrize(
    ("status", "said"),
    [
        ("Inappropriate [fork-only coverage of layer 3]", "is not for upstream"),
        (
            "Backport [PR 7, first released in v10.0.0]",
            "is a backport of what upstream already has (Backport [PR 7, first "
            "released in v10.0.0]): there is nothing to submit",
        ),
    ],
)
def test_pr_refuses_fork_only_and_backport_patches(project, identity, status, said):
    _set(identity, "Ada Lovelace", "ada@lovelace.dev")
    materialize.ensure(project.base)
    message = MESSAGE.replace("Pending [issue 1]", status)
    project.commit("tests/test_core.py", "def test_core():\n    pass\n", message)
    [name] = export.export(project.base)

    with pytest.raises(ForkError) as refused:
        pr.prepare(project.base, 1)

    assert f"patches/{project.base.name}/{name} {said}" in str(refused.value)
    assert not (project.root / "pr").exists()


def _pin_newer(project, version: str, core: str) -> str:
    """Publish vLLM ``version`` with ``core`` and pin it beside the base."""
    publish(project.index, version, core)
    sdist = project.index / f"vllm-{version}.tar.gz"
    wheel = (
        project.index
        / f"vllm-{version}-py3-none-manylinux_2_17_{platform.machine()}.whl"
    )
    with open(project.root / "upstream.toml", "a") as pins_file:
        pins_file.write(
            f'[bases."v{version}"]\nversion = "{version}"\n'
            f'sdist = {{ file = "{sdist.name}", sha256 = "{sha256(sdist)}" }}\n'
            f'wheels = [{{ file = "{wheel.name}", sha256 = "{sha256(wheel)}" }}]\n'
        )
    return f"v{version}"


@pytest.mark.parametrize(
    ("core", "says"),
    [
        (CORE, "applies to v9.9.10 as is"),
        ("# moved\n\n" + CORE, "applies to v9.9.10 with offsets (1 hunk(s) moved)"),
        (CORE.replace("return 3\n", "return 30\n"), "does not apply to v9.9.10"),
    ],
    ids=["as-is", "offsets", "conflict"],
)
def test_pr_says_whether_the_patch_applies_to_the_newest_release(project, core, says):
    name = _queue_of_one(project)
    _pin_newer(project, "9.9.10", core)
    verdict = pr.applies_to_newest(project.base, project.base.patch_dir / name)
    assert verdict.startswith(says)
    if says.startswith("does not"):
        assert verdict.endswith("(vllm/core.py)")


def test_a_real_author_keeps_authorship_and_is_told_to_sign_off(
    project, identity, capsys
):
    _set(identity, "Ada Lovelace", "ada@lovelace.dev")
    materialize.ensure(project.base)
    core = (
        (project.tree / "vllm/core.py").read_text().replace("return 3\n", "return 4\n")
    )
    (project.tree / "vllm/core.py").write_text(core)
    grace = "Grace Hopper <grace@navy.mil>"
    git(project.tree, "commit", "-qam", MESSAGE, "--author", grace)
    export.export(project.base)
    assert pr.main(project.base, 1) == 0
    out = capsys.readouterr().out
    assert f"note: the author, {grace}, has not signed off; DCO needs theirs" in out


LAYER_3_TEST = (
    "def test_layer_3():\n    from vllm import core\n\n    assert core.layer_3() == 33\n"
)


def _upstream_checkout(project, tmp_path, core: str) -> Path:
    """A stand-in for the user's upstream checkout: a newer release's tree."""
    newer = _pin_newer(project, "9.9.10", core)
    from forktools.queue import pins

    checkout = tmp_path / "vllm-main"
    pristine = materialize.pristine(pins.load().get(newer))
    _git(pristine, "clone", "-q", ".", str(checkout))
    # What an installed checkout's build leaves beside its sources.
    (checkout / "vllm/_version.py").write_text("__version__ = '9.9.10'\n")
    return checkout


def _onto(project, checkout: Path, *python: str) -> int:
    return cli.main(
        ["pr", "--base", project.base.name, "--patch", "1", "--onto", str(checkout)]
        + [*(["--python", *python] if python else [])]
    )


def test_pr_onto_applies_on_a_branch_runs_the_tests_there_and_says_so(
    project, identity, monkeypatch, tmp_path, capsys
):
    _set(identity, "Ada Lovelace", "ada@lovelace.dev")
    monkeypatch.setattr(venv, "ensure", lambda base: Path(sys.executable))
    name = _queue_of_one(project, LAYER_3_TEST)
    checkout = _upstream_checkout(project, tmp_path, "# moved\n\n" + CORE)
    head = _git(checkout, "rev-parse", "HEAD").strip()

    assert _onto(project, checkout, sys.executable) == 0

    stem = name.removesuffix(".patch")
    branch = f"vllm-fork/{stem.split('-', 1)[1]}"
    assert _git(checkout, "branch", "--show-current").strip() == branch
    assert _git(checkout, "rev-parse", f"{branch}~1").strip() == head
    assert "return 33" in (checkout / "vllm/core.py").read_text()
    assert _git(checkout, "status", "--porcelain", "--untracked-files=no") == ""
    text = (project.root / "pr" / project.base.name / stem / "PR.md").read_text()
    subject = _git(checkout, "log", "-1", "--format=%s", head).strip()
    assert f"Rebased onto upstream commit `{head[:12]} {subject}` (branch `{branch}`" in text
    assert "1 blob(s) of the release brought in" in text
    assert "- its tests there, on CPU (`VLLM_TARGET_DEVICE=cpu`): 1/1 passed" in text
    assert "checks of that commit (none: the checkout has no .pre-commit-config" in text
    out = capsys.readouterr().out
    assert f"{checkout}: branch {branch}, onto {head[:12]}" in out


def test_pr_onto_without_python_says_the_tests_did_not_run(
    project, identity, monkeypatch, tmp_path
):
    _set(identity, "Ada Lovelace", "ada@lovelace.dev")
    monkeypatch.setattr(venv, "ensure", lambda base: Path(sys.executable))
    name = _queue_of_one(project, LAYER_3_TEST)
    checkout = _upstream_checkout(project, tmp_path, CORE)
    assert _onto(project, checkout) == 0
    stem = name.removesuffix(".patch")
    text = (project.root / "pr" / project.base.name / stem / "PR.md").read_text()
    assert "- its tests: not run on that commit" in text
    assert "blob(s)" not in text  # the release's own blob was there


def test_pr_onto_a_competing_change_stops_naming_file_lines_and_commands(
    project, identity, monkeypatch, tmp_path
):
    _set(identity, "Ada Lovelace", "ada@lovelace.dev")
    monkeypatch.setattr(venv, "ensure", lambda base: Path(sys.executable))
    _queue_of_one(project)
    checkout = _upstream_checkout(project, tmp_path, CORE.replace("return 3\n", "return 30\n"))
    before = _git(checkout, "for-each-ref").strip()
    mine = _git(checkout, "branch", "--show-current").strip()

    with pytest.raises(ForkError) as stopped:
        pr.prepare(project.base, 1, checkout)

    said = str(stopped.value)
    name = export.export(project.base)[0]
    assert said.startswith(f"patches/{project.base.name}/{name} does not apply onto ")
    assert "three-way" in said
    assert "  vllm/core.py: conflict at lines 14-18 (the patch's @@ -" in said
    assert "git add vllm/core.py && git am --continue" in said
    assert f"To give up: git am --abort && git switch {mine} && git branch -D " in said
    refs = _git(checkout, "for-each-ref").strip()
    assert refs.replace(before, "").count("refs/heads/vllm-fork/") == 1  # the new one
    _git(checkout, "am", "--abort")
    _git(checkout, "switch", "-q", mine)
    assert _git(checkout, "status", "--porcelain", "--untracked-files=no") == ""


def test_pr_onto_goes_on_from_a_conflict_finished_by_hand(
    project, identity, monkeypatch, tmp_path
):
    _set(identity, "Ada Lovelace", "ada@lovelace.dev")
    monkeypatch.setattr(venv, "ensure", lambda base: Path(sys.executable))
    name = _queue_of_one(project, LAYER_3_TEST)
    core = CORE.replace("return 3\n", "return 30\n")
    checkout = _upstream_checkout(project, tmp_path, core)
    with pytest.raises(ForkError, match="does not apply onto"):
        pr.prepare(project.base, 1, checkout)
    with pytest.raises(ForkError, match=r"a git operation is in progress \(rebase-apply\)"):
        pr.prepare(project.base, 1, checkout)

    (checkout / "vllm/core.py").write_text(CORE.replace("return 3\n", "return 33\n"))
    _git(checkout, "add", "vllm/core.py")
    _git(checkout, "-c", "core.editor=true", "am", "--continue")
    done = pr.prepare(project.base, 1, checkout, Path(sys.executable))

    assert done.onto is not None and done.onto.tests is not None
    assert done.onto.tests.passed == 1 and done.onto.brought == 0
    assert done.onto.upstream.endswith("vLLM 9.9.10 (vllm-9.9.10.tar.gz)")
    stem = name.removesuffix(".patch")
    text = (project.root / "pr" / project.base.name / stem / "PR.md").read_text()
    assert "Rebased onto upstream commit" in text


def test_pr_onto_refuses_a_checkout_with_changes_and_touches_nothing(
    project, identity, monkeypatch, tmp_path
):
    _set(identity, "Ada Lovelace", "ada@lovelace.dev")
    monkeypatch.setattr(venv, "ensure", lambda base: Path(sys.executable))
    _queue_of_one(project)
    checkout = _upstream_checkout(project, tmp_path, CORE)
    (checkout / "vllm/core.py").write_text("mine\n")
    with pytest.raises(ForkError, match=r"has uncommitted changes \(vllm/core.py\)"):
        pr.prepare(project.base, 1, checkout)
    assert (checkout / "vllm/core.py").read_text() == "mine\n"
    assert _git(checkout, "branch", "--show-current").strip() == "fork"
    with pytest.raises(ForkError, match="not a git checkout"):
        pr.prepare(project.base, 1, tmp_path / "nowhere")


def test_pr_onto_reports_what_the_checkouts_own_checks_find(
    project, identity, monkeypatch, tmp_path, capsys
):
    from forktools.shipping import precommit

    _set(identity, "Ada Lovelace", "ada@lovelace.dev")
    monkeypatch.setattr(venv, "ensure", lambda base: Path(sys.executable))
    seen = []

    def checks(scratch, before, after, files, work):
        seen.append((before, after, files))
        hooks = precommit.Hooks(None, "typos==1", (), (), (), "", None)
        return hooks, ["typos: vllm/core.py:7: `teh` should be the"]

    monkeypatch.setattr(precommit, "commit_problems", checks)
    name = _queue_of_one(project)
    checkout = _upstream_checkout(project, tmp_path, CORE)
    (checkout / ".pre-commit-config.yaml").write_text("repos: []\n")
    _git(checkout, "add", ".pre-commit-config.yaml")
    _git(checkout, "-c", "user.name=U", "-c", "user.email=u@u.dev", "commit", "-qm", "c")

    assert _onto(project, checkout) == 1

    [(before, after, files)] = seen
    assert files == ["vllm/core.py"]
    assert _git(checkout, "rev-parse", "HEAD~1").strip() == before
    stem = name.removesuffix(".patch")
    text = (project.root / "pr" / project.base.name / stem / "PR.md").read_text()
    assert "checks of that commit (typos) on the changed files: 1 new problem(s):" in text
    assert "  - typos: vllm/core.py:7: `teh` should be the" in text
    assert "upstream checks (typos): 1 new problem(s)" in capsys.readouterr().out


def test_pr_refuses_a_fork_only_patch_before_asking_who_you_are(project, identity):
    materialize.ensure(project.base)
    message = MESSAGE.replace("Pending [issue 1]", "Inappropriate [fork-only]")
    project.commit("tests/test_core.py", "def test_core():\n    pass\n", message)
    export.export(project.base)
    with pytest.raises(ForkError, match="is not for upstream"):
        pr.prepare(project.base, 1)
