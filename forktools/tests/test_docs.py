"""The README is one page for users; docs/ holds the rest, and links hold."""

import re

from forktools.queue.pins import ROOT

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_says_what_it_fixes_which_base_and_each_command_in_40_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 160
    top = "\n".join(lines[:40])
    for said in (
        "## What it fixes",
        "## Which base",
        "pip install -e .",
        "make wheel",
        "fixes BASE=",
        "KeyError: 'weight'",
    ):
        assert said in top, said


def test_the_readme_names_the_command_ci_runs():
    assert "`make test` is what CI runs" in README.read_text()
    assert "make test" in (ROOT / ".ci/run").read_text()


def test_every_relative_link_resolves():
    for page in [README, ROOT / "BENCHMARKS.md", *DOCS]:
        for target in LINK.findall(page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name}: {target}"


# The one date a doc may hold: the day the package index offered the sdists
# that releases.md was made from, which says what the table reflects.
INDEX_DATE = re.compile(r"as it offered them on 20\d\d-\d\d-\d\d\b")


def test_no_doc_keeps_a_dated_log_of_runs():
    for page in [README, *DOCS]:
        text = INDEX_DATE.sub("", page.read_text(), count=1)
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), page.name


def test_every_make_target_is_in_the_commands_page():
    makefile = (ROOT / "Makefile").read_text()
    commands = (ROOT / "docs/commands.md").read_text()
    for target in re.findall(r"^([a-z-]+):.*## ", makefile, re.M):
        assert f"`make {target}" in commands, target


def test_the_layout_page_names_every_package_in_under_60_lines():
    layout = (ROOT / "docs/layout.md").read_text()
    assert len(layout.splitlines()) < 60
    packages = [p.parent.name for p in (ROOT / "forktools").glob("*/__init__.py")]
    for package in packages:
        if package != "tests":
            assert f"`{package}/`" in layout, package
