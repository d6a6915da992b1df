from forktools import export, lint, materialize, queue


def _one_patch(project, message):
    materialize.ensure(project.base)
    (project.tree / "vllm/new.py").write_text(
        "# SPDX-License-Identifier: Apache-2.0\nVALUE = 1\n"
    )
    (project.tree / "vllm/core.py").write_text("X = 1\n")
    from .conftest import git

    git(project.tree, "add", "-A")
    git(project.tree, "commit", "-q", "-m", message)
    [name] = export.export(project.base)
    [entry] = queue.entries(project.base)
    return project.base.patch_dir / name, entry.subject(project.base)


def test_signed_vllm_style_patch_is_clean(project):
    message = "[Bugfix][Core] Fix it\n\nSigned-off-by: A <a@example.com>"
    patch, subject = _one_patch(project, message)
    assert lint.patch_problems(patch, subject) == []


def test_patch_without_sign_off_fails(project):
    patch, subject = _one_patch(project, "[Bugfix][Core] Fix it")
    [problem] = lint.patch_problems(patch, subject)
    assert "Signed-off-by" in problem


def test_patch_with_plain_subject_fails(project):
    patch, subject = _one_patch(project, "fix it\n\nSigned-off-by: A <a@example.com>")
    [problem] = lint.patch_problems(patch, subject)
    assert "vLLM style" in problem


def test_new_python_file_needs_spdx(project):
    message = "[Bugfix][Core] Fix it\n\nSigned-off-by: A <a@example.com>"
    patch, subject = _one_patch(project, message)
    patch.write_text(patch.read_text().replace("+# SPDX-License-Identifier", "+# Lic"))
    [problem] = lint.patch_problems(patch, subject)
    assert "vllm/new.py" in problem
