"""Chapter 07's split-KV pictures and their text twins (refimpl.viz.split_kv)."""

from __future__ import annotations

import pytest
import torch
from matplotlib.figure import Figure

from refimpl.kernels import reference
from refimpl.kernels.online_softmax import PartialMerge, chunk_partials
from refimpl.viz import Stepper, split_kv


def test_programs_are_dealt_to_sms_in_turn():
    assert split_kv.programs_per_sm(4, 8, 1, 132) == [1] * 32 + [0] * 100
    counts = split_kv.programs_per_sm(32, 8, 3, 132)  # 768 programs: 5 or 6 per SM
    assert sum(counts) == 768 and counts[:108] == [6] * 108 and counts[108:] == [5] * 24
    with pytest.raises(ValueError, match="num_sms"):
        split_kv.programs_per_sm(4, 8, 1, 0)


def test_sm_occupancy_text_and_figure():
    assert split_kv.sm_occupancy_text(4, 8, [1, 4], 132).splitlines() == [
        "4 seqs x 8 KV heads x 1 chunk = 32 programs on 132 SMs: 100 SMs idle, up to 1 "
        "program per SM",
        "4 seqs x 8 KV heads x 4 chunks = 128 programs on 132 SMs: 4 SMs idle, up to 1 "
        "program per SM",
    ]
    fig = split_kv.draw_sm_occupancy(4, 8, [1, 4], 132)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert len(fig.axes[0].patches) == 132
    assert fig.axes[1].get_title() == "4 chunks: 128 programs,\n4 of 132 SMs idle"


def merge_case():
    with torch.device("cpu"):
        gen = torch.Generator().manual_seed(0)
        k, v = torch.randn(2, 10, 4, 2, 8, generator=gen)
        q = torch.randn(1, 4, 8, generator=gen)
        table = torch.tensor([[5, 2, 7, 1]], dtype=torch.int32)
        lens = torch.tensor([13], dtype=torch.int32)
    twin = reference.paged_decode_attention(q, k, v, lens, table)[0, 0]
    return chunk_partials(q[0, 0], k, v, 13, table[0], 0, tokens_per_split=4, block_n=2), twin


def test_merge_frames_follow_a_fresh_merge_and_end_at_the_twin():
    parts, twin = merge_case()
    frames = split_kv.merge_frames(PartialMerge(parts))
    assert [f.label for f in frames] == [
        "4 chunks walked in parallel, nothing merged yet",
        "merge chunk 0: positions 0..3",
        "merge chunk 1: positions 4..7",
        "merge chunk 2: positions 8..11",
        "merge chunk 3: positions 12..12",
    ]
    fresh = PartialMerge(parts)
    for frame in frames[1:]:
        assert frame.state == fresh.step()
    torch.testing.assert_close(
        torch.tensor(frames[-1].state.merged.output), twin, atol=1e-6, rtol=1e-5
    )
    stepper = Stepper(frames, split_kv.merge_drawer(twin), split_kv.merge_state_text)
    text = stepper.strip_text()
    assert text.count("--- step") == 5
    assert sum(line.endswith("  merged") for line in text.splitlines()) == 0 + 1 + 2 + 3 + 4
    last = split_kv.merge_state_text(frames[-1].state).splitlines()
    assert (
        last[-1] == "acc/l[:4] = [" + ", ".join(f"{x:+.3f}" for x in twin[:4].tolist()) + "]"
    )
    assert last[-2].startswith("merged 0..12: m = ")
    assert "chunk 3 x" in last[-3]
    assert split_kv.merge_state_text(frames[0].state).count("merged") == 0
    assert stepper.figure(2).axes[0].get_title() == "chunks merged: 2 of 4"
    merged_once = PartialMerge(parts)
    merged_once.step()
    with pytest.raises(ValueError, match="fresh"):
        split_kv.merge_frames(merged_once)


def test_decode_timings_text_and_figure_from_a_record():
    """A made-up record in the format benchmarks/kernels_gpu.py writes (not a measurement)."""
    shape = dict(
        batch=32,
        context=2048,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        dtype="float16",
        block_size=16,
        kv_bytes=268_435_456,
        sdpa_ms=0.1,
        unsplit_ms=0.5,
        split_ms=0.2,
        auto_splits=3,
        sweep_ms={"1": 0.5, "2": 0.3},
        max_abs_error=1e-3,
    )
    record = dict(
        machine="Some GPU", torch="2.0", triton="3.0", copy_gbps=2000.0, decode=[shape]
    )
    assert split_kv.decode_timings_text(record).splitlines() == [
        "measured on Some GPU (torch 2.0, Triton 3.0); device-to-device copy 2000 GB/s",
        "batch 32, context 2048, 32/8 heads, head_dim 128, float16, block 16:",
        "  SDPA on gathered K/V 0.100 ms | Triton, one chunk 0.500 ms | Triton, 3 chunks "
        "(automatic) 0.200 ms",
        "  split 2.0x SDPA (goal: within 2x), 1342 GB/s = 0.67 of copy bandwidth (goal: at "
        "least 0.5)",
    ]
    fig = split_kv.draw_decode_timings(record)
    time_ax, bw_ax = fig.axes
    assert [round(p.get_height(), 3) for p in time_ax.patches] == [0.1, 0.5, 0.2]
    assert [round(p.get_height()) for p in bw_ax.patches] == [537, 1342]
