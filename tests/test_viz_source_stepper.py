"""show_source shows the live lines it is asked for; the Stepper's strip and frames are the
recorded states."""

from __future__ import annotations

import inspect

import matplotlib
import pytest
from matplotlib.figure import Figure

from refimpl.course.notebook_format import WIDGET_PLACEHOLDER, WIDGET_VIEW, static_widgets
from refimpl.paged.block_manager import BlockManager
from refimpl.viz.source import show_source
from refimpl.viz.stepper import TOOLTIPS, Frame, Stepper, record_frames

matplotlib.use("Agg")


def test_show_source_numbers_are_the_files_own():
    view = show_source(BlockManager.deallocate)
    lines, first = inspect.getsourcelines(BlockManager.deallocate)
    assert view.path == "refimpl/paged/block_manager.py"
    assert view.numbers == tuple(range(first, first + len(lines)))
    assert view.lines[0].startswith("def deallocate(")
    text = view.text().splitlines()
    assert (
        text[0] == f"# refimpl/paged/block_manager.py, lines {first}-{first + len(lines) - 1}"
    )
    assert text[1].startswith(f" {first} def deallocate(")


def test_show_source_excerpt_marks_and_docstring():
    full = show_source(BlockManager.allocate)
    bare = show_source(BlockManager.allocate, docstring=False, mark=["free_block_ids"])
    assert len(bare.lines) < len(full.lines)
    assert '"""' not in "\n".join(bare.lines)
    marked = [bare.lines[i] for i in sorted(bare.marked)]
    assert len(marked) == 1 and "free_block_ids" in marked[0]
    assert bare.text().splitlines()[1 + min(bare.marked)].startswith(">")
    html = bare._repr_html_()
    assert "background:#fff3a8" in html and html.count("\n") == len(bare.lines) - 1
    excerpt = show_source(BlockManager.allocate, start="needed =", stop="if len(")
    assert len(excerpt.lines) == 2 and excerpt.lines[0].lstrip().startswith("needed =")


def test_show_source_rejects_what_it_cannot_find():
    with pytest.raises(ValueError, match="'no such line'"):
        show_source(BlockManager.allocate, mark=["no such line"])
    with pytest.raises(ValueError, match="no Python source"):
        show_source(len)


def _draw(state: tuple[int, ...]) -> Figure:
    figure = Figure(figsize=(2, 1))
    figure.add_subplot().bar(range(len(state)), state)
    return figure


def test_frames_are_the_states_after_each_action():
    pool: list[int] = []
    frames = record_frames(
        lambda: tuple(pool),
        [
            ("push 1", lambda: pool.append(1)),
            ("push 2", lambda: pool.append(2)),
            ("pop", lambda: pool.pop()),
        ],
    )
    assert frames == [
        Frame("start", ()),
        Frame("push 1", (1,)),
        Frame("push 2", (1, 2)),
        Frame("pop", (1,)),
    ]
    stepper = Stepper(frames, _draw, lambda state: f"pool {list(state)}")
    assert stepper.strip_text().splitlines() == [
        "--- step 0/3: start",
        "pool []",
        "--- step 1/3: push 1",
        "pool [1]",
        "--- step 2/3: push 2",
        "pool [1, 2]",
        "--- step 3/3: pop",
        "pool [1]",
    ]
    assert stepper.figure(2).texts[0].get_text() == "step 2/3: push 2"
    widget = stepper.widget()
    slider = widget.children[0].children[3]
    slider.value = 3
    assert slider.max == 3
    play, previous, following = widget.children[0].children[:3]
    assert [c.tooltip for c in (play, previous, following, slider)] == [
        TOOLTIPS[k] for k in ("play", "prev", "next", "slider")
    ]
    assert all(len(TOOLTIPS[k].split()) >= 3 for k in TOOLTIPS)  # a word on what it does
    previous.click()
    assert slider.value == 2
    following.click()
    following.click()
    assert slider.value == 3  # the last step stays the last
    with pytest.raises(ValueError):
        Stepper([], _draw, str)


