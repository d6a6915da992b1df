import pytest

from forktools.queue import export, materialize, series, upstream
from forktools.shipping import lint

SIGNED = "Signed-off-by: A <a@example.com>"
STATUS = "Upstream-Status: Backport [PR 40627, first released in v0.20.0]"


def _one_patch(project, message):
    materialize.ensure(project.base)
    (project.tree / "vllm/new.py").write_text(
        "# SPDX-License-Identifier: Apache-2.0\nVALUE = 1\n"
    )
    (project.tree / "vllm/core.py").write_text("X = 1\n")
    from forktools.tests.conftest import git

    git(project.tree, "add", "-A")
    git(project.tree, "commit", "-q", "-m", message)
    [name] = export.export(project.base)
    [entry] = series.entries(project.base)
    return project.base.patch_dir / name, entry.subject(project.base)


def test_signed_vllm_style_patch_is_clean(project):
    message = f"[Bugfix][Core] Fix it\n\n{STATUS}\n{SIGNED}"
    patch, subject = _one_patch(project, message)
    assert lint.patch_problems(patch, subject) == []


def test_patch_without_sign_off_fails(project):
    patch, subject = _one_patch(project, f"[Bugfix][Core] Fix it\n\n{STATUS}")
    [problem] = lint.patch_problems(patch, subject)
    assert "Signed-off-by" in problem


def test_patch_with_plain_subject_fails(project):
    patch, subject = _one_patch(project, f"fix it\n\n{STATUS}\n{SIGNED}")
    [problem] = lint.patch_problems(patch, subject)
    assert "vLLM style" in problem


def test_new_python_file_needs_spdx(project):
    message = f"[Bugfix][Core] Fix it\n\n{STATUS}\n{SIGNED}"
    patch, subject = _one_patch(project, message)
    patch.write_text(patch.read_text().replace("+# SPDX-License-Identifier", "+# Lic"))
    [problem] = lint.patch_problems(patch, subject)
    assert "vllm/new.py" in problem


@pytest.mark.parametrize(
    ("trailers", "says"),
    [
        ("", "no Upstream-Status: trailer"),
        ("Upstream-Status: Backport PR 1", "malformed Upstream-Status"),
        ("Upstream-Status: Merged [PR 1]", "unknown Upstream-Status kind 'Merged'"),
        ("Upstream-Status: Backport [PR 1]", "must name PR <n>, first released in"),
        ("Upstream-Status: Test-only [no test]", "must name fix in PR <n>"),
        (f"{STATUS}\n{STATUS}", "2 Upstream-Status: trailers"),
    ],
)
def test_missing_or_malformed_upstream_status_fails(project, trailers, says):
    message = f"[Bugfix][Core] Fix it\n\n{trailers}\n{SIGNED}".replace("\n\n\n", "\n\n")
    patch, subject = _one_patch(project, message)
    [problem] = lint.patch_problems(patch, subject)
    assert says in problem


def test_a_backport_whose_pr_is_not_identified_names_its_release(project):
    status = (
        "Upstream-Status: Backport [PR not identified: v0.34.0's code has it, "
        "first released in v0.34.0]"
    )
    message = f"[Bugfix][Core] Fix it\n\n{status}\n{SIGNED}"
    patch, subject = _one_patch(project, message)
    assert lint.patch_problems(patch, subject) == []
    assert upstream.read(upstream.message_of(patch.read_text())).released_in == "0.34.0"


def test_upstream_status_in_the_body_is_not_a_trailer(project):
    message = f"[Bugfix][Core] Fix it\n\n{STATUS}\n\nMore words.\n\n{SIGNED}"
    patch, subject = _one_patch(project, message)
    [problem] = lint.patch_problems(patch, subject)
    assert "in the body, not in the closing trailer block" in problem


def test_lint_names_the_patch_without_status(project, monkeypatch):
    patch, _ = _one_patch(project, f"[Bugfix][Core] Fix it\n\n{SIGNED}")
    monkeypatch.setattr(lint, "_ruff", lambda *args: [])
    [problem] = lint.queue_problems(project.base)
    assert problem.startswith(f"patches/{project.base.name}/{patch.name}: no Upstream")


def test_the_layering_holds_and_an_upward_import_breaks_it(tmp_path):
    from forktools.tests.conftest import copy_tooling

    assert lint.layering() == []
    copy_tooling(tmp_path, "pyproject.toml")
    pins = tmp_path / "forktools" / "queue" / "pins.py"
    pins.write_text(pins.read_text() + "\nfrom forktools.shipping import wheel\n")
    bench = tmp_path / "forktools" / "engine" / "bench.py"
    bench.write_text(bench.read_text() + "\nfrom forktools.proof import ledger\n")
    [problem] = lint.layering(tmp_path)
    assert "forktools.queue is not allowed to import forktools.shipping" in problem
    assert "forktools.queue.pins -> forktools.shipping.wheel" in problem
    assert "forktools.engine.bench -> forktools.proof.ledger" in problem
