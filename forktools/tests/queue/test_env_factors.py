import pytest

from forktools.queue import env_factors
from forktools.queue.pins import Artifact, Base, ForkError

ENVS = """\
import os

environment_variables: dict = {{
{declared}
}}


def compile_factors() -> dict[str, object]:
    ignored_factors: set[str] = {{
{ignored}
    }}
    return {{}}
"""


def base(version: str) -> Base:
    return Base(f"v{version}", version, Artifact(f"vllm-{version}.tar.gz", ""), (), ())


def tree(tmp_path, version: str, declared: list[str], ignored: list[str]):
    path = tmp_path / version
    (path / "vllm").mkdir(parents=True)
    (path / "vllm" / "envs.py").write_text(
        ENVS.format(
            declared="\n".join(
                f'    "{name}": lambda: os.getenv("{name}"),' for name in declared
            ),
            ignored="\n".join(f'        "{name}",' for name in ignored),
        )
    )
    return path


def test_reads_declared_and_ignored_variables(tmp_path):
    path = tree(tmp_path, "0.1.0", ["VLLM_A", "VLLM_B", "VLLM_C"], ["VLLM_B"])

    factors = env_factors.read(path / "vllm" / "envs.py")

    assert factors.hashed == {"VLLM_A", "VLLM_C"}


def test_names_what_an_older_base_hashes_and_a_newer_one_ignores(tmp_path):
    old, mid, new = base("0.19.1"), base("0.33.0"), base("0.34.0")
    trees = {
        new: tree(
            tmp_path, "0.34.0", ["VLLM_A", "VLLM_B", "VLLM_C"], ["VLLM_A", "VLLM_B"]
        ),
        old: tree(tmp_path, "0.19.1", ["VLLM_A", "VLLM_B", "VLLM_C"], []),
        mid: tree(tmp_path, "0.33.0", ["VLLM_A", "VLLM_B", "VLLM_C"], ["VLLM_A"]),
    }

    found = env_factors.hashed_but_ignored_later(trees, [old, mid, new])

    assert len(found) == 3
    assert found[0].startswith("v0.19.1: the compile key hashes VLLM_A, which v0.33.0")
    assert found[1].startswith("v0.19.1: the compile key hashes VLLM_B, which v0.34.0")
    assert found[2].startswith("v0.33.0: the compile key hashes VLLM_B, which v0.34.0")


def test_only_the_checked_bases_are_named_and_agreeing_bases_pass(tmp_path):
    old, new = base("0.19.1"), base("0.33.0")
    trees = {
        old: tree(tmp_path, "0.19.1", ["VLLM_A", "VLLM_B"], ["VLLM_A"]),
        new: tree(
            tmp_path, "0.33.0", ["VLLM_A", "VLLM_B", "VLLM_NEW"], ["VLLM_A", "VLLM_NEW"]
        ),
    }

    assert env_factors.hashed_but_ignored_later(trees, [old, new]) == []
    without_envs = base("0.40.0")
    trees[without_envs] = tmp_path / "a tree without vllm/envs.py"
    assert env_factors.hashed_but_ignored_later(trees, [old, new]) == []
    trees[new] = tree(tmp_path / "later", "0.33.0", ["VLLM_B"], ["VLLM_B"])
    assert env_factors.hashed_but_ignored_later(trees, [new]) == []
    assert len(env_factors.hashed_but_ignored_later(trees, [old])) == 1


def test_an_envs_file_it_cannot_read_names_the_file(tmp_path):
    path = tmp_path / "envs.py"
    path.write_text("environment_variables = {}\n")

    with pytest.raises(ForkError, match=r"envs\.py: no compile_factors\(\)"):
        env_factors.read(path)
