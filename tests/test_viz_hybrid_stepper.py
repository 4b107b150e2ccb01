"""The hybrid-allocator stepper: every frame equals the state of freshly stepped real
objects."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.figure import Figure

from refimpl.course import hybrid_simulate
from refimpl.hybrid.kv_cache_manager import KVCacheManager
from refimpl.viz.hybrid_stepper import (
    AllocatorState,
    allocator_state,
    allocator_state_text,
    allocator_stepper,
    draw_allocator_state,
    record_allocator_frames,
)

LABELS = hybrid_simulate.MINI_V4_LABELS


def fresh() -> KVCacheManager:
    return KVCacheManager(
        hybrid_simulate.mini_v4_groups(),
        num_blocks=64,
        max_model_len=256,
        prefix_cache_retention_interval=None,
    )


def step(manager: KVCacheManager, request, n: int) -> None:
    assert manager.allocate_slots(request, n) is not None
    request.num_computed_tokens += n


def actions(manager: KVCacheManager, sizes: list[int]):
    a = manager.make_request("A", hybrid_simulate.prompt_tokens(sum(sizes), seed=1))
    out = [(f"A +{n}", (lambda n=n: step(manager, a, n))) for n in sizes]
    out.append(("free A", lambda: manager.free(a)))
    return out


def test_frames_equal_the_state_of_freshly_stepped_objects():
    sizes = [16, 16, 8]
    frames = record_allocator_frames(
        recorded := fresh(), LABELS, ["A"], actions(recorded, sizes)
    )
    assert [f.label for f in frames] == ["start", "A +16", "A +16", "A +8", "free A"]
    replay = fresh()
    todo = actions(replay, sizes)
    assert frames[0].state == allocator_state(replay, LABELS, ["A"])
    for frame, (_, action) in zip(frames[1:], todo):
        action()
        assert frame.state == allocator_state(replay, LABELS, ["A"])
    first = frames[1].state
    # planner C's group order: SWA-a, SWA-b, MLA, C128 state, C4 state, each from the queue
    # head
    assert first.tables == (
        ("A", ((1, 2, 3, 4), (5, 6, 7, 8), (9,), tuple(range(10, 18)), tuple(range(18, 34)))),
    )
    assert first.free_queue[:3] == (34, 35, 36) and first.usage == round(33 / 63, 6)
    assert frames[-1].state.tables == () and frames[-1].state.usage == 0.0


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=6))
def test_every_frame_is_consistent_with_the_pool(sizes):
    manager = fresh()
    frames = record_allocator_frames(manager, LABELS, ["A"], actions(manager, sizes))
    for frame in frames:
        s = frame.state
        free_like = [b for b, o in enumerate(s.owners) if o in ("free", "cached")]
        # a block is free exactly when it is in the queue
        assert sorted(s.free_queue) == free_like
        assert s.owners[0] == "null"
        held = {b for _, groups in s.tables for ids in groups for b in ids if b != 0}
        assert held == {b for b, o in enumerate(s.owners) if ":" in o}
        assert s.usage == round(len(held) / 63, 6)


def test_text_picture_and_bad_labels():
    manager = fresh()
    frames = record_allocator_frames(manager, LABELS, ["A"], actions(manager, [16]))
    text = allocator_state_text(frames[1].state)
    assert text.splitlines()[:2] == [
        "pool: SWA-a=4, SWA-b=4, MLA=1, C128 state=8, C4 state=16,",
        "  free(hashed)=0, free=30, null=1; usage 0.524",
    ]
    assert max(len(line) for line in text.splitlines()) <= 95
    assert "free queue (30), head -> tail: 34 35 36 37 38 39 ... 58 59 60 61 62 63" in text
    assert isinstance(draw_allocator_state(frames[1].state), Figure)
    stepper = allocator_stepper(frames)
    assert stepper.strip_text().count("--- step") == 3
    with pytest.raises(ValueError):
        allocator_state(manager, LABELS[:2], ["A"])


def test_long_block_tables_wrap_and_show_every_id():
    """A table longer than the figure's width goes on in a "cont." line, so every block id is
    written, in order, at 8 pt inside its cell, and the picture stays MAX_WIDTH wide."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from refimpl.viz.palette import MAX_WIDTH

    ids = tuple(range(1, 64))  # one 63-entry table: wider than one line at 8 pt
    state = AllocatorState(
        labels=("MLA",),
        owners=("null",) + ("MLA:A",) * 63,
        tables=(("A", (ids,)),),
        free_queue=(),
        hashed=(),
        usage=1.0,
    )
    fig = draw_allocator_state(state)
    assert fig.get_size_inches()[0] <= MAX_WIDTH
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    table_ax = fig.axes[1]
    labels = [t.get_text() for t in table_ax.texts if t.get_ha() == "right"]
    assert labels[0] == "MLA" and set(labels[1:]) == {"cont."}
    written = [t for t in table_ax.texts if t.get_text().isdigit()]
    assert [int(t.get_text()) for t in written] == list(ids)
    cells = [p.get_window_extent(renderer) for p in table_ax.patches]
    for text, cell in zip(written, cells):
        box = text.get_window_extent(renderer)
        assert text.get_fontsize() >= 8
        assert cell.x0 < box.x0 and box.x1 < cell.x1, text.get_text()


