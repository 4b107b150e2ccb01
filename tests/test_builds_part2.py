"""Part II and III's "Build it" sections check the reader's code (chapters 08a-13), with the
harness of tests/chapter_builds.py (cells run in this process):

- with the stubs as written, each Compare cell prints one line naming what to write first and
  passes;
- with our versions planted, every Compare cell passes;
- with each realistic wrong version of tests/data/wrong_builds/<chapter>.py planted (text edits
  of our version), a Compare cell fails with AssertionError;
- no line of our version shows before its Compare cell outside a closed `<details>` (hints
  aside), and its own block is closed.

Kept apart from tests/test_chapter_builds.py (chapters 01-07) so the two can grow in parallel.
"""

from __future__ import annotations

import re

import matplotlib
import pytest

from tests.chapter_builds import (
    NOTEBOOKS,
    builds,
    load,
    plant,
    run_build,
    source,
    wrong_versions,
)

matplotlib.use("Agg")

BUILT = [
    "08a_v4_layer",
    "08b_v4_specs",
    "09_v4_grouping",
    "10_v4_memory_slab",
    "11_v4_addressing",
    "12_hybrid_allocator",
    "13_v4_engine",
]
#: Chapters whose cells before the build take more than a few seconds (a model, Triton's
# interpreter): left to `make test`.
SLOW = {"08a_v4_layer", "12_hybrid_allocator", "13_v4_engine"}
STUB_LINE = "is still a stub: write it, then run this cell again."
CLOSED = re.compile(r"<details><summary>.*?</details>", re.S)


def chapter(stem: str):
    return pytest.param(stem, marks=pytest.mark.slow) if stem in SLOW else stem


def path_of(stem: str):
    return NOTEBOOKS / f"{stem}.ipynb"


@pytest.mark.parametrize("stem", [chapter(s) for s in BUILT])
def test_the_stub_as_written_prints_one_line_per_compare_and_passes(stem):
    path = path_of(stem)
    found = builds(load(path))
    out = run_build(path, [None] * len(found))
    assert out.count(STUB_LINE) == len(found), out


@pytest.mark.parametrize("stem", [chapter(s) for s in BUILT])
def test_our_version_in_the_stub_passes_every_compare(stem):
    path = path_of(stem)
    found = builds(load(path))
    out = run_build(path, [b.ours for b in found])
    assert STUB_LINE not in out
    assert out.count("matches the package") == len(found), out


def wrong_cases():
    for stem in BUILT:
        wrong = wrong_versions(path_of(stem))
        assert wrong, f"tests/data/wrong_builds/{stem}.py lists no wrong version"
        for description, edits in wrong.items():
            marks = [pytest.mark.slow] if stem in SLOW else []
            yield pytest.param(stem, edits, id=f"{stem}: {description}", marks=marks)


@pytest.mark.parametrize(("stem", "edits"), list(wrong_cases()))
def test_a_wrong_version_in_the_stub_fails_the_compare(stem, edits):
    path = path_of(stem)
    with pytest.raises(AssertionError):
        run_build(path, plant(builds(load(path)), edits))


@pytest.mark.parametrize("stem", BUILT)
def test_our_version_is_closed_and_nowhere_before_its_compare_cell(stem):
    cells = load(path_of(stem))
    for build in builds(cells):
        body = [line.strip() for line in build.ours.splitlines()]
        body = [line for line in body if len(line) > 25 and not line.startswith("def ")]
        for index, cell in enumerate(cells[: build.compare]):
            text = source(cell)
            if cell["cell_type"] == "markdown":  # hints and answers sit in closed boxes
                text = CLOSED.sub("", text)
            leaked = [line for line in body if line in text]
            assert not leaked, f"cell {index} shows our version: {leaked[:2]}"
        block = next(source(c) for c in cells[build.compare :] if "Our version" in source(c))
        assert "<details open" not in block and block.rstrip().endswith("</details>")


@pytest.mark.parametrize("stem", BUILT)
def test_nbconvert_html_shows_no_line_of_our_version_before_the_compare_cell(stem):
    """As tests/test_chapter_builds.py checks chapters 01-07 (its HTML helpers are reused
    until the two lists are merged)."""
    from nbconvert import HTMLExporter

    from tests.test_chapter_builds import hidden_before_compare, solution_lines, visible_text

    path = path_of(stem)
    cells = load(path)
    found = builds(cells)
    assert all(solution_lines(b.ours, source(cells[b.stub])) for b in found)
    html, _ = HTMLExporter().from_filename(str(path))
    assert not hidden_before_compare(html, found, cells)
    everything, shown = visible_text(html, everything=True), visible_text(html)
    for build in found:
        boxed = [
            line
            for line in solution_lines(build.ours, source(cells[build.stub]))
            if line not in shown
        ]
        assert boxed and all(line in everything for line in boxed)
