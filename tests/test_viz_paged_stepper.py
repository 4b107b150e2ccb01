"""Chapter 03's block-manager stepper: every frame equals the real objects stepped afresh."""

from matplotlib.figure import Figure

from refimpl.course.running_example import requests
from refimpl.paged import BlockManager, Sequence, check_invariants
from refimpl.viz import Stepper, record_frames
from refimpl.viz.paged import draw_pool_snapshot, pool_snapshot, pool_snapshot_text
from refimpl.viz.paged_stepper import (
    prefix_cache_actions,
    running_example_actions,
    second_turn_prompt,
)


def recorded():
    bm = BlockManager(8, 4)
    seqs = requests()
    frames = record_frames(lambda: pool_snapshot(bm, seqs), running_example_actions(bm, seqs))
    return frames, bm, seqs


def replay():
    """The same calls written out by hand on fresh objects: the state after each one."""
    bm = BlockManager(8, 4)
    seqs = requests()
    a, b, c = seqs["A"], seqs["B"], seqs["C"]
    states = [pool_snapshot(bm, seqs)]

    def after(_=None):
        check_invariants(bm, [s for s in seqs.values() if s.block_table])
        states.append(pool_snapshot(bm, seqs))

    def compute(seq):
        seq.num_scheduled_tokens = len(seq) - seq.num_cached_tokens
        bm.hash_blocks(seq)
        seq.num_cached_tokens += seq.num_scheduled_tokens
        seq.num_scheduled_tokens = 0

    def decode(seq, token):
        seq.append_token(token)
        assert bm.can_append(seq)
        bm.may_append(seq)
        compute(seq)

    after(bm.allocate(a, bm.can_allocate(a)))
    after(compute(a))
    after(bm.allocate(b, bm.can_allocate(b)))
    after(compute(b))
    after(decode(a, 211))
    after(decode(a, 212))
    after(decode(b, 311))
    after(bm.deallocate(a))
    after(bm.allocate(c, bm.can_allocate(c)))
    after(bm.deallocate(b))
    after(bm.deallocate(c))
    return states


def test_frames_equal_the_real_state_stepped_afresh():
    frames, _, _ = recorded()
    assert [frame.state for frame in frames] == replay()
    assert len(frames) == 12


def test_the_running_example_story():
    frames, bm, _ = recorded()
    by_label = {frame.label: frame.state for frame in frames}
    after_b = by_label["B: allocate(B, can_allocate(B))"]
    assert dict(after_b.tables) == {"A": (0, 1, 2), "B": (0, 1, 3, 4), "C": ()}
    assert [after_b.blocks[i].ref_count for i in (0, 1)] == [2, 2]  # the system prompt, shared
    a_second = by_label["A decodes token 212 (may_append)"]
    assert dict(a_second.tables)["A"] == (0, 1, 2, 5)  # len 13: token 212 starts block L3
    a_freed = by_label["A finishes: deallocate(A)"]
    assert a_freed.free_queue == (6, 7, 5, 2)  # A's own blocks, last block first, to the tail
    c_in = by_label["C: allocate(C, can_allocate(C))"]
    assert dict(c_in.tables)["C"] == (0, 1, 6)
    last = frames[-1].state
    assert all(block.ref_count == 0 for block in last.blocks)
    assert len(last.free_queue) == 8 and bm.num_free_blocks() == 8


def test_text_and_picture_of_each_frame():
    frames, _, _ = recorded()
    stepper = Stepper(frames, draw_pool_snapshot, pool_snapshot_text)
    text = stepper.strip_text()
    assert text.count("--- step ") == 12
    assert "free queue (head -> tail): #0 #1 #2 #3 #4 #5 #6 #7" in text
    assert "   #0    2  " in pool_snapshot_text(frames[3].state)
    for index in (0, 3, 8, 11):
        assert isinstance(stepper.figure(index), Figure)


def test_prefix_cache_frames_equal_the_real_state_stepped_afresh():
    def fresh():
        seqs = requests()
        seqs["A2"] = Sequence(second_turn_prompt(), block_size=4)
        return BlockManager(8, 4), seqs

    bm, seqs = fresh()
    frames = record_frames(lambda: pool_snapshot(bm, seqs), prefix_cache_actions(bm, seqs))

    bm, seqs = fresh()
    a, b, a2 = seqs["A"], seqs["B"], seqs["A2"]
    states = [pool_snapshot(bm, seqs)]

    def compute(seq, n):
        seq.num_scheduled_tokens = n
        bm.hash_blocks(seq)
        seq.num_cached_tokens += n
        seq.num_scheduled_tokens = 0

    def after(_=None):
        check_invariants(bm, [s for s in seqs.values() if s.block_table])
        states.append(pool_snapshot(bm, seqs))

    after(bm.allocate(a, bm.can_allocate(a)))
    after(compute(a, 6))
    after(compute(a, 5))
    for token in (211, 212):
        a.append_token(token)
        bm.may_append(a)
        after(compute(a, 1))
    assert bm.can_allocate(b) == 2
    after(bm.allocate(b, 2))
    after(compute(b, len(b) - b.num_cached_tokens))
    after(bm.deallocate(a))
    assert bm.can_allocate(a2) == 3
    after(bm.allocate(a2, 3))
    after(compute(a2, len(a2) - a2.num_cached_tokens))
    assert [frame.state for frame in frames] == states
    assert second_turn_prompt() == a.token_ids + [221, 222, 223, 224, 225]
    # registration: chunk 1 registers block 0 only, chunk 2 block 1, token 211 block 2
    assert [frames[i].state.cached for i in (2, 3, 4, 5)] == [1, 2, 3, 3]
    assert dict(frames[9].state.tables)["A2"] == (0, 1, 2, 6, 7)
    assert frames[9].state.free_queue == (3,)
