"""Run a chapter's "Build it" cells in this process, with a chosen body planted in the stub.

A chapter's build is one or more pairs: a `# Your turn:` stub cell, then a `# Compare:` cell
that calls `check_build` on the stub's names, then a markdown cell whose closed
`<details><summary>Our version ...` block holds our version in a ```python fence, under the
stub's own names (so a reader can paste it into the stub). `run_build` executes the chapter's
code cells up to the last Compare cell in a fresh namespace, with each stub cell replaced by the
text given for it; the cells before the first stub run once per chapter and are reused (their
namespace is copied), which keeps the tests to seconds. They run in notebooks/, as Jupyter
runs a chapter, so relative paths (`../tests/data/configs`) resolve as they do there.

Per-chapter wrong versions live in tests/data/wrong_builds/<chapter stem>.py as
`WRONG = {description: [(old, new), ...]}`: text edits applied to our version (each `old` must
occur in exactly one of the chapter's "our version" blocks).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import runpy
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
WRONG_BUILDS = Path(__file__).resolve().parent / "data" / "wrong_builds"
YOUR_TURN = "# Your turn:"
COMPARE = "# Compare:"
OUR_VERSION = "<details><summary>Our version"
FENCE = re.compile(r"```python\n(.*?)```", re.S)


def source(cell: dict) -> str:
    return "".join(cell["source"])


@dataclass(frozen=True)
class Build:
    stub: int  # cell index of the `# Your turn:` cell
    compare: int  # cell index of its `# Compare:` cell
    ours: str  # our version, from the closed details block after the Compare cell


def load(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def builds(cells: list[dict]) -> list[Build]:
    """The chapter's stub / Compare / our-version triples, in order."""
    found = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "code" or not source(cell).startswith(YOUR_TURN):
            continue
        compare = next(
            i
            for i in range(index + 1, len(cells))
            if cells[i]["cell_type"] == "code" and source(cells[i]).startswith(COMPARE)
        )
        ours = next(
            source(cells[i])
            for i in range(compare + 1, len(cells))
            if cells[i]["cell_type"] == "markdown" and OUR_VERSION in source(cells[i])
        )
        block = ours[ours.index(OUR_VERSION) :]
        found.append(Build(index, compare, FENCE.search(block).group(1)))
    return found


def python_of(cell: dict) -> str:
    """A code cell as plain Python: IPython's `%` line magics dropped."""
    return "\n".join(
        line for line in source(cell).splitlines() if not line.lstrip().startswith("%")
    )


def _exec(code: str, namespace: dict, label: str) -> None:
    exec(compile(code, label, "exec"), namespace)


def _skip_on_a_gpu_machine() -> None:
    """The chapters run with the GPU hidden (`make test-notebooks`: their outputs are a CPU
    machine's), and a process that sees CUDA compiles the kernels for it, which refuse the
    chapters' CPU tensors. So these in-process runs need the GPU hidden too."""
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("the chapters run with the GPU hidden: CUDA_VISIBLE_DEVICES= pytest ...")


@cache
def _prefix(path: Path) -> tuple[dict, str]:
    """The namespace after the code cells before the first stub, and what they printed."""
    _skip_on_a_gpu_machine()
    cells = load(path)
    first = builds(cells)[0].stub
    namespace: dict = {"__name__": "__main__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.chdir(path.parent):
        for index in range(first):
            if cells[index]["cell_type"] == "code":
                _exec(python_of(cells[index]), namespace, f"{path.stem}[{index}]")
    return namespace, out.getvalue()


def run_build(path: Path, planted: list[str | None]) -> str:
    """Run the build cells with `planted[k]` in place of stub k (None: the stub as written);
    return what the cells printed. An AssertionError from a Compare cell propagates."""
    import matplotlib.pyplot as plt

    cells = load(path)
    found = builds(cells)
    assert len(planted) == len(found), f"{len(found)} stubs, {len(planted)} bodies given"
    base, _ = _prefix(path)
    namespace = copy.copy(base)
    replacement = {b.stub: body for b, body in zip(found, planted, strict=True) if body}
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.chdir(path.parent):
            for index in range(found[0].stub, found[-1].compare + 1):
                if cells[index]["cell_type"] != "code":
                    continue
                code = replacement.get(index) or python_of(cells[index])
                _exec(code, namespace, f"{path.stem}[{index}]")
    except BaseException as error:
        error.add_note(f"the cells printed:\n{out.getvalue()}")
        raise
    finally:
        plt.close("all")
    return out.getvalue()


def wrong_versions(path: Path) -> dict[str, list[tuple[str, str]]]:
    """The chapter's planted wrong versions (tests/data/wrong_builds/<stem>.py)."""
    data = WRONG_BUILDS / f"{path.stem}.py"
    return runpy.run_path(str(data))["WRONG"] if data.exists() else {}


def plant(found: list[Build], edits: list[tuple[str, str]]) -> list[str]:
    """Our versions, with each (old, new) edit applied to the one version that holds `old`."""
    bodies = [b.ours for b in found]
    for old, new in edits:
        holders = [k for k, body in enumerate(bodies) if old in body]
        assert len(holders) == 1, f"{old!r} is in {len(holders)} of our versions; need 1"
        assert bodies[holders[0]].count(old) == 1, f"{old!r} occurs more than once"
        bodies[holders[0]] = bodies[holders[0]].replace(old, new)
    return bodies
