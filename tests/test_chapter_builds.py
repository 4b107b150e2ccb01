"""Every chapter's "Build it" checks the reader's code (issue 37, items 1 and 2):

- with the stub as written, each Compare cell prints one line naming what to write first,
  and passes;
- with our version planted in the stub, every Compare cell passes;
- with each realistic wrong version planted (tests/data/wrong_builds/<chapter>.py), a Compare
  cell fails with AssertionError, after printing expected against found;
- in nbconvert's HTML, no line of our version appears outside a closed `<details>` before the
  Compare cell.

The cells run in this process (tests/chapter_builds.py), not in a kernel per chapter.
`BUILT` is every chapter with a tests/data/wrong_builds/<chapter>.py file; a chapter whose
Compare cell calls check_build must have one.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

import matplotlib
import pytest

from tests.chapter_builds import (
    NOTEBOOKS,
    WRONG_BUILDS,
    Build,
    builds,
    load,
    plant,
    run_build,
    source,
    wrong_versions,
)

# The chapters whose build follows this structure: those with a wrong-versions file. A chapter
# joins by adding tests/data/wrong_builds/<chapter stem>.py (nothing to edit here).
BUILT = sorted(path.stem for path in WRONG_BUILDS.glob("[0-9]*.py"))
#: Chapters whose cells before the build take more than a few seconds (a model, Triton's
# interpreter): left to `make test`, not `make test-fast`.
SLOW = {"08a_v4_layer", "12_hybrid_allocator", "13_v4_engine"}
STUB_LINE = "is still a stub: write it, then run this cell again."
CLOSED = re.compile(r"<details><summary>.*?</details>", re.S)

matplotlib.use("Agg")


def chapter(stem: str):
    return pytest.param(stem, marks=pytest.mark.slow) if stem in SLOW else stem


def test_every_chapter_that_checks_the_reader_plants_wrong_versions():
    checking = {
        path.stem
        for path in NOTEBOOKS.glob("[0-9]*.ipynb")
        if any(
            source(cell).startswith("# Compare:") and "check_build(" in source(cell)
            for cell in load(path)
        )
    }
    assert checking, "no chapter's Compare cell calls check_build"
    assert checking <= set(BUILT), (
        f"no tests/data/wrong_builds file for {sorted(checking - set(BUILT))}"
    )
    assert set(BUILT) <= {p.stem for p in NOTEBOOKS.glob("[0-9]*.ipynb")}


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
def test_a_wrong_version_in_the_stub_fails_the_compare(stem, edits, capsys):
    path = path_of(stem)
    found = builds(load(path))
    with pytest.raises(AssertionError):
        run_build(path, plant(found, edits))


#: Chapters whose stubs share no long line with our version, so any such line shown before the
# Compare cell is a leak (in 01-07 a stub keeps its imports and `__init__` lines, which the HTML
# check above tells apart from the solution).
NO_SHARED_LINES = [s for s in BUILT if s[:2] in ("08", "09", "10", "11", "12", "13")]


@pytest.mark.parametrize("stem", NO_SHARED_LINES)
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


class _VisibleText(HTMLParser):
    """The text of an HTML page that shows without a click: everything outside a closed
    `<details>` element (one without the `open` attribute)."""

    def __init__(self, everything: bool = False) -> None:
        super().__init__(convert_charrefs=True)
        self.everything = everything  # True: closed boxes' text too
        self.closed_depth = 0
        self.parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "details" and (self.closed_depth or "open" not in dict(attrs)):
            self.closed_depth += 1

    def handle_endtag(self, tag):
        if tag == "details" and self.closed_depth:
            self.closed_depth -= 1

    def handle_data(self, data):
        if self.everything or not self.closed_depth:
            self.parts.append(data)


def visible_text(html: str, everything: bool = False) -> str:
    parser = _VisibleText(everything)
    parser.feed(html)
    return "".join(parser.parts)


def solution_lines(ours: str, stub: str) -> list[str]:
    """The lines of our version a reader could not have read in the stub: code lines of at
    least 12 characters (a trailing comment dropped) that the stub's text does not hold."""
    lines = [line.split("  #")[0].strip() for line in ours.splitlines()]
    return [
        line
        for line in lines
        if len(line) >= 12 and not line.startswith("#") and line not in stub
    ]


def hidden_before_compare(html: str, found: list[Build], cells: list[dict]) -> list[str]:
    """Lines of our versions that nbconvert's HTML shows from their stub to their Compare
    cell, outside a closed box (lines the page showed before the stub, such as a listing of
    the package's code, do not count)."""
    shown = visible_text(html)
    leaks, start = [], 0
    for build in found:
        stub = source(cells[build.stub])
        at_stub = shown.find(stub.splitlines()[0], start)
        at_compare = shown.find(source(cells[build.compare]).splitlines()[0], at_stub)
        assert 0 <= at_stub < at_compare, "the stub or its Compare cell is not on the page"
        earlier, between = shown[:at_stub], shown[at_stub:at_compare]
        leaks += [
            line
            for line in solution_lines(build.ours, stub)
            if line in between and line not in earlier
        ]
        start = at_compare
    return leaks


@pytest.mark.parametrize("stem", BUILT)
def test_nbconvert_html_shows_no_line_of_our_version_before_the_compare_cell(stem):
    from nbconvert import HTMLExporter

    path = path_of(stem)
    cells = load(path)
    found = builds(cells)
    assert all(solution_lines(b.ours, source(cells[b.stub])) for b in found)
    html, _ = HTMLExporter().from_filename(str(path))
    assert not hidden_before_compare(html, found, cells)
    everything, shown = visible_text(html, everything=True), visible_text(html)
    for build in found:  # our version is on the page, and only inside a closed box
        boxed = [
            line
            for line in solution_lines(build.ours, source(cells[build.stub]))
            if line not in shown
        ]
        assert boxed and all(line in everything for line in boxed)


def test_the_html_check_catches_a_collapsed_code_cell_and_an_open_box():
    from nbconvert import HTMLExporter
    from nbformat import v4

    ours = "def your_f(n):\n    return list(range(n)) + [n]"
    stub = 'def your_f(n):\n    """n."""\n    ...'
    for leak in (
        v4.new_code_cell("# Build:\n" + ours, metadata={"jupyter": {"source_hidden": True}}),
        v4.new_markdown_cell(
            f"<details open><summary>Ours</summary>\n\n```python\n{ours}\n```\n\n</details>"
        ),
    ):
        notebook = v4.new_notebook(
            cells=[
                v4.new_code_cell("# Your turn:\n" + stub),
                leak,
                v4.new_code_cell("# Compare:\ncheck_build(your_f, {}, run=r, reference=r)"),
            ]
        )
        html, _ = HTMLExporter().from_notebook_node(notebook)
        cells = [dict(c, source=c["source"]) for c in notebook.cells]
        assert hidden_before_compare(html, [Build(0, 2, ours)], cells)
