"""BlockPool: exact block ids for the null block, free order and prefix-cache hits, plus a
property test that checks the pool's invariants after every random operation."""

import pytest
from hybrid_helpers import free_ids, ids
from hypothesis import given
from hypothesis import strategies as st

from refimpl.errors import InvariantError
from refimpl.hybrid.block_pool import BlockPool
from refimpl.hybrid.invariants import check_pool_invariants
from refimpl.hybrid.kv_cache_utils import (
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    get_group_id,
    make_block_hash_with_group_id,
)

H = [bytes([i]) * 8 for i in range(10)]  # stand-in block hashes


def test_null_block_is_block_zero_and_never_handed_out():
    pool = BlockPool(5)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert free_ids(pool) == [1, 2, 3, 4]
    assert pool.get_num_free_blocks() == 4
    assert ids(pool.get_new_blocks(4)) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="only 0 are free"):
        pool.get_new_blocks(1)
    assert pool.get_usage() == 1.0
    check_pool_invariants(pool)


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="null block"):
        BlockPool(0)
    with pytest.raises(ValueError, match="positive integer"):
        BlockPool(True)  # a bool is not a block count
    pool = BlockPool(3)
    with pytest.raises(ValueError, match=">= 0"):
        pool.get_new_blocks(-1)
    assert free_ids(pool) == [1, 2]


def test_free_order_unhashed_to_front_hashed_to_back():
    pool = BlockPool(7)
    table = pool.get_new_blocks(4)  # [1, 2, 3, 4]
    pool.cache_full_blocks(H, table, 0, 2, kv_cache_group_id=0)  # blocks 1, 2 hashed
    assert free_ids(pool) == [5, 6]
    pool.free_blocks(reversed(table))  # a manager frees tail first: 4, 3, 2, 1
    # 4 and 3 (no hash) are prepended in the order given; 2 and 1 (hashed) appended.
    assert free_ids(pool) == [4, 3, 5, 6, 2, 1]
    assert pool.get_usage() == 0.0
    check_pool_invariants(pool)


def test_free_order_without_caching_is_all_front():
    pool = BlockPool(5, enable_caching=False)
    table = pool.get_new_blocks(2)
    pool.free_blocks(reversed(table))
    assert free_ids(pool) == [2, 1, 3, 4]


def test_prefix_hit_revives_a_lazily_freed_block():
    pool = BlockPool(6)
    table = pool.get_new_blocks(3)  # 1, 2, 3
    pool.cache_full_blocks(H, table, 0, 3, kv_cache_group_id=0)
    pool.free_blocks(reversed(table))
    assert free_ids(pool) == [4, 5, 3, 2, 1]
    hit = pool.get_cached_block(H[1], [0])
    assert ids(hit) == [2]
    pool.touch(hit)
    assert hit[0].ref_cnt == 1
    assert free_ids(pool) == [4, 5, 3, 1]
    # a miss in any group is a miss
    assert pool.get_cached_block(H[1], [0, 1]) is None
    check_pool_invariants(pool, [hit])


def test_reuse_evicts_the_hash():
    pool = BlockPool(3)
    table = pool.get_new_blocks(2)
    pool.cache_full_blocks(H, table, 0, 2, kv_cache_group_id=0)
    pool.free_blocks(reversed(table))
    assert free_ids(pool) == [2, 1]
    (b,) = pool.get_new_blocks(1)
    assert b.block_id == 2 and b.block_hash is None
    assert pool.get_cached_block(H[1], [0]) is None  # block 2 held H[1]
    assert ids(pool.get_cached_block(H[0], [0])) == [1]
    check_pool_invariants(pool, [[b]])


