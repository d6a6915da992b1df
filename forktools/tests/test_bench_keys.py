"""The keys figure's judging and bookkeeping (no engine is started here)."""

import pytest

from forktools import bench, bench_keys, engine, export, materialize
from forktools.bench_keys import Cell, Outcome
from forktools.pins import ForkError

LOAD = Cell("restart", "load")
COMPILE = Cell("another dtype", "compile", args={"dtype": "bfloat16"})


@pytest.mark.parametrize(
    "cell, same_dir, loaded, compiled, tokens, verdict",
    [
        (LOAD, True, True, False, True, "ok"),
        (LOAD, False, False, True, True, "FALSE MISS"),
        (LOAD, True, False, True, True, "FALSE MISS"),
        (LOAD, True, True, False, False, "wrong tokens"),
        (COMPILE, False, False, True, True, "ok"),
        (COMPILE, True, True, False, True, "FALSE HIT"),
        (COMPILE, False, False, True, False, "FALSE HIT"),
    ],
)
def test_a_cell_is_judged_by_its_directory_load_compile_and_tokens(
    cell, same_dir, loaded, compiled, tokens, verdict
):
    assert Outcome(cell, "fork", same_dir, loaded, compiled, tokens).verdict == verdict


def test_only_the_forks_own_misses_count_against_it():
    other = Cell("root copied to another path", "load", move_root=True)
    outcomes = [
        Outcome(LOAD, "fork", False, False, True, True),
        Outcome(LOAD, "pristine+warm load", False, False, True, True),
        Outcome(other, "fork", False, False, True, True),
        Outcome(other, "pristine+warm load", True, True, False, True),
    ]
    rows = bench_keys.merged("", outcomes)
    assert bench_keys.fork_only_misses(rows) == [other.name]
    counts = bench_keys.summary(rows)
    assert counts["fork false misses"] == 2 and counts["pristine+warm load false misses"] == 1


def test_cells_are_picked_by_name(monkeypatch):
    monkeypatch.setenv(bench_keys.CELLS_ENV, "seed, dtype")
    assert [c.name for c in bench_keys.selected_cells()] == ["another seed", "another dtype"]
    monkeypatch.setenv(bench_keys.CELLS_ENV, "nothing")
    with pytest.raises(ForkError, match="CELLS=nothing names no cell; the cells: restart"):
        bench_keys.selected_cells()


class _Starts:
    """Engine starts that make hash directories as a key would."""

    def __init__(self, work, key):
        self.work, self.key, self.count = work, key, 0

    def start(self, root, tree=None, cwd=None, prefix=(), **change):
        self.count += 1
        aot = root / "torch_compile_cache" / "torch_aot_compile"
        name = self.key(root, tree, cwd, dict(change, prefix=prefix))
        loaded = (aot / name).exists()
        (aot / name).mkdir(parents=True, exist_ok=True)
        event = engine.AOT_LOADED if loaded else engine.AOT_SAVED
        events = {engine.AOT_LOADED: 0, engine.AOT_SAVED: 0, engine.RECOMPILED: 0}
        events[event] = 1
        tokens = [[len(str(change.get("args") or {}))]]
        return engine.Run(1.0, 1.0, tokens, [], "", "", root / "log", events)


@pytest.mark.parametrize(
    "cell, key, verdict",
    [
        (Cell("root copied to another path", "load", move_root=True), "path", "FALSE MISS"),
        (Cell("root copied to another path", "load", move_root=True), "fixed", "ok"),
        (Cell("another working directory", "load", other_cwd=True), "cwd", "FALSE MISS"),
        (Cell("another user's HOME", "load", other_home=True), "home", "FALSE MISS"),
        (Cell("another user's HOME", "load", other_home=True), "fixed", "ok"),
        (Cell("another hostname", "load", namespaces=True), "host", "FALSE MISS"),
        (COMPILE, "fixed", "FALSE HIT"),
        (Cell("hf", "compile", hf_attribute=True), "fixed", "FALSE HIT"),
        (Cell("hf", "compile", hf_attribute=True), "hf", "ok"),
        (COMPILE, "args", "ok"),
    ],
)
def test_a_cell_runs_a_then_b_on_as_root(tmp_path, cell, key, verdict):
    keys = {
        "fixed": lambda root, tree, cwd, change: "k",
        "path": lambda root, tree, cwd, change: str(hash(str(root))),
        "cwd": lambda root, tree, cwd, change: str(hash(str(cwd))),
        "args": lambda root, tree, cwd, change: str(hash(str(change.get("args")))),
        "home": lambda root, tree, cwd, change: str(hash(str(change.get("env")))),
        "host": lambda root, tree, cwd, change: str(len(change["prefix"])),
        "hf": lambda root, tree, cwd, change: str(bool(change.get("hf_attribute"))),
    }
    outcome = bench_keys.run_cell(cell, _Starts(tmp_path, keys[key]), None)
    assert outcome.verdict == verdict


def test_a_test_only_update_keeps_the_label(project):
    materialize.ensure(project.base)
    core = (project.tree / "vllm/core.py").read_text()
    project.commit("vllm/core.py", core.replace("return 3\n", "return 33\n"), "[Bugfix] A")
    project.commit("tests/test_core.py", 'def test_layer():\n    """Doc."""\n', "[Test] B")
    export.export(project.base)
    assert bench_keys.relabeled_label(project.base) == materialize.version(project.base)


def test_a_cells_run_replaces_only_its_cells_rows():
    seed = Cell("another seed", "load", args={"seed": 1})
    first = bench_keys.merged(
        "",
        [
            Outcome(LOAD, "fork", True, True, False, True),
            Outcome(seed, "fork", False, False, True, True),
            Outcome(seed, "pristine+warm load", True, True, False, True),
        ],
    )
    base = type("B", (), {"name": "v9"})()
    section = bench_keys.matrix(base, first)
    again = bench_keys.merged(section, [Outcome(seed, "fork", True, True, False, True)])
    assert [(row[0], row[2], row[7]) for row in again] == [
        ("restart", "fork", "ok"),
        ("another seed", "fork", "ok"),
        ("another seed", "pristine+warm load", "ok"),
    ]


def test_the_matrix_keeps_the_sections_of_bases_not_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "KEYS_MATRIX", tmp_path / "keys.md")
    bench._write_keys_matrix({"v0.19.1": "### v0.19.1\n\nold\n"})
    bench._write_keys_matrix({**bench._keys_sections(), "v0.33.0": "### v0.33.0\n\nnew\n"})
    text = (tmp_path / "keys.md").read_text()
    assert text.index("### v0.33.0") < text.index("### v0.19.1")
    assert "\nold\n" in text and "\nnew\n" in text


def test_the_other_model_has_one_more_config_attribute(tmp_path):
    import json

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 128}')
    starts = bench_keys.Starts(tmp_path / "python", model, tmp_path, tmp_path, print)
    other = json.loads((starts.other_model() / "config.json").read_text())
    assert other == {"hidden_size": 128, "vllm_fork_bench_attribute": 2}