def test_strip_text_box_folds_the_whole_strip_into_a_closed_box():
    frames = record_frames(lambda: 0, [(f"step {i}", lambda: None) for i in range(30)])
    stepper = Stepper(frames, _draw, lambda state: "a <state> line")
    box = stepper.strip_text_box()
    assert repr(box) == stepper.strip_text()  # what nbval compares: every frame, unchanged
    html = box._repr_html_()
    assert html.startswith("<details><summary>Every frame as text (31 frames)</summary><pre>")
    assert (
        "<details open" not in html
        and "&lt;state&gt;" in html
        and html.count("--- step") == 31
    )
    assert (
        stepper.strip_text_box("Frames 0-30")
        ._repr_html_()
        .startswith("<details><summary>Frames 0-30<")
    )


def test_saved_widget_views_become_one_fixed_line():
    outputs = [
        {
            "output_type": "display_data",
            "metadata": {},
            "data": {"text/plain": "VBox(...)", WIDGET_VIEW: {"model_id": "abc"}},
        },
        {"output_type": "stream", "name": "stdout", "text": "kept\n"},
    ]
    assert static_widgets(outputs) == [
        {
            "output_type": "display_data",
            "metadata": {},
            "data": {"text/plain": WIDGET_PLACEHOLDER},
        },
        outputs[1],
    ]


def test_background_rendering_waits_for_the_cells_to_finish():
    """While a cell runs (a Run All's next cells), the prerender thread draws nothing; it
    draws the frames once the shell has been quiet for a moment."""
    from IPython.core.interactiveshell import InteractiveShell

    from refimpl.viz.stepper import _ACTIVITY

    shell = InteractiveShell.instance()
    drawn: list[int] = []

    def draw(state):
        drawn.append(len(state))
        return _draw(state)

    stepper = Stepper([Frame(f"step {i}", tuple(range(i))) for i in range(3)], draw, str)
    stepper.prerender()
    shell.events.trigger("pre_run_cell", None)  # the next cell starts
    try:
        assert not stepper.rendered(timeout=2 * _ACTIVITY.QUIET_S + 0.5)
        assert drawn == []
    finally:
        shell.events.trigger("post_run_cell", None)
    assert stepper.rendered(timeout=60) and sorted(drawn) == [0, 1, 2]


def test_every_frame_is_drawn_once_and_a_click_only_sends_it():
    """The widget draws frame 0, renders the others ahead in the background, and a click (or
    Play's step, which moves the same slider) shows the cached picture: no frame is drawn
    twice, whether the widget, the strip or both show it."""
    from IPython.core.interactiveshell import InteractiveShell

    from refimpl.viz import stepper as stepper_module
    from refimpl.viz.hidpi import register

    drawn: list[int] = []

    def draw(state):
        drawn.append(len(state))
        return _draw(state)

    frames = [Frame(f"step {i}", tuple(range(i))) for i in range(6)]
    stepper = Stepper(frames, draw, str)
    widget = stepper.widget()
    assert stepper.rendered(timeout=60)
    slider = widget.children[0].children[3]
    for index in [1, 2, 3, 4, 5, 0, 3, 1]:
        slider.value = index
    stepper.strip()
    assert sorted(drawn) == [0, 1, 2, 3, 4, 5]  # each frame drawn exactly once
    # the cached picture is what displaying the Figure itself stores in a notebook
    shell = InteractiveShell.instance()
    register(shell)
    formatter = shell.display_formatter
    assert formatter.format(stepper.shown(2)) == formatter.format(stepper.figure(2))
    play = widget.children[0].children[0]
    assert play.interval == stepper_module.PLAY_INTERVAL_MS >= 1000
    with pytest.raises(ValueError, match="no step 6: steps are 0..5"):
        stepper.shown(6)
