"""The step timeline: its text twin line by line, and the figure's cells, markers and bars."""

from __future__ import annotations

import itertools

import pytest
from matplotlib.figure import Figure

from refimpl.course.runners import SchedulerDriver, run_to_completion
from refimpl.paged import SamplingParams, Scheduler, SchedulerConfig, Sequence
from refimpl.viz.timeline import draw_timeline, timeline_text


@pytest.fixture(autouse=True)
def fresh_seq_ids(monkeypatch):
    monkeypatch.setattr(Sequence, "counter", itertools.count())


def chunk_after_preemption_steps():
    """B is preempted at step 4 and comes back as a 4-token chunk plus 1 token (budget 4)."""
    s = Scheduler(
        SchedulerConfig(num_kvcache_blocks=3, kvcache_block_size=4, max_num_batched_tokens=4)
    )
    a = Sequence(range(3), SamplingParams(max_tokens=8), block_size=4)
    b = Sequence([50], SamplingParams(max_tokens=8), block_size=4)
    return run_to_completion(s, [a, b])


def prefix_hit_steps():
    s = Scheduler(SchedulerConfig(num_kvcache_blocks=8, kvcache_block_size=4))
    driver = SchedulerDriver(s)
    shared = list(range(100, 108))
    driver.add(Sequence(shared + [1], SamplingParams(max_tokens=2), block_size=4))
    driver.step()
    driver.add(Sequence(shared + [2, 3], SamplingParams(max_tokens=2), block_size=4))
    driver.run()
    return driver.steps


def test_text_twin_of_chunked_prefill_after_preemption():
    assert timeline_text(chunk_after_preemption_steps(), num_blocks=3) == "\n".join(
        [
            "step  kind     batch (seq:tokens)  preempted  finished  blocks",
            "0     prefill  0:3 1:1             -          -         2/3",
            "1     decode   0:1 1:1             -          -         2/3",
            "2     decode   0:1 1:1             -          -         3/3",
            "3     decode   0:1 1:1             -          -         3/3",
            "4     decode   0:1                 1          -         2/3",
            "5     decode   0:1                 -          -         2/3",
            "6     decode   0:1                 -          -         3/3",
            "7     decode   0:1                 -          0         0/3",
            "8     prefill  1:4*                -          -         2/3",
            "9     prefill  1:1                 -          -         2/3",
            "10    decode   1:1                 -          -         2/3",
            "11    decode   1:1                 -          -         2/3",
            "12    decode   1:1                 -          1         0/3",
            "13 steps (3 prefill, 10 decode), tokens computed: 22, served by the prefix "
            "cache: 0,",
            "preemptions: 1, peak blocks in use: 3/3",
        ]
    )


def test_text_twin_shows_prefix_hits_and_works_without_pool_size():
    text = timeline_text(prefix_hit_steps())
    assert text.splitlines()[1:] == [
        "0     prefill  0:9                 -          -         3",
        "1     prefill  1:2(+8 cached)      -          -         4",
        "2     decode   0:1 1:1             -          0 1       0",
        "3 steps (2 prefill, 1 decode), tokens computed: 13, served by the prefix cache: 8,",
        "preemptions: 0, peak blocks in use: 4",
    ]


def test_figure_cells_markers_and_bars():
    steps = chunk_after_preemption_steps()
    fig = draw_timeline(steps, num_blocks=3)
    assert isinstance(fig, Figure)
    grid, bars = fig.axes[:2]
    # One cell per (sequence, step) it ran in: 8 for seq 0, 2 + 2 + 3 + 2 for seq 1 (no hit
    # bars here).
    assert len(grid.patches) == sum(len(r.seq_ids) for r in steps) == 17
    chunk_cells = [p for p in grid.patches if p.get_gid() == "chunk"]
    assert [(p.get_x() + 0.45, p.get_y() + 0.4) for p in chunk_cells] == [(8.0, 1.0)]
    markers = sorted(
        (line.get_marker(), float(line.get_xdata()[0]), float(line.get_ydata()[0]))
        for line in grid.lines
    )
    assert markers == [("X", 4.0, 1.0), ("o", 7.45, 0.0), ("o", 12.45, 1.0)]
    assert [t.get_text() for t in grid.get_yticklabels()] == ["seq 0", "seq 1"]
    assert [t.get_text() for t in grid.texts] == ["3", "1", "4", "1"]  # prefill chunk sizes
    assert [p.get_height() for p in bars.patches] == [r.num_blocks_in_use for r in steps]
    assert [float(y) for y in bars.lines[0].get_ydata()] == [3.0, 3.0]  # the pool line


def test_figure_marks_prefix_hits():
    fig = draw_timeline(prefix_hit_steps(), num_blocks=8)
    grid = fig.axes[0]
    # 4 cells + 1 orange hit strip on seq 1's prefill cell; its label shows computed and cached
    # tokens.
    assert len(grid.patches) == 5
    assert [t.get_text() for t in grid.texts] == ["9", "2\n+8"]


def test_long_runs_drop_cell_labels():
    s = Scheduler(SchedulerConfig(num_kvcache_blocks=20, kvcache_block_size=4))
    steps = run_to_completion(
        s, [Sequence(range(5), SamplingParams(max_tokens=60), block_size=4)]
    )
    fig = draw_timeline(steps)
    assert len(steps) == 60 and len(fig.axes[0].texts) == 0
    assert len(fig.axes[1].lines) == 0  # no pool line without num_blocks


def test_bad_input():
    with pytest.raises(ValueError, match="no steps"):
        timeline_text([])
    with pytest.raises(ValueError, match="no steps"):
        draw_timeline([])
    with pytest.raises(ValueError, match="StepRecord"):
        timeline_text([("prefill", 1)])
