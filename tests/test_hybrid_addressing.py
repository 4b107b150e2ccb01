"""Position -> slot for every DeepSeek V4 cache kind, and batch slot mappings that agree with
the per-position rules and never collide between live requests."""

import pytest
import torch

from refimpl.hybrid.addressing import (
    build_batch,
    causal_compressed_entries,
    compressed_slot_for_position,
    dsv4_slots_for_position,
    short_context_topk_indices,
    slot_for_position,
    slot_mapping,
    swa_window_positions,
)
from refimpl.hybrid.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
from refimpl.hybrid.kv_cache_manager import KVCacheManager
from refimpl.kernels.reference_v4 import compressed_slot_mapping, compute_swa_indices_and_lens


def test_standard_slot_and_null_block():
    assert slot_for_position([5, 9], 70, 64) == 9 * 64 + 6
    assert slot_for_position([0, 9], 3, 64) == -1  # freed (null) block holds nothing
    with pytest.raises(ValueError, match="needs block 2"):
        slot_for_position([5, 9], 128, 64)


def test_compressed_slots_follow_the_logical_block():
    mla = [7, 3]
    assert compressed_slot_for_position(mla, 3, 256, 4) == 7 * 64  # first ratio-4 entry
    assert compressed_slot_for_position(mla, 4, 256, 4) == -1  # not the last of its 4 tokens
    assert compressed_slot_for_position(mla, 255, 256, 4) == 7 * 64 + 63
    assert compressed_slot_for_position(mla, 259, 256, 4) == 3 * 64
    assert compressed_slot_for_position(mla, 127, 256, 128) == 7 * 2
    assert compressed_slot_for_position(mla, 383, 256, 128) == 3 * 2
    # entry c lives in logical block c // 64 == pos // 256 for every writing position
    for pos in range(3, 512, 4):
        assert compressed_slot_for_position(mla, pos, 256, 4) // 64 == mla[pos // 256]


def test_every_kind_for_one_position():
    slots = dsv4_slots_for_position(
        255,
        mla_block_ids=[7],
        swa_block_ids=[0, 0, 11, 12],
        c128_state_block_ids=[0] * 31 + [20],
        c4_state_block_ids=[0] * 63 + [30],
    )
    assert slots == {
        "swa_kv": 12 * 64 + 63,
        "c4_kv": 7 * 64 + 63,
        "c4_indexer": 7 * 64 + 63,
        "c128_kv": 7 * 2 + 1,
        "c4_state": 30 * 4 + 3,
        "c128_state": 20 * 8 + 7,
    }


def test_window_and_causal_counts():
    assert swa_window_positions(2, 4) == [0, 1, 2]
    assert swa_window_positions(10, 4) == [7, 8, 9, 10]
    assert [causal_compressed_entries(p, 4) for p in (2, 3, 7, 8)] == [0, 1, 2, 2]
    topk = short_context_topk_indices([2, 3, 9], compress_ratio=4, topk=3)
    assert topk.tolist() == [[-1, -1, -1], [0, -1, -1], [0, 1, -1]]


def test_batch_slot_mapping_matches_per_position_rule():
    tables = [[5, 6, 7], [8, 9]]
    batch = build_batch(
        tables, num_computed_tokens=[7, 3], num_new_tokens=[3, 2], num_padding_tokens=2
    )
    assert batch.query_start_loc.tolist() == [0, 3, 5] and batch.seq_lens.tolist() == [10, 5]
    assert batch.positions.tolist() == [7, 8, 9, 3, 4, -1, -1]
    slots = slot_mapping(batch, 4)
    assert slots.tolist() == [6 * 4 + 3, 7 * 4 + 0, 7 * 4 + 1, 8 * 4 + 3, 9 * 4 + 0, -1, -1]
    # the compressed mapping (ratio 4 over 16-token logical blocks: 4 entries per block)
    comp = compressed_slot_mapping(
        batch.query_start_loc, batch.seq_lens, batch.block_table, 4, 4, num_tokens=7
    )
    expect = [
        compressed_slot_for_position(t, p, 16, 4)
        for t, p in zip([tables[0]] * 3 + [tables[1]] * 2, [7, 8, 9, 3, 4])
    ]
    assert comp.tolist() == expect + [-1, -1]
    with pytest.raises(ValueError, match="one entry per request"):
        build_batch(tables, [1], [1, 2])


