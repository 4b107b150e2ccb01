"""Seconds per stepper click, in every chapter with a stepper, measured as a reader clicks.

Each chapter's code cells run in order in one IPython shell (as Run All runs them) up to the
cell that shows a stepper's widget; the widget is then built as that cell builds it, and each
"click" moves its slider to a step, which runs what a click runs in JupyterLab (the slider's
observer: the frame's picture and text into the output area). Every step is visited twice: the
first visit and a revisit. The course's rule: under 0.3 s per click in every chapter.

    python benchmarks/stepper_clicks.py [CHAPTER ...]     # e.g. 12 03; default: all
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
WIDGET = re.compile(r"^(\w+)\.widget\(\)\s*$", re.M)
LIMIT_S = 0.3


def stepper_cells(path: Path) -> tuple[list[str], list[tuple[int, str]]]:
    """(every code cell's source, [(cell index, stepper variable)] of the widget cells)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    # `%matplotlib inline` needs a kernel's GUI hook; refimpl's figures draw without pyplot
    sources = [
        "\n".join(
            line
            for line in "".join(c["source"]).splitlines()
            if not line.startswith("%matplotlib")
        )
        for c in cells
        if c["cell_type"] == "code"
    ]
    found = [(i, m.group(1)) for i, s in enumerate(sources) if (m := WIDGET.search(s))]
    return sources, found


def slider_of(box):
    """The IntSlider of `Stepper.widget()`'s controls row."""
    import ipywidgets as widgets

    controls = box.children[0]
    return next(c for c in controls.children if isinstance(c, widgets.IntSlider))


def time_clicks(stepper) -> dict[str, float]:
    """Build the widget (timed), then click through every step twice (first visits, then
    revisits), each click timed; the worst and the mean click, in seconds."""
    start = time.perf_counter()
    box = stepper.widget()
    build = time.perf_counter() - start
    slider = slider_of(box)
    # a reader clicks after the cell ran; the frames are drawn meanwhile (if the Stepper
    # renders ahead); the time that takes is reported apart from the clicks
    start = time.perf_counter()
    if hasattr(stepper, "rendered"):
        stepper.rendered()
    ahead = time.perf_counter() - start
    clicks = []
    for _ in range(2):
        for index in list(range(1, len(stepper))) + [0]:
            start = time.perf_counter()
            slider.value = index
            clicks.append(time.perf_counter() - start)
    return {
        "frames": len(stepper),
        "build_s": build,
        "ahead_s": ahead,
        "worst_click_s": max(clicks),
        "mean_click_s": sum(clicks) / len(clicks),
    }


def measure(path: Path) -> list[dict]:
    from IPython.core.interactiveshell import InteractiveShell

    sources, found = stepper_cells(path)
    if not found:
        return []
    from refimpl.viz.hidpi import register

    shell = InteractiveShell.instance()
    shell.reset()
    # as in a kernel: Figures become refimpl's HiDPI PNG (a terminal shell only prints their
    # repr), and what is displayed goes to the output area (here: nowhere) instead of stdout
    register(shell)
    shell.display_pub.publish = lambda *args, **kwargs: None
    os.chdir(path.parent)
    results = []
    done = 0
    for index, name in found:
        for source in sources[done:index]:
            result = shell.run_cell(source, silent=True)
            if not result.success:
                raise RuntimeError(f"{path.name}: a cell failed: {result.error_in_exec!r}")
        done = index + 1
        timed = time_clicks(shell.user_ns[name])
        results.append({"chapter": path.stem, "stepper": name, **timed})
    return results


def main(argv: list[str]) -> int:
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    chosen = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
    if argv:
        chosen = [p for p in chosen if any(p.name.startswith(a) for a in argv)]
    rows = []
    for path in chosen:
        for row in measure(path):
            rows.append(row)
            print(
                f"{row['chapter']:<28} {row['stepper']:<15} {row['frames']:>3} frames  "
                f"widget {row['build_s']:5.2f} s (+{row['ahead_s']:5.2f} s ahead)  "
                f"click worst {row['worst_click_s']:.3f} s  "
                f"mean {row['mean_click_s']:.3f} s",
                flush=True,
            )
    worst = max(rows, key=lambda r: r["worst_click_s"])
    print(
        f"worst chapter: {worst['chapter']} ({worst['stepper']}), "
        f"{worst['worst_click_s']:.3f} s per click (limit {LIMIT_S} s)"
    )
    return 0 if worst["worst_click_s"] < LIMIT_S else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
