"""``make status``: upstream status from the trailers, and newer releases."""

import shutil

from forktools import cli
from forktools.queue import export, materialize, pins, series, status

from forktools.tests.conftest import BASE
from .test_rebase import NEW, _queue, rebase_onto_release_with_fix_1


def test_status_reads_trailers_and_checks_newer_releases(project):
    rebase_onto_release_with_fix_1(project)
    pinned = pins.load()
    newer = pinned.get(f"v{NEW}")
    shutil.rmtree(materialize.pristine_path(newer), ignore_errors=True)
    table = status.rows(pinned.newest_first(), pinned)
    # What the new queue carries is known from the committed queues alone.
    assert [row[5] for row in table[2:4]] == [
        f"v{NEW}: {status.NOT_HERE}",
        f"v{NEW}: carried",
    ]
    assert materialize.pristine_here(newer) is None  # nothing fetched

    header, first, second, newer_row = status.rows(
        pinned.newest_first(), pinned, fetch=True
    )[:4]
    assert header == status.HEADER
    assert first[0] == f"v{NEW}" and first[4] == "Pending [issue 1]"
    assert first[5] == "-"
    assert second[0] == BASE
    assert second[5] == f"v{NEW}: in (reverse-applies)"
    assert newer_row[5] == f"v{NEW}: carried"


def _fork_only(subject: str) -> str:
    return (
        f"{subject}\n\nWhy.\n\nUpstream-Status: Inappropriate [fork-only]\n"
        "Signed-off-by: A <a@example.com>"
    )


def test_a_newer_queue_leaves_a_fork_only_test_out_but_never_a_fix(project):
    rebase_onto_release_with_fix_1(project)
    test = "def test_fork():\n    pass\n"
    project.commit("tests/test_fork.py", test, _fork_only("[Test] Fork-only: engine"))
    core = (project.tree / "vllm/core.py").read_text()
    project.commit("vllm/core.py", core.replace("return 5\n", "return 55\n"), "[Bugfix] Late")
    export.export(project.base)
    pinned = pins.load()
    cells = [row[5] for row in status.rows([project.base], pinned, fetch=True)[1:]]
    assert cells[2:] == [f"v{NEW}: not carried", f"v{NEW}: {status.NEEDED}"]


def test_one_base_fits_80_columns(project, capsys):
    rebase_onto_release_with_fix_1(project)
    long = "[Bugfix][Core] " + "a very long subject " * 8
    core = (project.tree / "vllm/core.py").read_text()
    project.commit("vllm/core.py", core.replace("return 5\n", "return 55\n"), long)
    export.export(project.base)
    text = status.narrow(project.base, pins.load(), fetch=True, width=80)
    lines = text.splitlines()
    assert lines[0] == f"{BASE} (the default): 3 patches, 3 fixes (make fixes BASE={BASE}), 0 tests"
    assert lines[1].split() == ["#", "kind:", "upstream", f"v{NEW}", "subject"]
    assert lines[2].split()[:4] == ["1", "fix:", "Pending", "in"]
    assert lines[4].split()[3:6] == ["NEEDED", "a", "very"]
    assert lines[4].endswith("…")
    assert max(map(len, lines)) == 80

    assert cli.main(["status"]) == 0  # the default base alone
    said = capsys.readouterr().out
    assert said.startswith(f"{BASE} (the default): 3 patches") and f"\nv{NEW}" not in said


def test_wide_shows_every_base(project, capsys):
    rebase_onto_release_with_fix_1(project)
    assert cli.main(["status", "--wide"]) == 0
    table = capsys.readouterr().out
    assert table.startswith("base ") and f"\n{BASE} " in table and f"\nv{NEW} " in table


def test_missing_trailer_shows_in_status(project):
    _queue(project, ("vllm/core.py", "return 3\n", "return 33\n"))
    patch = project.base.patch_dir / series.entries(project.base)[0].name
    patch.write_text(patch.read_text().replace("Upstream-Status", "Upstream-State"))
    pinned = pins.load()
    [_, row] = status.rows([project.base], pinned)
    assert row[4] == "MISSING (see make lint)"