def test_keys_are_per_group_and_duplicates_are_kept():
    pool = BlockPool(6)
    a = pool.get_new_blocks(1)
    b = pool.get_new_blocks(1)
    c = pool.get_new_blocks(1)
    pool.cache_full_blocks([H[7]], a, 0, 1, kv_cache_group_id=0)
    pool.cache_full_blocks([H[7]], b, 0, 1, kv_cache_group_id=0)  # same prefix computed twice
    pool.cache_full_blocks([H[7]], c, 0, 1, kv_cache_group_id=3)
    assert len(pool.cached_block_hash_to_block) == 2
    assert ids(pool.get_cached_block(H[7], [0, 3])) == [1, 3]  # first inserted wins
    key = make_block_hash_with_group_id(H[7], 3)
    assert get_group_id(key) == 3 and key[:8] == H[7]
    pool.free_blocks(a)
    pool.get_new_blocks(2)  # head: 4, 5
    (reused,) = pool.get_new_blocks(1)  # block 1 (hashed) is taken last
    assert reused.block_id == 1
    assert ids(pool.get_cached_block(H[7], [0])) == [2]  # the duplicate still answers
    check_pool_invariants(pool)


def test_null_and_masked_blocks_are_never_hashed():
    pool = BlockPool(5)
    table = [pool.null_block, *pool.get_new_blocks(3)]
    pool.cache_full_blocks(
        H, table, 0, 4, kv_cache_group_id=1, block_mask=[True, True, False, True]
    )
    assert [b.block_hash is not None for b in table] == [False, True, False, True]
    check_pool_invariants(pool)


def test_touch_and_free_of_null_block_do_not_queue_it():
    pool = BlockPool(3)
    pool.touch([pool.null_block, pool.null_block])
    pool.free_blocks([pool.null_block])
    assert free_ids(pool) == [1, 2]
    check_pool_invariants(pool)


def test_reset_prefix_cache_only_when_idle():
    pool = BlockPool(4)
    table = pool.get_new_blocks(2)
    pool.cache_full_blocks(H, table, 0, 2, kv_cache_group_id=0)
    assert pool.reset_prefix_cache() is False
    pool.free_blocks(table)
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block(H[0], [0]) is None
    assert all(b.block_hash is None for b in pool.blocks)
    check_pool_invariants(pool)


def test_double_free_is_an_invariant_error():
    pool = BlockPool(3)
    table = pool.get_new_blocks(1)
    pool.free_blocks(table)
    with pytest.raises(InvariantError):
        pool.free_blocks(table)


def test_free_queue_links_and_operations():
    blocks = [KVCacheBlock(i) for i in range(5)]
    q = FreeKVCacheBlockQueue(blocks)
    q.remove(blocks[2])
    assert ids(q) == [0, 1, 3, 4] and len(q) == 4
    assert q.popleft().block_id == 0
    q.prepend_n([blocks[2], blocks[0]])
    assert ids(q) == [2, 0, 1, 3, 4]
    q.append(q.popleft())
    assert ids(q) == [0, 1, 3, 4, 2]
    with pytest.raises(ValueError, match="already in the free queue"):
        q.append(blocks[1])
    assert ids(q.popleft_n(5)) == [0, 1, 3, 4, 2]
    with pytest.raises(ValueError):
        q.popleft()
    with pytest.raises(ValueError, match="not in the free queue"):
        q.remove(blocks[0])


def test_invariant_checker_catches_corruption():
    pool = BlockPool(4)
    table = pool.get_new_blocks(1)
    check_pool_invariants(pool, [table])
    table[0].ref_cnt = 2
    with pytest.raises(InvariantError, match="ref counts"):
        check_pool_invariants(pool, [table])
    table[0].ref_cnt = 1
    pool.free_block_queue.fake_free_list_head.next_free_block.prev_free_block = None
    with pytest.raises(InvariantError, match="free queue"):
        check_pool_invariants(pool)


# --- property test
op = st.one_of(
    st.tuples(st.just("alloc"), st.integers(0, 4)),
    st.tuples(st.just("free"), st.integers(0, 20), st.booleans()),
    st.tuples(st.just("cache"), st.integers(0, 20), st.integers(0, 5), st.integers(0, 1)),
    st.tuples(st.just("hit"), st.integers(0, 5), st.integers(0, 1)),
    st.tuples(
        st.just("reset"),
    ),
    st.tuples(st.just("partial"), st.integers(0, 20), st.integers(0, 5), st.integers(0, 1)),
)