def test_batch_slot_mapping_has_the_null_block_guard():
    """A position whose block is the null block (0) has no slot, as in `slot_for_position`."""
    tables = [[0, 6], [8, 0]]
    batch = build_batch(tables, num_computed_tokens=[2, 3], num_new_tokens=[3, 3])
    expect = [
        slot_for_position(t, p, 4)
        for t, p in zip([tables[0]] * 3 + [tables[1]] * 3, [2, 3, 4, 3, 4, 5])
    ]
    assert slot_mapping(batch, 4).tolist() == expect == [-1, -1, 6 * 4, 8 * 4 + 3, -1, -1]


def test_slots_from_the_manager_never_collide():
    full = FullAttentionSpec(block_size=8, num_kv_heads=1, head_size=8, dtype="bfloat16")
    swa = SlidingWindowSpec(
        block_size=4, num_kv_heads=1, head_size=8, dtype="bfloat16", sliding_window=6
    )
    m = KVCacheManager([full, swa], num_blocks=64, max_model_len=128)
    reqs = [
        m.make_request(f"r{i}", range(100 * i, 100 * i + n)) for i, n in enumerate([13, 21, 6])
    ]
    for r in reqs:
        assert m.allocate_slots(r, r.num_tokens) is not None
    for gid, bs in enumerate([8, 4]):
        seen = set()
        for r in reqs:
            ids = m.get_block_ids(r.request_id)[gid]
            slots = [slot_for_position(ids, p, bs) for p in range(r.num_tokens)]
            assert len(set(slots)) == len(slots) and not seen & set(slots)
            seen |= set(slots)
    # the SWA indices of the last token read exactly the window's slots
    r = reqs[1]
    ids = m.get_block_ids(r.request_id)[1]
    batch = build_batch([ids], [r.num_tokens - 1], [1])
    idx, lens = compute_swa_indices_and_lens(
        batch.query_start_loc,
        batch.seq_lens,
        batch.token_to_req_indices,
        batch.is_valid_token,
        batch.block_table,
        4,
        6,
    )
    assert lens.tolist() == [6]
    assert idx[0].tolist() == [
        slot_for_position(ids, p, 4) for p in swa_window_positions(20, 6)
    ]
    assert torch.all(idx >= 0)


def test_window_and_topk_pictures_and_text_twins():
    from matplotlib.figure import Figure

    from refimpl.viz import allocator as V

    text = V.swa_window_text([5, 9, 3], 4, position=10, window=6)
    assert text.splitlines()[1] == "  pos    5 -> block_table[1] =   9, offset  1 -> slot 37"
    assert text.splitlines()[-1].endswith("slot 14")
    text = V.topk_text([7, 3], 16, 4, position=27, local_topk=[0, 2, 5, -1])
    assert (
        text.splitlines()[0] == "token at position 27, ratio 4: 7 usable entries, 4 per block"
    )
    assert text.splitlines()[-1].endswith("block_table[1] = 3, offset 1 -> slot 13")
    # an entry is named by the token that completes it, not by a 4-token span: a ratio-4 entry
    # summarises 8 tokens (chapter 08a)
    assert text.splitlines()[2].startswith("  entry   2 (written by token 11) ->")
    assert isinstance(V.draw_swa_window([5, 9, 3], 4, 10, 6), Figure)
    assert isinstance(V.draw_topk([7, 3], 16, 4, 27, [0, 2, 5, -1]), Figure)
