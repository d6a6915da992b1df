"""The keys figure's judging and bookkeeping (no engine is started here)."""

import pytest

from forktools.engine import bench, keys_figure, llm
from forktools.queue import export, materialize
from forktools.engine.keys_figure import Cell, Outcome
from forktools.queue.pins import ForkError

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


DRAFTER = Cell("another draft model", "compile", loads=1)


@pytest.mark.parametrize(
    "loaded, tokens, verdict",
    [
        (1, True, "ok"),  # the target's artifact loaded, the drafter compiled
        (0, True, "FALSE MISS"),  # the target compiled again as well
        (2, True, "FALSE HIT"),  # the drafter's old artifact loaded too
        (1, False, "FALSE HIT"),
    ],
)
def test_a_start_of_two_models_is_judged_by_how_many_it_loads(loaded, tokens, verdict):
    outcome = Outcome(DRAFTER, "fork", False, loaded, True, tokens)
    assert outcome.verdict == verdict


def test_a_cell_runs_from_the_first_base_whose_engine_has_it():
    cell = Cell("another k", "load", since="0.33.0")
    releases = ("0.19.1", "0.33.0", "0.34.0", "0.100.0")
    assert [v for v in releases if cell.runs_on(v)] == ["0.33.0", "0.34.0", "0.100.0"]
    assert LOAD.runs_on("0.19.1")


def test_only_the_forks_own_misses_count_against_it():
    other = Cell("root copied to another path", "load", move_root=True)
    outcomes = [
        Outcome(LOAD, "fork", False, False, True, True),
        Outcome(LOAD, "pristine+warm load", False, False, True, True),
        Outcome(other, "fork", False, False, True, True),
        Outcome(other, "pristine+warm load", True, True, False, True),
    ]
    rows = keys_figure.merged("", outcomes)
    assert keys_figure.fork_only_misses(rows) == [other.name]
    counts = keys_figure.summary(rows)
    assert counts["fork false misses"] == 2 and counts["pristine+warm load false misses"] == 1


def test_cells_are_picked_by_name(monkeypatch):
    monkeypatch.setenv(keys_figure.CELLS_ENV, "seed, dtype")
    assert [c.name for c in keys_figure.selected_cells()] == ["another seed", "another dtype"]
    monkeypatch.setenv(keys_figure.CELLS_ENV, "nothing")
    with pytest.raises(ForkError, match="CELLS=nothing names no cell; the cells: restart"):
        keys_figure.selected_cells()


class _Starts:
    """Engine starts that make hash directories as a key would."""

    def __init__(self, work, key, dies=False):
        self.work, self.key, self.count, self.dies = work, key, 0, dies
        self.say = print
        self.model = work / "model"
        self.model.mkdir(exist_ok=True)
        (self.model / "config.json").write_text('{"hidden_size": 128}')
        self.seen = []

    def start(self, root, tree=None, cwd=None, prefix=(), **change):
        self.count += 1
        self.seen.append(dict(change, tree=tree))
        aot = root / "torch_compile_cache" / "torch_aot_compile"
        config = (change.get("model") or self.model) / "config.json"
        change = dict(change, prefix=prefix, config=config.read_text())
        name = self.key(root, tree, cwd, change)
        loaded = (aot / name).exists()
        (aot / name).mkdir(parents=True, exist_ok=True)
        event = llm.AOT_LOADED if loaded else llm.AOT_SAVED
        events = {llm.AOT_LOADED: 0, llm.AOT_SAVED: 0, llm.RECOMPILED: 0}
        events[event] = 1
        self.log = self.work / f"start-{self.count}.log"
        if self.dies and self.count == 2:
            log = self.log
            log.write_text(f"{events}\n" + "\n".join(k * v for k, v in events.items()))
            log.write_text(log.read_text() + "\nKeyError: 'weight'\n")
            raise ForkError("the start failed")
        # Adapters served after the start change no token of the first one.
        args = change.get("args") or {}
        settings = {k: v for k, v in args.items() if k not in keys_figure.RUNTIME_ONLY}
        tokens = [[len(str(settings))]]
        return llm.Run(1.0, 1.0, tokens, [], "", "", root / "log", events)


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
        (Cell("hf", "compile", hf_attribute=(None, 2)), "fixed", "FALSE HIT"),
        (Cell("hf", "compile", hf_attribute=(None, 2)), "hf", "ok"),
        (Cell("hf", "compile", hf_attribute=(1, 2)), "hf", "ok"),
        (Cell("hf", "compile", hf_attribute=(1, 2)), "model", "FALSE HIT"),
        (Cell("wrapped", "compile", first={"unwrapped": "x"}), "args", "ok"),
        (Cell("wrapped", "compile", first={"unwrapped": "x"}), "fixed", "FALSE HIT"),
        (Cell("adapters", "load", first={"adapters": 3}), "fixed", "ok"),
        (Cell("wheel", "load", wheel=True), "tree", "FALSE MISS"),
        (Cell("wheel", "load", wheel=True), "fixed", "ok"),
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
        "hf": lambda root, tree, cwd, change: str(hash(change["config"])),
        "model": lambda root, tree, cwd, change: str(change.get("model")),
        "tree": lambda root, tree, cwd, change: str(tree),
    }
    starts = _Starts(tmp_path, keys[key])
    outcome = keys_figure.run_cell(cell, starts, None, tmp_path / "site")
    assert outcome.verdict == verdict
    if cell.wheel:
        assert [seen["tree"] for seen in starts.seen] == [None, tmp_path / "site"]


