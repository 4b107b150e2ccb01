"""Part II and III's "Build it" sections check the reader's version (chapters 08a-13).

For each chapter, run in-process (tests/build_sections.py):
- with every stub unfilled, each Compare cell prints one line naming what to write first and
  raises nothing;
- with our version (the closed details block after the Compare cell) planted in its stub, each
  Compare cell passes;
- with each realistic wrong version of tests/data/wrong_builds/<chapter>.py planted, the Compare
  cell of that stub raises AssertionError;
- our version appears nowhere before its Compare cell (hints aside), and its details
  block is closed.
"""

from __future__ import annotations

import functools
import re

import matplotlib
import pytest

from tests.build_sections import (
    OURS_SUMMARY,
    ROOT,
    defined,
    load,
    run_until,
    sections,
    source,
    wrong_builds,
)

matplotlib.use("Agg")
CLOSED = re.compile(r"<details><summary>.*?</details>", re.S)

STEMS = [
    "08a_v4_layer",
    "08b_v4_specs",
    "09_v4_grouping",
    "10_v4_memory_slab",
    "11_v4_addressing",
    "12_hybrid_allocator",
    "13_v4_engine",
]
#: Chapters whose cells before the build take seconds (a model, Triton's interpreter).
SLOW = {"11_v4_addressing", "13_v4_engine"}


def chapter(stem: str):
    return pytest.param(stem, marks=pytest.mark.slow) if stem in SLOW else stem


def path_of(stem: str):
    return ROOT / "notebooks" / f"{stem}.ipynb"


@functools.cache
def before(stem: str, k: int) -> dict:
    """The namespace just before section k's stub, every earlier stub filled with ours."""
    path = path_of(stem)
    found = sections(load(path))
    if k == 0:
        namespace, _ = run_until(path, found[0].stub - 1, {})
        return namespace
    previous = found[k - 1]
    namespace = dict(before(stem, k - 1))
    namespace, _ = run_until(
        path, found[k].stub - 1, {previous.stub: previous.ours}, namespace, previous.stub
    )
    return namespace


def run_section(stem: str, k: int, fill: str | None) -> str:
    path = path_of(stem)
    section = sections(load(path))[k]
    fills = {section.stub: fill} if fill is not None else {}
    _, printed = run_until(path, section.compare, fills, dict(before(stem, k)), section.stub)
    return printed


@pytest.mark.parametrize("stem", [chapter(s) for s in STEMS])
def test_unfilled_stub_prints_one_line_and_passes(stem):
    for k, _ in enumerate(sections(load(path_of(stem)))):
        printed = run_section(stem, k, None)
        assert printed.count("\n") == 1 and "is still a stub" in printed, printed


@pytest.mark.parametrize("stem", [chapter(s) for s in STEMS])
def test_our_version_passes_the_compare_cell(stem):
    for k, _ in enumerate(sections(load(path_of(stem)))):
        printed = run_section(stem, k, sections(load(path_of(stem)))[k].ours)
        assert "matches the package" in printed, printed


@pytest.mark.parametrize("stem", [chapter(s) for s in STEMS])
def test_each_planted_wrong_version_fails_the_compare_cell(stem):
    found = sections(load(path_of(stem)))
    wrong = wrong_builds(stem)
    assert wrong, "plant at least one realistic wrong version per chapter"
    for label, code in wrong.items():
        names = defined(code)
        k = next(i for i, s in enumerate(found) if names <= s.names)
        with pytest.raises(AssertionError):
            run_section(stem, k, code)
        print(f"{stem}: caught {label!r}")


@pytest.mark.parametrize("stem", STEMS)
def test_our_version_is_closed_and_after_its_compare_cell(stem):
    cells = load(path_of(stem))
    for section in sections(cells):
        body = [line.strip() for line in section.ours.splitlines() if line.strip()]
        body = [line for line in body if not line.startswith(("#", '"""'))][1:]
        for index, cell in enumerate(cells):
            text = source(cell)
            if cell["cell_type"] == "markdown":  # hints and answers sit in closed boxes
                text = CLOSED.sub("", text)
            if OURS_SUMMARY in source(cell):
                assert "<details open" not in text
                continue
            if index < section.compare:
                leaked = [line for line in body if len(line) > 25 and line in text]
                assert not leaked, f"cell {index} shows our version: {leaked[:2]}"
