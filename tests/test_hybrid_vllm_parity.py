"""The allocator corner cases where refimpl once differed from vLLM 0.32, and eagle's
last-block drop (the recorded-oracle test checks the same behaviour against vLLM's own
answers)."""

from __future__ import annotations

import pytest

from refimpl.hybrid import KVCacheGroupSpec, KVCacheManager
from tests.hybrid_helpers import full, step, swa


def hashed(m):
    return [b.block_id for b in m.block_pool.blocks if b.block_hash is not None]


def computed_once(groups, n=25, **kw):
    m = KVCacheManager(groups, num_blocks=30, max_model_len=64, **kw)
    step(m, m.make_request("a", range(n)), n)
    return m


def test_eagle_drops_the_last_hit_block_of_full_attention():
    plain = computed_once([full(4)])
    eagle = computed_once([full(4)], use_eagle=True)
    # 25 tokens: 6 full blocks cached; a hit may cover 24 tokens, eagle gives one block back
    assert plain.get_computed_blocks(plain.make_request("b", range(25)))[1] == 24
    hits, n, _ = eagle.get_computed_blocks(eagle.make_request("b", range(25)))
    assert (n, hits.get_block_ids()) == (20, ([1, 2, 3, 4, 5],))


def test_eagle_sliding_window_group_needs_one_more_block_then_drops_it():
    groups = [
        KVCacheGroupSpec(("f",), full(4)),
        KVCacheGroupSpec(("s",), swa(4, 8), is_eagle_group=True),
    ]
    m = computed_once(groups, use_eagle=True)
    assert [mgr.use_eagle for mgr in m.coordinator.single_type_managers] == [False, True]
    hits, n, _ = m.get_computed_blocks(m.make_request("b", range(25)))
    # the window needs cdiv(8 - 1, 4) = 2 blocks before the hit, plus the one eagle drops
    assert (n, hits.get_block_ids()) == (20, ([1, 2, 3, 4, 5], [0, 0, 0, 11, 12]))


def test_eagle_without_a_flagged_group_drops_in_every_group():
    m = computed_once([full(4), swa(4, 8)], use_eagle=True)
    assert [mgr.use_eagle for mgr in m.coordinator.single_type_managers] == [True, True]


def test_a_one_token_window_hashes_nothing_and_never_hits():
    m = computed_once([full(4), swa(4, 1)], n=13)
    assert m.get_block_ids("a") == ([1, 2, 3, 4], [5, 6, 7, 8])
    # only the full-attention blocks; vLLM hashes no 1-token-window block
    assert hashed(m) == [1, 2, 3]
    assert m.get_computed_blocks(m.make_request("b", range(13)))[1] == 0


def test_watermark_holds_back_new_requests_by_default():
    m = KVCacheManager([full()], num_blocks=11, max_model_len=64, watermark=0.2)
    r = m.make_request("r", range(36))
    assert m.allocate_slots(r, 36) is None  # has_scheduled_reqs defaults to True, as in vLLM
    assert m.allocate_slots(r, 36, has_scheduled_reqs=False) is not None


def test_adopting_a_hit_with_no_new_tokens():
    m = computed_once([full(4)], n=9)
    b = m.make_request("b", range(9))
    hits, n, b.shared_prefix_boundary = m.get_computed_blocks(b)
    assert n == 8
    out = m.allocate_slots(b, 0, num_new_computed_tokens=8, new_computed_blocks=hits)
    assert out is not None and out.get_block_ids() == ([],)
    assert m.get_block_ids("b") == ([1, 2],) and [
        blk.ref_cnt for blk in m.block_pool.blocks[1:4]
    ] == [2, 2, 1]
    with pytest.raises(ValueError, match="nothing|no computed tokens"):
        m.allocate_slots(m.make_request("c", range(3)), 0)


def test_failed_allocation_still_frees_blocks_outside_the_window():
    m = KVCacheManager([full(), swa()], num_blocks=10, max_model_len=64)
    r = m.make_request("r", range(16))
    step(m, r, 16)
    r.append_output_token_ids(list(range(100, 108)))
    assert m.block_pool.get_num_free_blocks() == 1
    assert m.allocate_slots(r, 8) is None
    assert m.block_pool.get_num_free_blocks() == 3 and m.get_block_ids("r")[1][:2] == [0, 0]
