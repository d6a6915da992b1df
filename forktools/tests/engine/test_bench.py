"""``make bench``'s bookkeeping: which figures run, which rows are kept, and
how a fleet's replicas are counted (no benchmark is run here)."""

import pytest

from forktools.engine import bench
from forktools.engine.bench import Row
from forktools.queue.pins import ForkError

OLD_TABLE = """# Benchmarks

Written by `make bench` on 2026-12-04 17:16 UTC (x86_64, 2 CPUs, load average
1.1 at the start).

| # | figure | base | measured | goal | holds |
|---|---|---|---|---|---|
| 1 | key factor | v0.33.0 | 0.006 | <= 0.10 | yes |
| 7 | fleet | v0.33.0 | old fleet | 4/4 | NO |

## How each figure is measured

| 3 | not a figure row | x | y | z | w |
"""


def _figure(number: int, measured: str, holds: str = "yes"):
    def figure(bases):
        return [
            Row(number, f"figure {number}", b.name, measured, "g", holds) for b in bases
        ]

    figure.__doc__ = f"Figure {number}."
    return figure


class _Base:
    name = "v0.33.0"


def test_earlier_rows_of_the_old_table_take_its_date():
    rows = bench.earlier_rows(OLD_TABLE)

    assert [(row.number, row.measured) for row in rows] == [
        (1, "0.006"),
        (7, "old fleet"),
    ]
    assert {row.when for row in rows} == {"2026-12-04 17:16 (load 1.1)"}


def test_a_named_figure_is_measured_and_the_other_rows_are_kept(tmp_path, monkeypatch):
    fleet, other = _figure(7, "new fleet"), _figure(1, "remeasured")
    fleet.__name__, other.__name__ = "fleet", "aot_key_cost"
    monkeypatch.setattr(bench, "FIGURES", [other, fleet])
    monkeypatch.setattr(bench, "BENCH_FILE", tmp_path / "BENCHMARKS.md")
    monkeypatch.setattr(bench, "_fault_matrix", lambda: "")
    bench.BENCH_FILE.write_text(OLD_TABLE)

    assert bench.main([_Base()], ["fleet"]) == 0

    rows = bench.earlier_rows(bench.BENCH_FILE.read_text())
    assert [(row.number, row.measured) for row in rows] == [
        (1, "0.006"),
        (7, "new fleet"),
    ]
    assert rows[0].when == "2026-12-04 17:16 (load 1.1)"
    assert rows[1].when != rows[0].when


def test_only_the_figures_measured_decide_the_exit_status(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "BENCH_FILE", tmp_path / "BENCHMARKS.md")
    monkeypatch.setattr(bench, "_fault_matrix", lambda: "")
    bench.BENCH_FILE.write_text(OLD_TABLE)
    for holds, status in (("yes", 0), ("NO", 1)):
        key_cost = _figure(1, "remeasured", holds)
        key_cost.__name__ = "aot_key_cost"
        monkeypatch.setattr(bench, "FIGURES", [key_cost])

        assert bench.main([_Base()], ["aot_key_cost"]) == status
        assert "| 7 | fleet | v0.33.0 | old fleet | 4/4 | NO |" in (
            bench.BENCH_FILE.read_text()
        )


def test_an_unknown_figure_is_named_with_the_known_ones():
    with pytest.raises(
        ForkError, match="no figure named flet; the figures are .*fleet"
    ):
        bench.selected(["flet"])


def _writer(saved=1, warnings=(), timed_out=()):
    return {
        "correct": True,
        "aot_artifacts_saved": saved,
        "warnings": list(warnings),
        "barrier_timed_out": list(timed_out),
    }


def test_fleet_counts_crashed_and_warned_writers_and_cold_readers():
    lost = "unable to save AOT compiled function to model: model.1.tmp -> model"
    run = {
        "writer": [_writer(), _writer(0, [lost]), {"error": "FileNotFoundError: x"}],
        "reader": [
            {"correct": True, "loaded_from_disk": True, "warnings": []},
            {"correct": True, "loaded_from_disk": False, "warnings": []},
        ],
        "tmp_left": ["model.1.tmp"],
    }

    assert bench._fleet_counts(run) == (2, 1, 1, 1)
    text = bench._fleet_text("pristine", run)
    assert "2/4 writers correct, 1/4 saves landed, 1/4 readers warm, 1 *.tmp" in text
    assert "FileNotFoundError: x" in text and "model.1.tmp -> model" in text


def test_fleet_writers_that_did_not_meet_at_the_barrier_are_refused():
    run = {"writer": [_writer(timed_out=["model"])], "reader": [], "tmp_left": []}

    with pytest.raises(ForkError, match="renames did not overlap"):
        bench._fleet_counts(run)
