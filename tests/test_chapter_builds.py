"""Every chapter's "Build it" checks the reader's code (issue 37, items 1 and 2):

- with the stub as written, each Compare cell prints one line naming what to write first,
  and passes;
- with our version planted in the stub, every Compare cell passes;
- with each realistic wrong version planted (tests/data/wrong_builds/<chapter>.py), a Compare
  cell fails with AssertionError, after printing expected against found;
- in nbconvert's HTML, no line of our version appears outside a closed `<details>` before the
  Compare cell.

The cells run in this process (tests/chapter_builds.py), not in a kernel per chapter.
`BUILT` lists the chapters whose build follows this structure; the others are converted by
their owners (and added here with their wrong_builds file).
"""

from __future__ import annotations

import pytest

from tests.chapter_builds import NOTEBOOKS, builds, load, plant, run_build, wrong_versions

BUILT = [
    "01_why_paging",
    "02_blocks_and_sequences",
    "03_block_manager",
]
STUB_LINE = "is still a stub: write it, then run this cell again."


def path_of(stem: str):
    return NOTEBOOKS / f"{stem}.ipynb"


@pytest.mark.parametrize("stem", BUILT)
def test_the_stub_as_written_prints_one_line_per_compare_and_passes(stem):
    path = path_of(stem)
    found = builds(load(path))
    out = run_build(path, [None] * len(found))
    assert out.count(STUB_LINE) == len(found), out


@pytest.mark.parametrize("stem", BUILT)
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
            yield pytest.param(stem, edits, id=f"{stem}: {description}")


@pytest.mark.parametrize(("stem", "edits"), list(wrong_cases()))
def test_a_wrong_version_in_the_stub_fails_the_compare(stem, edits, capsys):
    path = path_of(stem)
    found = builds(load(path))
    with pytest.raises(AssertionError):
        run_build(path, plant(found, edits))
