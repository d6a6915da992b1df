"""``make status``: upstream status from the trailers, and newer releases."""

import shutil

from forktools import materialize, pins, queue, status

from .conftest import BASE
from .test_rebase import NEW, _queue, rebase_onto_release_with_fix_1


def test_status_reads_trailers_and_checks_newer_releases(project):
    rebase_onto_release_with_fix_1(project)
    pinned = pins.load()
    newer = pinned.get(f"v{NEW}")
    shutil.rmtree(materialize.pristine_path(newer), ignore_errors=True)
    table = status.rows(pinned.newest_first(), pinned)
    assert [row[5] for row in table[2:4]] == [f"v{NEW}: {status.NOT_HERE}"] * 2
    assert materialize.pristine_here(newer) is None  # nothing fetched

    header, first, second, newer_row = status.rows(
        pinned.newest_first(), pinned, fetch=True
    )[:4]
    assert header == status.HEADER
    assert first[0] == f"v{NEW}" and first[4] == "Pending [issue 1]"
    assert first[5] == "-"
    assert second[0] == BASE
    assert second[5] == f"v{NEW}: in (reverse-applies)"
    assert newer_row[5] == f"v{NEW}: needed"


def test_missing_trailer_shows_in_status(project):
    _queue(project, ("vllm/core.py", "return 3\n", "return 33\n"))
    patch = project.base.patch_dir / queue.entries(project.base)[0].name
    patch.write_text(patch.read_text().replace("Upstream-Status", "Upstream-State"))
    pinned = pins.load()
    [_, row] = status.rows([project.base], pinned)
    assert row[4] == "MISSING (see make lint)"