@given(num_blocks=st.integers(1, 9), ops=st.lists(op, max_size=40), caching=st.booleans())
def test_pool_invariants_hold_under_random_operations(num_blocks, ops, caching):
    pool = BlockPool(num_blocks, enable_caching=caching)
    tables: list[list[KVCacheBlock]] = []
    for o in ops:
        kind = o[0]
        if kind == "alloc":
            n = o[1]
            if n > pool.get_num_free_blocks():
                before = free_ids(pool)
                with pytest.raises(ValueError):
                    pool.get_new_blocks(n)
                assert free_ids(pool) == before  # nothing changed
            else:
                tables.append(pool.get_new_blocks(n))
        elif kind == "free" and tables:
            table = tables.pop(o[1] % len(tables))
            pool.free_blocks(reversed(table) if o[2] else table)
        elif kind == "cache" and tables and caching:
            table = tables[o[1] % len(tables)]
            pool.cache_full_blocks(
                [H[o[2]]] * len(table), table, 0, len(table), kv_cache_group_id=o[3]
            )
        elif kind == "hit":
            hit = pool.get_cached_block(H[o[1]], [o[2]])
            if hit is not None:
                assert hit[0].block_hash == make_block_hash_with_group_id(H[o[1]], o[2])
                pool.touch(hit)
                tables.append(hit)
        elif kind == "partial" and tables and caching and tables[o[1] % len(tables)]:
            table = tables[o[1] % len(tables)]
            pool.cache_partial_block(
                H[o[2]], table[-1], kv_cache_group_id=o[3], num_tokens=o[2] + 1
            )
        elif kind == "reset":
            assert pool.reset_prefix_cache() == (not any(tables))
        check_pool_invariants(pool, tables + [[]])
        in_use = {b.block_id for t in tables for b in t}
        assert pool.get_num_free_blocks() == num_blocks - 1 - len(in_use)


def test_partial_keys_follow_vllm_rules():
    pool = BlockPool(4)
    (b,) = pool.get_new_blocks(1)
    pool.cache_partial_block(H[1], b, kv_cache_group_id=0, num_tokens=2)
    assert (
        b.block_hash == make_block_hash_with_group_id(H[1], 0) and b.block_hash_num_tokens == 2
    )
    # a longer prefix ending in the same block replaces the shorter one
    pool.cache_partial_block(H[2], b, kv_cache_group_id=0, num_tokens=3)
    assert pool.get_cached_block(H[1], [0]) is None and ids(
        pool.get_cached_block(H[2], [0])
    ) == [1]
    check_pool_invariants(pool, [[b]])
    # the block becomes full: its partial key is promoted to the full one
    pool.cache_full_blocks([H[3]], [b], 0, 1, kv_cache_group_id=0, block_size=4)
    assert pool.get_cached_block(H[2], [0]) is None and ids(
        pool.get_cached_block(H[3], [0])
    ) == [1]
    assert b.block_hash_num_tokens == 4
    # a shorter prefix inside a full block becomes an extra key of it
    pool.cache_partial_block(H[4], b, kv_cache_group_id=0, num_tokens=2)
    assert ids(pool.get_cached_block(H[4], [0])) == [1] and ids(
        pool.get_cached_block(H[3], [0])
    ) == [1]
    assert pool.cached_block_hashes_by_block == {1: [make_block_hash_with_group_id(H[4], 0)]}
    check_pool_invariants(pool, [[b]])
    pool.free_blocks([b])
    pool.get_new_blocks(3)  # reuse evicts both keys
    assert (
        pool.get_cached_block(H[3], [0]) is None and pool.get_cached_block(H[4], [0]) is None
    )
    check_pool_invariants(pool)


def test_partially_cached_block_is_freed_to_the_back_and_evicted_on_reuse():
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    pool.cache_partial_block(H[5], a, kv_cache_group_id=0, num_tokens=2)
    pool.free_blocks([a, b])
    assert free_ids(pool) == [2, 3, 1]  # b (no key) in front, a (partial key) at the back
    pool.get_new_blocks(3)
    assert pool.get_cached_block(H[5], [0]) is None and pool.cached_block_hashes_by_block == {}
    check_pool_invariants(pool)
