"""The traced online softmax (tile by tile) ends equal to the decode kernel's torch twin and
the Triton kernel; split into chunks, the chunks' partial results merge to the same answer."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import refimpl.kernels as kernels
from refimpl.kernels import reference
from refimpl.kernels.online_softmax import (
    MergeState,
    OnlineSoftmax,
    PartialMerge,
    chunk_partials,
    merge_partials,
    paged_decode_online,
    paged_decode_split,
)
from refimpl.kernels.triton_setup import HAS_TRITON
from refimpl.viz import Stepper
from refimpl.viz.softmax_stepper import (
    draw_softmax_state,
    softmax_drawer,
    softmax_frames,
    softmax_state_text,
)


def paged_case(seed, block_size, seqlens, num_kv_heads=2, group=2, head_dim=8):
    """(q, k_cache, v_cache, seqlens, block_table) on the CPU: the walk is a CPU teaching
    tool."""
    with torch.device("cpu"):
        return _paged_case(seed, block_size, seqlens, num_kv_heads, group, head_dim)


def _paged_case(seed, block_size, seqlens, num_kv_heads, group, head_dim):
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in seqlens]
    num_blocks = sum(need) + 2
    perm = torch.randperm(num_blocks, generator=gen).tolist()  # scattered pages
    width = max(need)
    table = torch.full((len(seqlens), width), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(need):
        table[b, :n] = torch.tensor(perm[used : used + n], dtype=torch.int32)
        used += n
    k = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    q = torch.randn(len(seqlens), num_kv_heads * group, head_dim, generator=gen) * 2
    return q, k, v, torch.tensor(seqlens, dtype=torch.int32), table


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    block_size=st.integers(1, 6),
    block_n=st.integers(1, 9),
    seqlens=st.lists(st.integers(1, 20), min_size=1, max_size=3),
)
def test_online_softmax_equals_the_torch_twin(seed, block_size, block_n, seqlens):
    q, k, v, lens, table = paged_case(seed, block_size, seqlens)
    want = reference.paged_decode_attention(q, k, v, lens, table)
    got = paged_decode_online(q, k, v, lens, table, block_n=block_n)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
def test_online_softmax_equals_the_triton_kernel(kernel_device):
    q, k, v, lens, table = paged_case(3, 4, [10, 6, 1])
    on_device = [t.to(kernel_device) for t in (q, k, v, lens, table)]
    torch.testing.assert_close(
        paged_decode_online(q, k, v, lens, table, block_n=32),
        kernels.paged_decode_attention(*on_device).cpu(),
        atol=1e-5,
        rtol=1e-5,
    )


def test_invariants_after_every_tile():
    q, k, v, lens, table = paged_case(7, 4, [10])
    walk = OnlineSoftmax(q[0, 3], k, v, 10, table[0], kv_head=1, block_n=4)
    keys = reference.gather_kv(k, table, lens, 10)[0, :, 1]
    values = reference.gather_kv(v, table, lens, 10)[0, :, 1]
    scores = keys @ q[0, 3] / math.sqrt(8)
    while not walk.done():
        s = walk.step()
        n = s.positions_done
        # after each tile: m is the max so far, l and acc are the sums under that max
        assert s.m == pytest.approx(float(scores[:n].max()), abs=1e-6)
        assert s.l == pytest.approx(float(torch.exp(scores[:n] - s.m).sum()), rel=1e-5)
        torch.testing.assert_close(
            torch.tensor(s.acc), torch.exp(scores[:n] - s.m) @ values[:n], atol=1e-5, rtol=1e-5
        )
    assert walk.state().tiles_done == 3
    with pytest.raises(ValueError, match="nothing left"):
        walk.step()


def test_stepper_frames_follow_the_walk_and_end_at_the_twin():
    q, k, v, lens, table = paged_case(0, 4, [10, 6])
    frames = softmax_frames(OnlineSoftmax(q[0, 3], k, v, 10, table[0], kv_head=1, block_n=4))
    assert [f.state.positions_done for f in frames] == [0, 4, 8, 10]
    assert [f.label for f in frames[1:]] == [
        "tile 0: positions 0..3",
        "tile 1: positions 4..7",
        "tile 2: positions 8..9",
    ]
    fresh = OnlineSoftmax(q[0, 3], k, v, 10, table[0], kv_head=1, block_n=4)
    for frame in frames[1:]:
        assert frame.state == fresh.step()
    twin = reference.paged_decode_attention(q, k, v, lens, table)[0, 3]
    torch.testing.assert_close(
        torch.tensor(frames[-1].state.output), twin, atol=1e-6, rtol=1e-5
    )
    keys = reference.gather_kv(k, table, lens, 10)[0, :, 1]
    stepper = Stepper(
        frames, softmax_drawer(keys @ q[0, 3] / math.sqrt(8), twin), softmax_state_text
    )
    assert stepper.strip_text().count("--- step") == 4
    assert stepper.figure(2).axes[0].get_title() == "scores read: 8 of 10"
    with pytest.raises(ValueError, match="3 scores given"):
        draw_softmax_state(frames[2].state, [0.0, 1.0, 2.0], twin.tolist())


def test_bad_input():
    q, k, v, lens, table = paged_case(0, 4, [10])
    with pytest.raises(ValueError, match="one query head"):
        OnlineSoftmax(q[0], k, v, 10, table[0], 0, 4)
    with pytest.raises(ValueError, match="block_n"):
        OnlineSoftmax(q[0, 0], k, v, 10, table[0], 0, 0)
    with pytest.raises(ValueError, match="seqlen"):
        OnlineSoftmax(q[0, 0], k, v, 13, table[0], 0, 4)
    with pytest.raises(ValueError, match="kv_head"):
        OnlineSoftmax(q[0, 0], k, v, 10, table[0], 2, 4)
    walk = OnlineSoftmax(q[0, 0], k, v, 10, table[0], 0, 4)
    walk.step()
    with pytest.raises(ValueError, match="fresh"):
        softmax_frames(walk)


# --- split-KV: partial results per chunk and their merge


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    block_size=st.integers(1, 6),
    tokens_per_split=st.integers(1, 12),
    block_n=st.integers(1, 5),
    seqlens=st.lists(st.integers(1, 24), min_size=1, max_size=3),
)
def test_split_partials_merged_equal_the_torch_twin(
    seed, block_size, tokens_per_split, block_n, seqlens
):
    q, k, v, lens, table = paged_case(seed, block_size, seqlens)
    want = reference.paged_decode_attention(q, k, v, lens, table)
    got = paged_decode_split(
        q, k, v, lens, table, tokens_per_split=tokens_per_split, block_n=block_n
    )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_chunk_partial_is_the_walk_over_its_positions_and_merging_adjacent_chunks_is_one_walk():
    q, k, v, lens, table = paged_case(11, 3, [14])
    parts = chunk_partials(
        q[0, 1], k, v, 14, table[0], kv_head=0, tokens_per_split=5, block_n=2
    )
    assert [(p.start, p.stop) for p in parts] == [(0, 5), (5, 10), (10, 14)]
    keys = reference.gather_kv(k, table, lens, 14)[0, :, 0]
    values = reference.gather_kv(v, table, lens, 14)[0, :, 0]
    scores = keys @ q[0, 1] / math.sqrt(8)
    for p in parts:  # each chunk: its own max, and sums under that max
        chunk = scores[p.start : p.stop]
        assert p.m == pytest.approx(float(chunk.max()), abs=1e-6)
        assert p.l == pytest.approx(float(torch.exp(chunk - p.m).sum()), rel=1e-6)
        torch.testing.assert_close(
            torch.tensor(p.acc), torch.exp(chunk - p.m) @ values[p.start : p.stop]
        )
    merged = merge_partials(merge_partials(parts[0], parts[1]), parts[2])
    whole = OnlineSoftmax(q[0, 1], k, v, 14, table[0], kv_head=0, block_n=2).run()
    assert (merged.start, merged.stop, merged.m) == (0, 14, whole.m)
    assert merged.l == pytest.approx(whole.l, rel=1e-6)
    torch.testing.assert_close(
        torch.tensor(merged.acc), torch.tensor(whole.acc), atol=1e-6, rtol=1e-6
    )
    with pytest.raises(ValueError, match="not adjacent"):
        merge_partials(parts[0], parts[2])


def test_partial_merge_steps_and_rescale_factors():
    q, k, v, lens, table = paged_case(2, 4, [13])
    parts = chunk_partials(
        q[0, 0], k, v, 13, table[0], kv_head=0, tokens_per_split=4, block_n=4
    )
    merge = PartialMerge(parts)
    assert merge.state() == MergeState(tuple(parts), 0, None, (1.0, 1.0))
    first = merge.step()
    assert first.merged == parts[0] and first.weights == (0.0, 1.0)
    second = merge.step()
    m = max(parts[0].m, parts[1].m)
    assert second.merged.m == m
    assert second.weights == (math.exp(parts[0].m - m), math.exp(parts[1].m - m))
    # the chunk holding the larger max keeps its sums as they are
    assert max(second.weights) == 1.0
    final = merge.run()
    assert final.count == 4 and merge.done()
    twin = reference.paged_decode_attention(q, k, v, lens, table)[0, 0]
    torch.testing.assert_close(torch.tensor(final.merged.output), twin, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="nothing left"):
        merge.step()
    with pytest.raises(ValueError, match="at least one"):
        PartialMerge([])
    with pytest.raises(ValueError, match="not adjacent"):
        PartialMerge([parts[1], parts[0]])


def test_chunk_walks_check_their_range():
    q, k, v, lens, table = paged_case(0, 4, [10])
    with pytest.raises(ValueError, match="start"):
        OnlineSoftmax(q[0, 0], k, v, 10, table[0], 0, 4, start=10)
    with pytest.raises(ValueError, match="tokens_per_split"):
        chunk_partials(q[0, 0], k, v, 10, table[0], 0, tokens_per_split=0, block_n=4)
    walk = OnlineSoftmax(q[0, 0], k, v, 10, table[0], 0, block_n=4, start=6)
    assert walk.num_tiles == 1 and walk.run().positions_done == 10
