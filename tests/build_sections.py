"""A chapter's "Build it" sections run in-process, with the reader's stub unfilled, filled with
our version, or filled with a planted wrong version (tests/data/wrong_builds/<chapter>.py).

A section is a `# Your turn:` stub cell, the `# Compare:` cell that follows it (a hint may sit
between them, in markdown), and after the Compare cell a closed
`<details><summary>Our version ...` markdown cell holding our version as a ```python block.
The chapter's code cells run in order in one namespace, so a Compare cell sees what the cells
before it defined; no kernel is started.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRONG_BUILDS = ROOT / "tests" / "data" / "wrong_builds"
OURS_SUMMARY = "<details><summary>Our version (open it after your Compare cell passes)</summary>"
FENCED = re.compile(r"```python\n(.*?)```", re.S)


@dataclass(frozen=True)
class Section:
    stub: int  # cell index of the `# Your turn:` cell
    compare: int  # cell index of its `# Compare:` cell
    ours: str  # our version, from the closed details block after the Compare cell
    names: frozenset[str]  # what the stub defines


def source(cell: dict) -> str:
    return "".join(cell["source"])


def load(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def defined(code: str) -> frozenset[str]:
    return frozenset(
        node.name
        for node in ast.parse(code).body
        if isinstance(node, ast.FunctionDef | ast.ClassDef)
    )


def sections(cells: list[dict]) -> list[Section]:
    """Every stub, its Compare cell and our version, in reading order."""
    found = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "code" or not source(cell).startswith("# Your turn:"):
            continue
        compare = next(
            i for i in range(index + 1, len(cells)) if cells[i]["cell_type"] == "code"
        )
        assert source(cells[compare]).startswith("# Compare:"), (
            f"cell {index}: the code cell after a stub must be its Compare cell"
        )
        ours = next(
            source(c) for c in cells[compare + 1 :] if OURS_SUMMARY in source(c)
        )
        code = FENCED.search(ours)
        assert code, f"cell {compare}: our version needs a ```python block"
        found.append(Section(index, compare, code.group(1), defined(source(cell))))
    return found


def wrong_builds(stem: str) -> dict[str, str]:
    """{what is wrong: code that defines the stub's function wrongly} for one chapter."""
    path = WRONG_BUILDS / f"{stem}.py"
    namespace: dict = {}
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), namespace)
    return namespace["WRONG"]


def run_until(
    path: Path, last: int, fill: dict[int, str], namespace: dict | None = None, start: int = 0
) -> tuple[dict, str]:
    """Run the code cells `start..last` of chapter `path` in `namespace` (fresh if None),
    each stub cell followed by `fill[stub index]` when given. Returns the namespace and
    everything printed while the cell `last` ran."""
    cells = load(path)
    namespace = {"__name__": "__chapter__"} if namespace is None else namespace
    printed = ""
    old = Path.cwd()
    os.chdir(path.parent)  # chapters read files relative to notebooks/
    try:
        for index in range(start, last + 1):
            cell = cells[index]
            if cell["cell_type"] != "code":
                continue
            code = source(cell) + ("\n" + fill[index] if index in fill else "")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"{path.stem}[{index}]", "exec"), namespace)
            printed = out.getvalue()
    finally:
        os.chdir(old)
    return namespace, printed
