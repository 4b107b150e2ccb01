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

from html.parser import HTMLParser

import pytest

from tests.chapter_builds import (
    NOTEBOOKS,
    Build,
    builds,
    load,
    plant,
    run_build,
    source,
    wrong_versions,
)

BUILT = [
    "01_why_paging",
    "02_blocks_and_sequences",
    "03_block_manager",
    "04_prefix_cache",
    "05_scheduler",
    "05b_scheduler_corner_cases",
    "06_engine",
    "07_kernels",
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
