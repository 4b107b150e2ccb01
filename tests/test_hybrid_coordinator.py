"""KVCacheCoordinator: one pool for all groups, and the fixed-point prefix hit across
groups."""

import pytest
from hybrid_helpers import full, ids, swa

from refimpl.hybrid.invariants import check_pool_invariants
from refimpl.hybrid.kv_cache_coordinator import HybridKVCacheCoordinator
from refimpl.hybrid.kv_cache_interface import KVCacheGroupSpec
from refimpl.hybrid.request import Request
from refimpl.hybrid.single_type_kv_cache_manager import (
    BlockHashListWithBlockSize,
    FullAttentionManager,
    SlidingWindowManager,
)


def plant(coord, request, group_id, indices):
    """Put cached, free blocks for the given block indices of `request` into one group."""
    pool = coord.block_pool
    spec = coord.specs[group_id]
    hashes = BlockHashListWithBlockSize(
        request.block_hashes, coord.hash_block_size, spec.block_size
    )
    n = max(indices) + 1
    table = [pool.null_block] * n
    for i in indices:
        (table[i],) = pool.get_new_blocks(1)
    pool.cache_full_blocks(hashes, table, 0, n, group_id)
    pool.free_blocks([b for b in table if not b.is_null])
    return {i: table[i].block_id for i in indices}


def test_groups_draw_from_one_pool_and_counts_add_up():
    groups = [
        KVCacheGroupSpec(("L0",), full()),
        KVCacheGroupSpec(("L1",), swa()),
        KVCacheGroupSpec(("L2",), swa()),
    ]
    coord = HybridKVCacheCoordinator(groups, 30)
    assert coord.scheduler_block_size == 4 and coord.hash_block_size == 4
    assert [type(m) for m in coord.single_type_managers] == [
        FullAttentionManager,
        SlidingWindowManager,
        SlidingWindowManager,
    ]
    # equal specs looked up together
    assert [g.group_ids for g in coord.attention_groups] == [[0], [1, 2]]
    assert coord.get_num_blocks_to_allocate("a", 10, None, 0) == 9
    new = coord.allocate_new_blocks("a", 10)
    assert [ids(g) for g in new] == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    coord.remove_skipped_blocks("a", 10)  # skipped 3 tokens: no whole block yet
    assert [ids(g) for g in coord.get_blocks("a")] == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    coord.allocate_new_blocks("a", 17)
    coord.remove_skipped_blocks("a", 16)  # skipped 9 tokens -> 2 blocks per window group
    assert [ids(g) for g in coord.get_blocks("a")] == [
        [1, 2, 3, 10, 11],
        [0, 0, 6, 12, 13],
        [0, 0, 9, 14, 15],
    ]
    assert ids(coord.block_pool.free_block_queue)[:4] == [8, 7, 5, 4]
    check_pool_invariants(coord.block_pool, coord.get_blocks("a"))
    coord.free("a")
    assert coord.block_pool.get_num_free_blocks() == 29
    check_pool_invariants(coord.block_pool, [[]])


def test_fixed_point_shrinks_until_every_group_agrees():
    # full attention, a window of 8 (needs 2 blocks) and a window of 5 (needs 1 block)
    coord = HybridKVCacheCoordinator([full(), swa(window=8), swa(window=5)], 40)
    r = Request("r", list(range(25)), hash_block_size=4)
    fa = plant(coord, r, 0, range(6))  # full attention could serve 24 tokens
    sw8 = plant(coord, r, 1, [0, 1, 2, 3, 5])  # the 8-window: run 2..3 -> 16 tokens
    sw5 = plant(coord, r, 2, [0, 1])  # the 5-window at 16 misses; run at block 1 -> 8 tokens
    hits, length, _ = coord.find_longest_cache_hit(r.block_hashes, r.num_tokens - 1)
    assert length == 8
    assert ids(hits[0]) == [fa[0], fa[1]]
    assert ids(hits[1]) == [sw8[0], sw8[1]]
    # the null block stands for the token outside the window
    assert ids(hits[2]) == [0, sw5[1]]
    # planting the 5-window's block 3 lets all groups agree on 16 tokens
    extra = plant(coord, r, 2, [3])
    hits, length, _ = coord.find_longest_cache_hit(r.block_hashes, 24)
    assert length == 16
    assert ids(hits[0]) == [fa[i] for i in range(4)]
    assert ids(hits[1]) == [0, 0, sw8[2], sw8[3]]
    assert ids(hits[2]) == [0, 0, 0, extra[3]]