def life_with_a_prefix_hit(manager: KVCacheManager):
    """Chapter 12's stepper script: A in chunks, a decode token, B from A's prefix, then
    free(A)."""
    a = manager.make_request("A", hybrid_simulate.prompt_tokens(40, seed=1))
    b = manager.make_request(
        "B", hybrid_simulate.prompt_tokens(45, seed=2, shared_prefix=a.prompt_token_ids[:35])
    )

    def start_b():
        hit, hit_len, b.shared_prefix_boundary = manager.get_computed_blocks(b)
        assert hit_len == 32
        assert manager.allocate_slots(
            b, b.num_tokens - hit_len, num_new_computed_tokens=hit_len, new_computed_blocks=hit
        )
        b.num_computed_tokens = b.num_tokens

    def decode_a():
        a.append_output_token_ids([5])
        step(manager, a, 1)

    return [
        ("A 16", lambda: step(manager, a, 16)),
        ("A 16", lambda: step(manager, a, 16)),
        ("A 8", lambda: step(manager, a, 8)),
        ("A decode", decode_a),
        ("B hit", start_b),
        ("free A", lambda: manager.free(a)),
    ]


def test_prefix_hit_frames_show_shared_owners_and_hashes():
    recorded = fresh()
    frames = record_allocator_frames(
        recorded, LABELS, ["A", "B"], life_with_a_prefix_hit(recorded)
    )
    replay = fresh()
    for frame, (_, action) in zip(frames[1:], life_with_a_prefix_hit(replay)):
        action()
        assert frame.state == allocator_state(replay, LABELS, ["A", "B"])
    with_b = frames[5].state
    # A's first two MLA blocks, shared
    assert with_b.owners[9] == "MLA:A+B" and with_b.owners[24] == "MLA:A+B"
    assert with_b.usage == round(54 / 63, 6) and with_b.owners.count("cached") == 9
    after = frames[6].state
    assert [rid for rid, _ in after.tables] == ["B"] and after.owners[9] == "MLA:B"
    # A's unhashed blocks go to the front of the queue
    assert after.free_queue[:3] == (6, 21, 10)
    assert set(after.hashed) >= {9, 24}


def test_long_runs_of_null_blocks_fold_into_one_cell():
    from refimpl.viz.hybrid_stepper import table_cells

    assert table_cells([0] * 8 + [3]) == ["."] * 8 + ["3"]
    assert table_cells([0] * 9 + [3, 0, 4]) == ["(9 nulls)", "3", ".", "4"]
    assert table_cells([5] + [0] * 20) == ["5", "(20 nulls)"]
    assert table_cells([]) == ["(empty)"]


def test_a_long_hashed_list_folds_and_keeps_every_id():
    """Chapter 12's strip lists 46 hashed blocks: folded under the first id, every id kept,
    no line over 95 columns (it was one 158-column line)."""
    hashed = tuple(range(100, 146))
    state = AllocatorState(
        labels=("MLA",),
        owners=("null",) + ("cached",) * 63,
        tables=(),
        free_queue=(),
        hashed=hashed,
        usage=0.0,
    )
    lines = allocator_state_text(state).splitlines()
    assert max(len(line) for line in lines) <= 95
    start = next(i for i, line in enumerate(lines) if line.startswith("hashed blocks (46): "))
    ids = " ".join(lines[start:]).split(": ", 1)[1].split()
    assert ids == [str(b) for b in hashed]
    assert lines[start + 1].startswith(" " * len("hashed blocks (46): "))