def test_a_start_runs_a_then_b_with_their_own_settings(tmp_path):
    cell = Cell(
        "wrapped", "compile", first={"unwrapped": "x"}, both={"ONE": "1"}, env={"B": "2"}
    )
    starts = _Starts(tmp_path, lambda root, tree, cwd, change: "k")
    keys_figure.run_cell(cell, starts, None)
    a, b, reference = starts.seen
    assert (a["args"], a["env"]) == ({"unwrapped": "x"}, {"ONE": "1"})
    assert (b["args"], b["env"]) == ({}, {"ONE": "1", "B": "2"})
    assert reference == b


def test_a_server_cell_names_the_model_otherwise_for_b(tmp_path):
    cell = Cell("port", "load", server=True)
    starts = _Starts(tmp_path, lambda root, tree, cwd, change: "k")
    assert keys_figure.run_cell(cell, starts, None).verdict == "ok"
    assert [seen["served_name"] for seen in starts.seen] == ["", "another-name"]


def test_b_that_dies_after_loading_as_artifact_is_a_false_hit(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_FORK_CACHE", str(tmp_path / "cache"))
    starts = _Starts(tmp_path, lambda root, tree, cwd, change: "k", dies=True)
    outcome = keys_figure.run_cell(COMPILE, starts, None)
    assert outcome.verdict == "FALSE HIT"
    assert outcome.cells()[6] == "B died: KeyError: 'weight'"
    [kept] = (tmp_path / "cache" / "logs").iterdir()
    assert kept.read_text().endswith("KeyError: 'weight'\n")


def test_a_test_only_update_keeps_the_label(project):
    materialize.ensure(project.base)
    core = (project.tree / "vllm/core.py").read_text()
    project.commit("vllm/core.py", core.replace("return 3\n", "return 33\n"), "[Bugfix] A")
    project.commit("tests/test_core.py", 'def test_layer():\n    """Doc."""\n', "[Test] B")
    export.export(project.base)
    assert keys_figure.relabeled_label(project.base) == materialize.version(project.base)


def test_a_cells_run_replaces_only_its_cells_rows():
    seed = Cell("another seed", "load", args={"seed": 1})
    first = keys_figure.merged(
        "",
        [
            Outcome(LOAD, "fork", True, True, False, True),
            Outcome(seed, "fork", False, False, True, True),
            Outcome(seed, "pristine+warm load", True, True, False, True),
        ],
    )
    base = type("B", (), {"name": "v9"})()
    section = keys_figure.matrix(base, first)
    again = keys_figure.merged(section, [Outcome(seed, "fork", True, True, False, True)])
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
    assert text.count("### How each cell is made") == 1
    assert "| another seed | load | B with seed=1 |" in text


def test_the_model_of_an_attribute_cell_is_rewritten_in_place(tmp_path):
    import json

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 128}')
    copy = keys_figure.with_attribute(model, tmp_path / "copy", 1)
    assert keys_figure.with_attribute(model, copy, None) == copy
    assert json.loads((copy / "config.json").read_text()) == {"hidden_size": 128}
    keys_figure.with_attribute(model, copy, 2)
    config = json.loads((copy / "config.json").read_text())
    assert config == {"hidden_size": 128, keys_figure.HF_ATTRIBUTE: 2}
    assert json.loads((model / "config.json").read_text()) == {"hidden_size": 128}
