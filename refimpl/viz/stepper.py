"""Step through a mechanism: frames recorded from the real objects, played with a slider or
shown as a strip.

A chapter records frames by running real calls (`record_frames`), each frame a snapshot of the
objects' state after one call. In JupyterLab `Stepper.widget()` plays them with Play/Prev/Next
buttons and a slider while the picture redraws; `Stepper.strip()` shows the very same frames as
a static strip of pictures (and `strip_text()` as text, or `strip_text_box()` folded into a
closed box when it is long), for GitHub, nbval and print, where widgets do not run. Tests check
that each frame equals the state of freshly stepped real objects.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from refimpl.viz.reveal import Answer

State = TypeVar("State")


@dataclass(frozen=True)
class Frame(Generic[State]):
    """One step: what was done (`label`) and a snapshot of the state after it."""

    label: str
    state: State


def record_frames(
    snapshot: Callable[[], State],
    actions: Iterable[tuple[str, Callable[[], Any]]],
    initial_label: str = "start",
) -> list[Frame[State]]:
    """Frame 0 is the state before any action; frame i is the state after the i-th action.

    `snapshot()` must return an immutable copy of the state (the objects keep changing).
    """
    frames = [Frame(initial_label, snapshot())]
    for label, action in actions:
        action()
        frames.append(Frame(label, snapshot()))
    return frames


class ShownFigure:
    """A frame's picture already rendered: the PNG and text a notebook stores for a Figure
    (refimpl.viz.hidpi's picture, the Figure's repr), shown by `display` without drawing
    again."""

    def __init__(self, figure) -> None:
        from refimpl.viz.hidpi import hidpi_png

        self.png, self.size = hidpi_png(figure)
        self.text = repr(figure)

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"image/png": self.png, "text/plain": self.text}, {"image/png": self.size}

    def __repr__(self) -> str:
        return self.text


class _KernelActivity:
    """Whether the IPython shell is between cells: the background rendering of a stepper's
    frames waits for a quiet moment, so a Run All's later cells do not share the CPU with it
    (it added a third to chapter 12's Run All when it did)."""

    QUIET_S = 0.5  # idle this long after a cell before a frame is drawn in the background

    def __init__(self) -> None:
        self.running = False
        self.last_end = 0.0
        self.watching = False

    def watch(self) -> None:
        """Follow the shell's cells (once), if there is a shell."""
        if self.watching:
            return
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is None:
            return
        shell.events.register("pre_run_cell", self._start)
        shell.events.register("post_run_cell", self._end)
        # the cell that made the widget ends right after it; count the quiet from now
        self.last_end = time.monotonic()
        self.watching = True

    def _start(self, *_args) -> None:
        self.running = True

    def _end(self, *_args) -> None:
        self.running = False
        self.last_end = time.monotonic()

    def wait_quiet(self) -> None:
        """Return once no cell has run for QUIET_S seconds (at once outside IPython)."""
        while self.watching and (
            self.running or time.monotonic() - self.last_end < self.QUIET_S
        ):
            time.sleep(0.1)


_ACTIVITY = _KernelActivity()

#: Play's pace: one step every PLAY_INTERVAL_MS. A shown frame costs only sending its cached
# PNG (a few ms), and a frame not yet rendered is drawn before the next step is taken (the
# slider's observer runs one change at a time), so Play never queues frames faster than they
# draw.
PLAY_INTERVAL_MS = 1200

# What each control of `Stepper.widget()` does, shown when the pointer rests on it.
TOOLTIPS = {
    "play": "Play the steps one after another (pause, stop, loop)",
    "prev": "Go back one step",
    "next": "Go forward one step",
    "slider": "Drag to any step; the picture and the state text follow",
}


class Stepper(Generic[State]):
    """Frames plus how to draw one (`draw(state) -> Figure`) and describe it (`describe(state)
    -> str`)."""

    def __init__(
        self,
        frames: list[Frame[State]],
        draw: Callable[[State], Any],
        describe: Callable[[State], str],
    ) -> None:
        if not frames:
            raise ValueError("Stepper needs at least one frame")
        self.frames = list(frames)
        self.draw = draw
        self.describe = describe
        self._shown: dict[int, ShownFigure] = {}
        self._rendering = threading.Lock()  # one frame drawn at a time, each drawn once
        self._prerender: threading.Thread | None = None

    def __len__(self) -> int:
        return len(self.frames)

    def figure(self, index: int):
        """The picture of frame `index`, titled with its step number and label."""
        frame = self.frames[index]
        figure = self.draw(frame.state)
        # Above the picture's top edge (the notebook trims to what is drawn), never over its
        # own title.
        figure.suptitle(
            self.caption(index),
            fontsize=10,
            x=0.01,
            ha="left",
            va="bottom",
            y=1.0 + 0.05 / figure.get_figheight(),
        )
        return figure

    def shown(self, index: int) -> ShownFigure:
        """Frame `index`'s picture as a notebook shows it, drawn once and then cached: the
        widget and the strip display the same rendered PNG, so a click never redraws."""
        if not -len(self.frames) <= index < len(self.frames):
            raise ValueError(f"no step {index}: steps are 0..{len(self.frames) - 1}")
        index %= len(self.frames)
        with self._rendering:
            if index not in self._shown:
                self._shown[index] = ShownFigure(self.figure(index))
            return self._shown[index]

    def prerender(self) -> threading.Thread:
        """Render every frame not yet cached, in a background thread (started once) that draws
        only while no cell runs, so the kernel stays free for the next cells and the frames
        are ready while the reader looks at the first one."""
        if self._prerender is None:
            _ACTIVITY.watch()

            def render_all() -> None:
                for index in range(len(self.frames)):
                    _ACTIVITY.wait_quiet()
                    self.shown(index)

            self._prerender = threading.Thread(
                target=render_all, name="stepper-prerender", daemon=True
            )
            self._prerender.start()
        return self._prerender

    def rendered(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds (None: for ever) for `prerender` to finish; whether
        every frame is cached."""
        if self._prerender is not None:
            self._prerender.join(timeout)
        return len(self._shown) == len(self.frames)

    def caption(self, index: int) -> str:
        return f"step {index}/{len(self.frames) - 1}: {self.frames[index].label}"

    def strip_text(self) -> str:
        """Every frame as text: the static twin that nbval checks."""
        blocks = []
        for index, frame in enumerate(self.frames):
            blocks.append(f"--- {self.caption(index)}\n{self.describe(frame.state)}")
        return "\n".join(blocks)

    def strip_text_box(self, summary: str | None = None) -> Answer:
        """The text strip in one closed `<details>` box: a strip of many frames stays one click
        away instead of burying the page, while its plain text, which nbval compares, is
        `strip_text()`."""
        return Answer(
            self.strip_text(), summary or f"Every frame as text ({len(self.frames)} frames)"
        )

    def strip(self, every: int = 1) -> None:
        """Show every `every`-th frame's picture, one under another (the last frame always)."""
        from IPython.display import display

        indices = list(range(0, len(self.frames), every))
        if indices[-1] != len(self.frames) - 1:
            indices.append(len(self.frames) - 1)
        for index in indices:
            display(self.shown(index))

    def widget(self):
        """An ipywidgets player: Play, a slider and the picture and text of the current
        frame.

        Each frame is drawn once: the first frame here, the others by `prerender` in the
        background while the reader looks at it (the strip shares the same cache), so a click
        or a Play step only sends a cached PNG: milliseconds instead of a redraw's second or
        more.
        """
        import ipywidgets as widgets
        from IPython.display import display

        texts = [self.describe(frame.state) for frame in self.frames]
        last = len(self.frames) - 1
        slider = widgets.IntSlider(
            value=0,
            min=0,
            max=last,
            description="step",
            continuous_update=False,
            tooltip=TOOLTIPS["slider"],
        )
        play = widgets.Play(
            value=0,
            min=0,
            max=last,
            interval=PLAY_INTERVAL_MS,
            description="play",
            tooltip=TOOLTIPS["play"],
        )
        widgets.jslink((play, "value"), (slider, "value"))
        width = widgets.Layout(width="80px")
        previous = widgets.Button(description="◀ prev", layout=width, tooltip=TOOLTIPS["prev"])
        following = widgets.Button(
            description="next ▶", layout=width, tooltip=TOOLTIPS["next"]
        )
        output = widgets.Output()

        def render(index: int) -> None:
            output.clear_output(wait=True)
            with output:
                display(self.shown(index))
                print(texts[index])

        previous.on_click(lambda _: setattr(slider, "value", max(0, slider.value - 1)))
        following.on_click(lambda _: setattr(slider, "value", min(last, slider.value + 1)))
        slider.observe(lambda change: render(change["new"]), names="value")
        render(0)
        self.prerender()
        return widgets.VBox([widgets.HBox([play, previous, following, slider]), output])
