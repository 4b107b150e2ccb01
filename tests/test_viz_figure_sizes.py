"""Every figure fits a notebook column, and every text in it reads at 8 pt or more.

Each drawing function of refimpl.viz is called as its chapter calls it (tests/figure_cases.py),
rendered exactly as the notebook's inline backend renders it (the figure's own dpi, trimmed to
what is drawn), and measured: the PNG's width in pixels, and the size of every text matplotlib
drew (titles, labels, tick labels, legends, annotations) in points at the size the notebook
shows it.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
from pathlib import Path

import pytest
from matplotlib.figure import Figure

import refimpl.viz
from refimpl.viz import palette
from tests.figure_cases import CASES, figures
from tests.figure_size import COLUMN_PX, REFERENCE_DPI, measure

MIN_POINTS = 8.0
CHAPTERS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9]*.ipynb"))
#: Cases that take seconds (many stepper frames, a model to build): left to `make test`, not
# test-fast.
SLOW = {
    "pool_snapshot_03",
    "pool_snapshot_04",
    "scheduler_state",
    "scheduler_state_05",
    "softmax_state",
    "allocator_state",
    "step_inputs",
    "slab",
    "grouping",
    "pool",
}


def draw_functions() -> dict[str, object]:
    """Every public function of refimpl.viz that returns a Figure, by qualified name."""
    found = {}
    for info in pkgutil.iter_modules(refimpl.viz.__path__):
        module = importlib.import_module(f"refimpl.viz.{info.name}")
        for name, obj in vars(module).items():
            if (
                inspect.isfunction(obj)
                and obj.__module__ == module.__name__
                and not name.startswith("_")
                and inspect.signature(obj).return_annotation in (Figure, "Figure")
            ):
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_figure_function_has_a_case():
    covered = {fn for fn, _ in CASES.values()}
    missing = [name for name, fn in draw_functions().items() if fn not in covered]
    assert not missing, f"add a case to tests/figure_cases.py for: {missing}"
    assert len(draw_functions()) >= 30


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES]
)
def test_figure_fits_a_column_with_readable_text(case):
    for index, fig in enumerate(figures(case)):
        shown = measure(fig)
        assert shown.width <= COLUMN_PX, (
            f"{case}[{index}] is {shown.width} px wide as shown; a notebook column shows "
            f"{COLUMN_PX} px "
            "(refimpl.viz.palette.MAX_WIDTH inches, legends included)"
        )
        size, text = shown.smallest
        assert size >= MIN_POINTS, (
            f"{case}[{index}]: {text!r} shows at {size} pt (< {MIN_POINTS})"
        )


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_stored_figure_fits_the_column(path):
    """Every picture a chapter stores is shown at full size: no wider than the column. This
    catches a chapter that draws with sizes no case above covers, or in a cell of its own."""
    too_wide = [
        (index, shown["width"])
        for index, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"])
        for output in cell.get("outputs", [])
        for shown in [output.get("metadata", {}).get("image/png", {})]
        if shown.get("width", 0) > COLUMN_PX
    ]
    assert not too_wide, f"(cell, px) wider than the {COLUMN_PX} px column: {too_wide}"


def test_the_column_is_jupyterlabs_output_width():
    """The column is the width of an output on the laptop screen of tests/screen.py (whose
    numbers test_reader_standards.py checks against the installed JupyterLab), and that
    JupyterLab scales a wider picture down to it rather than letting it overflow."""
    import re
    import sys
    from pathlib import Path

    from tests import screen

    assert COLUMN_PX == screen.OUTPUT_PX == 807
    static = Path(sys.prefix) / "share" / "jupyter" / "lab" / "static"
    bundle = "".join(p.read_text(errors="ignore") for p in static.glob("jlab_core*.js"))
    rule = re.search(r"\.jp-RenderedImage img,[^{]*\{([^}]*)\}", bundle)
    assert rule and "max-width: 100%" in rule.group(1)
    assert palette.MAX_WIDTH * REFERENCE_DPI + 20 <= COLUMN_PX  # bbox "tight" pads 0.1 in


def test_measure_sees_what_a_reader_sees():
    """The measure itself: a 12-inch figure is scaled into the column, its 8-pt text with it; a
    higher dpi makes the same text larger on screen; tick labels and legends are counted."""
    wide = Figure(figsize=(12, 2))
    wide.add_subplot().text(0.5, 0.5, "x", fontsize=8)
    shown = measure(wide)
    assert shown.width > COLUMN_PX + 50
    assert shown.smallest[0] == pytest.approx(8 * COLUMN_PX / shown.width, abs=0.01)

    sharp = Figure(figsize=(4, 2), dpi=150)
    ax = sharp.add_subplot()
    ax.plot([0, 1], [0, 1], label="line")
    ax.legend(fontsize=6)
    ax.tick_params(labelsize=7)
    shown = measure(sharp)
    sizes = dict((text, size) for size, text in shown.texts)
    assert sizes["line"] == pytest.approx(6 * 1.5)  # the legend, at 150 dpi
    # tick labels
    assert min(size for size, text in shown.texts if text != "line") == pytest.approx(7 * 1.5)