def test_a_miss_in_any_group_of_a_spec_group_is_a_miss():
    coord = HybridKVCacheCoordinator([full(), swa(), swa()], 30)
    r = Request("r", list(range(17)), hash_block_size=4)
    plant(coord, r, 0, range(4))
    plant(coord, r, 1, range(4))
    plant(coord, r, 2, [0, 1])  # group 2 misses blocks 2, 3: the shared lookup must stop at 8
    hits, length, _ = coord.find_longest_cache_hit(r.block_hashes, 16)
    assert length == 8
    assert [len(h) for h in hits] == [2, 2, 2]


def test_least_common_multiple_of_block_sizes_can_kill_hits():
    # block sizes 8 and 12: hits must end on multiples of lcm = 24; hashes every gcd = 4 tokens
    coord = HybridKVCacheCoordinator([full(8), swa(12, window=8)], 40)
    assert coord.scheduler_block_size == 24 and coord.hash_block_size == 4
    a = Request("a", list(range(48)), hash_block_size=4)
    coord.allocate_new_blocks("a", 48)
    coord.cache_blocks(a, 48)
    coord.free("a")
    shares_20 = Request("b", list(range(20)) + [999] * 28, hash_block_size=4)
    (fa_alone,) = FullAttentionManager.find_longest_cache_hit(
        shares_20.block_hashes, 47, [0], coord.block_pool, full(8), hash_block_size=4
    )
    assert len(fa_alone) * 8 == 16  # full attention alone could reuse 16 tokens
    _, length, _ = coord.find_longest_cache_hit(shares_20.block_hashes, 47)
    assert length == 0  # ...but 16 is not a multiple of 24: nothing is reused
    shares_30 = Request("c", list(range(30)) + [999] * 18, hash_block_size=4)
    _, length, _ = coord.find_longest_cache_hit(shares_30.block_hashes, 47)
    assert length == 24


def test_bad_hash_block_size_is_rejected():
    with pytest.raises(ValueError, match="must divide"):
        HybridKVCacheCoordinator([full(8), swa(12)], 10, hash_block_size=8)
    with pytest.raises(ValueError, match="at least one"):
        HybridKVCacheCoordinator([], 10)


def test_allocation_that_does_not_fit_allocates_nothing():
    coord = HybridKVCacheCoordinator([full(), swa()], 8)  # 7 usable blocks
    with pytest.raises(ValueError, match="needs 8 new blocks"):
        coord.allocate_new_blocks("a", 16)  # 4 + 4
    assert coord.block_pool.get_num_free_blocks() == 7 and coord.get_blocks("a") == ([], [])
    with pytest.raises(ValueError, match="nothing was allocated"):
        coord.single_type_managers[1].allocate_new_blocks("b", 40)
    assert coord.block_pool.get_num_free_blocks() == 7


def test_blocks_are_cached_only_up_to_an_alignment_boundary():
    # block sizes 8 and 12: a hit can only end on multiples of 24, so nothing past the last
    # multiple of 24 is registered, even a full 8-token block
    coord = HybridKVCacheCoordinator([full(8), swa(12, window=8)], 40)
    a = Request("a", list(range(48)), hash_block_size=4)
    coord.allocate_new_blocks("a", 48)
    coord.cache_blocks(a, 16)
    assert [b.block_hash is not None for b in coord.get_blocks("a")[0]] == [False] * 6
    coord.cache_blocks(a, 40)
    assert [b.block_hash is not None for b in coord.get_blocks("a")[0]] == [True] * 3 + [
        False
    ] * 3
    # the window needs 1 block before a boundary: only block 1 of every 2 is hashed
    assert [b.block_hash is not None for b in coord.get_blocks("a")[1]] == [
        False,
        True,
        False,
        False,
    ]
