"""Single-type managers with tiny specs: exact block ids for allocation, free order, prefix
hits (with null blocks in front for sliding windows) and sliding-window freeing."""

import pytest
from hybrid_helpers import free_ids, full, ids, swa

from refimpl.hybrid.block_pool import BlockPool
from refimpl.hybrid.invariants import check_pool_invariants
from refimpl.hybrid.kv_cache_interface import (
    KVCacheGroupSpec,
    UniformTypeKVCacheSpecs,
    unwrap_spec,
)
from refimpl.hybrid.request import Request
from refimpl.hybrid.single_type_kv_cache_manager import (
    BlockHashListWithBlockSize,
    FullAttentionManager,
    SlidingWindowManager,
    make_manager,
)


def req(rid, tokens, h=4):
    return Request(rid, list(tokens), hash_block_size=h)


def run_to(manager, request, num_tokens):
    """Allocate for `num_tokens` and cache what is full, as allocate_slots would."""
    manager.allocate_new_blocks(request.request_id, num_tokens)
    manager.cache_blocks(request, num_tokens)  # dense retention (None), the manager's default


def test_make_manager_picks_the_kind_and_unwraps_uniform_specs():
    pool = BlockPool(4)
    assert type(make_manager(full(), pool, 0)) is FullAttentionManager
    assert type(make_manager(swa(), pool, 1)) is SlidingWindowManager
    uni = UniformTypeKVCacheSpecs(block_size=4, kv_cache_specs={"a": swa(), "b": swa()})
    assert unwrap_spec(uni) == swa()
    # a group stands for its spec
    assert unwrap_spec(KVCacheGroupSpec(["a", "b"], uni)) == swa()
    assert type(make_manager(uni, pool, 2)) is SlidingWindowManager


def test_hash_view_takes_the_last_sub_boundary():
    hashes = [bytes([i]) for i in range(10)]
    view = BlockHashListWithBlockSize(hashes, 4, 16)
    assert len(view) == 2 and view[0] == bytes([3]) and view[1] == bytes([7])
    with pytest.raises(ValueError, match="multiple"):
        BlockHashListWithBlockSize(hashes, 4, 6)


def test_full_attention_allocate_cache_free_order():
    pool = BlockPool(10)
    m = FullAttentionManager(full(), pool, 0)
    a = req("a", range(10))
    assert m.get_num_blocks_to_allocate("a", 10) == 3
    run_to(m, a, 10)
    assert ids(m.req_to_blocks["a"]) == [1, 2, 3]
    assert [b.block_hash is not None for b in m.req_to_blocks["a"]] == [True, True, False]
    # growing to 13 tokens: one more block
    assert m.get_num_blocks_to_allocate("a", 13) == 1
    assert ids(m.allocate_new_blocks("a", 13)) == [4]
    m.free("a")
    # tail first: 4, 3 have no hash -> front (in that order); 2, 1 hashed -> back
    assert free_ids(pool) == [4, 3, 5, 6, 7, 8, 9, 2, 1]
    check_pool_invariants(pool, [[]])


def test_full_attention_hit_stops_at_first_miss_and_eviction_shortens_it():
    pool = BlockPool(10)
    m = FullAttentionManager(full(), pool, 0)
    a = req("a", range(12))
    run_to(m, a, 12)
    m.free("a")  # blocks 1, 2, 3 hashed, queue: 4..9, 3, 2, 1
    b = req("b", [*range(8), 99, 98, 97, 96, 95])
    (hit,) = FullAttentionManager.find_longest_cache_hit(b.block_hashes, 12, [0], pool, full())
    assert ids(hit) == [1, 2]  # block 3 holds different tokens
    # the last token is never looked up: max_length 11 allows only 2 blocks of a as well
    (hit,) = FullAttentionManager.find_longest_cache_hit(a.block_hashes, 11, [0], pool, full())
    assert ids(hit) == [1, 2]
    # alignment 8 trims a 3-block hit (12 tokens) to 8 tokens
    (hit,) = FullAttentionManager.find_longest_cache_hit(
        a.block_hashes, 12, [0], pool, full(), alignment_tokens=8
    )
    assert ids(hit) == [1, 2]
    # allocating 7 blocks reaches block 3 at the queue's tail end: its hash is evicted
    other = FullAttentionManager(full(), pool, 0)
    other.allocate_new_blocks("x", 7 * 4)
    assert ids(other.req_to_blocks["x"]) == [4, 5, 6, 7, 8, 9, 3]
    (hit,) = FullAttentionManager.find_longest_cache_hit(a.block_hashes, 12, [0], pool, full())
    assert ids(hit) == [1, 2]
    other.allocate_new_blocks("x", 8 * 4)  # block 2 goes next: the hit shrinks to one block
    (hit,) = FullAttentionManager.find_longest_cache_hit(a.block_hashes, 12, [0], pool, full())
    assert ids(hit) == [1]


def test_hit_blocks_are_touched_and_counted():
    pool = BlockPool(10)
    m = FullAttentionManager(full(), pool, 0)
    a = req("a", range(12))
    run_to(m, a, 12)
    m.free("a")
    b = req("b", [*range(8), 1, 2, 3, 4, 5])
    (hit,) = FullAttentionManager.find_longest_cache_hit(b.block_hashes, 12, [0], pool, full())
    # 13 tokens -> 4 blocks; 2 hits are free (ref 0) so they count as taken from the queue
    assert m.get_num_blocks_to_allocate("b", 13, hit, total_computed_tokens=8) == 2 + 2
    m.allocate_new_computed_blocks("b", hit, 8)
    assert [blk.ref_cnt for blk in hit] == [1, 1]
    assert ids(m.allocate_new_blocks("b", 13)) == [4, 5]
    assert ids(m.req_to_blocks["b"]) == [1, 2, 4, 5]
    check_pool_invariants(pool, [m.req_to_blocks["b"]])


def test_sliding_window_frees_out_of_window_blocks_backwards():
    pool = BlockPool(10)
    m = SlidingWindowManager(swa(bs=4, window=8), pool, 0)
    m.allocate_new_blocks("a", 20)
    assert ids(m.req_to_blocks["a"]) == [1, 2, 3, 4, 5]
    # the next token is token 20; it reads 13..20, so tokens 0..12 (3 whole blocks) are dead
    assert m.get_num_skipped_tokens(20) == 13
    removed = m.remove_skipped_blocks("a", 20)
    assert ids(removed) == [3, 2, 1]
    assert ids(m.req_to_blocks["a"]) == [0, 0, 0, 4, 5]
    assert free_ids(pool) == [3, 2, 1, 6, 7, 8, 9]  # unhashed: to the front, order kept
    # a second call stops at the first null: nothing more to free
    assert m.remove_skipped_blocks("a", 21) == []
    removed = m.remove_skipped_blocks("a", 25)  # 25 - 7 = 18 -> 4 blocks
    assert ids(removed) == [4]
    m.free("a")
    assert free_ids(pool) == [5, 4, 3, 2, 1, 6, 7, 8, 9]
    check_pool_invariants(pool, [[]])


def test_sliding_window_counts_skipped_blocks_for_new_requests():
    pool = BlockPool(20)
    m = SlidingWindowManager(swa(bs=4, window=8), pool, 0)
    # 40 tokens with a 32-token hit: the hit's first 25 tokens are outside the window (6
    # blocks)
    hits = [pool.null_block] * 6 + pool.get_new_blocks(2)
    pool.free_blocks(hits[6:])
    assert (
        m.get_num_blocks_to_allocate("a", 40, hits, total_computed_tokens=32) == (10 - 8) + 2
    )
    assert m.max_admission_blocks_per_request() is None
    capped = SlidingWindowManager(swa(bs=4, window=8), pool, 1, max_in_flight_tokens=16)
    assert capped.max_admission_blocks_per_request() == 7  # cdiv(7 + 16, 4) + 1
    assert capped.get_num_blocks_to_allocate("z", 400, apply_admission_cap=True) == 7
    assert capped.get_num_blocks_to_allocate("z", 400) == 100


def _cached_swa(pool, tokens, bs=4, window=8, alignment=None):
    m = SlidingWindowManager(swa(bs, window), pool, 0, alignment_tokens=alignment)
    a = req("a", tokens)
    run_to(m, a, len(tokens))
    m.free("a")
    return a


def test_sliding_window_hit_has_nulls_in_front():
    pool = BlockPool(10)
    a = _cached_swa(pool, range(16))  # blocks 1..4 hashed
    spec = swa()
    (hit,) = SlidingWindowManager.find_longest_cache_hit(a.block_hashes, 15, [0], pool, spec)
    # 3 blocks fit in 15 tokens; the window needs cdiv(7, 4) = 2 blocks before the hit point
    assert ids(hit) == [0, 2, 3]
    # evict block 1 (the first): full attention would lose everything, the window does not care
    pool.get_new_blocks(5)  # takes 5..9
    assert ids(pool.get_new_blocks(1)) == [4]
    assert ids(pool.get_new_blocks(1)) == [3]
    # now blocks 1 and 2 remain: a hit of 2 blocks ending at token 8
    (hit,) = SlidingWindowManager.find_longest_cache_hit(a.block_hashes, 15, [0], pool, spec)
    assert ids(hit) == [1, 2]


def test_sliding_window_hit_shrinks_when_a_hash_is_removed():
    pool = BlockPool(10)
    a = _cached_swa(pool, range(16))
    spec = swa()
    (hit,) = SlidingWindowManager.find_longest_cache_hit(a.block_hashes, 16, [0], pool, spec)
    assert ids(hit) == [0, 0, 3, 4]
    pool.get_new_blocks(5)
    assert ids(pool.get_new_blocks(1)) == [4]  # the last block's hash is gone
    (hit,) = SlidingWindowManager.find_longest_cache_hit(a.block_hashes, 16, [0], pool, spec)
    assert ids(hit) == [0, 2, 3]
    pool.get_new_blocks(1)  # block 3 gone too: run 1, 2 from the start
    (hit,) = SlidingWindowManager.find_longest_cache_hit(a.block_hashes, 16, [0], pool, spec)
    assert ids(hit) == [1, 2]
    # block 2 gone: only block 1 from the start, still a valid 4-token hit
    pool.get_new_blocks(1)
    (hit,) = SlidingWindowManager.find_longest_cache_hit(a.block_hashes, 16, [0], pool, spec)
    assert ids(hit) == [1]


def test_sliding_window_hashes_only_blocks_before_alignment_boundaries():
    pool = BlockPool(12)
    m = SlidingWindowManager(swa(bs=4, window=8), pool, 0, alignment_tokens=16)
    assert (
        m.reachable_block_mask(0, 8, 16, m.kv_cache_spec, False)
        == [False, False, True, True] * 2
    )
    a = req("a", range(32))
    run_to(m, a, 32)
    assert [b.block_hash is not None for b in m.req_to_blocks["a"]] == [
        False,
        False,
        True,
        True,
    ] * 2
    m.free("a")
    (hit,) = SlidingWindowManager.find_longest_cache_hit(
        a.block_hashes, 31, [0], pool, swa(), alignment_tokens=16
    )
    assert ids(hit) == [0, 0, 3, 4]  # hit ends at token 16, the only boundary below 31
    (hit,) = SlidingWindowManager.find_longest_cache_hit(
        a.block_hashes, 32, [0], pool, swa(), alignment_tokens=16
    )
    assert ids(hit) == [0, 0, 0, 0, 0, 0, 7, 8]


def test_free_order_of_a_sliding_window_request_with_hashes():
    pool = BlockPool(12)
    m = SlidingWindowManager(swa(bs=4, window=8), pool, 0, alignment_tokens=16)
    a = req("a", range(32))
    run_to(m, a, 32)
    m.free("a")
    # reversed table 8..1: unhashed 6, 5, 2, 1 to the front in that order; hashed 8, 7, 4, 3
    # back
    assert free_ids(pool) == [6, 5, 2, 1, 9, 10, 11, 8, 7, 4, 3]


def test_sliding_window_hit_ends_only_on_an_alignment_boundary():
    # every block hashed (the window needs 2 blocks = a whole 8-token segment, so no mask)
    pool = BlockPool(12)
    m = SlidingWindowManager(swa(bs=4, window=8), pool, 0, alignment_tokens=8)
    assert m.reachable_block_mask(0, 5, 8, m.kv_cache_spec, False) is None
    a = req("a", range(24))
    run_to(m, a, 24)
    assert all(b.block_hash is not None for b in m.req_to_blocks["a"])
    m.free("a")
    # blocks 3 and 4 are a cached run ending at token 20, but 20 is not a multiple of 8
    (hit,) = SlidingWindowManager.find_longest_cache_hit(
        a.block_hashes, 20, [0], pool, swa(), alignment_tokens=8
    )
    assert ids(hit) == [0, 0, 3, 4]  # ends at token 16
    (hit,) = SlidingWindowManager.find_longest_cache_hit(a.block_hashes, 20, [0], pool, swa())
    assert ids(hit) == [0, 0, 0, 4, 5]  # block-size alignment: ends at token 20


def test_tokens_computed_elsewhere_that_left_the_window_need_no_blocks():
    # 40 tokens already computed without local hits (e.g. loaded by a KV connector): the window
    # of 8 only needs tokens 33.. of the 48, so the first (40 - 7) // 4 = 8 blocks are never
    # allocated
    pool = BlockPool(20)
    m = SlidingWindowManager(swa(bs=4, window=8), pool, 0)
    assert m.get_num_blocks_to_allocate("a", 48, (), total_computed_tokens=40) == 12 - 8
    assert (
        FullAttentionManager(full(), pool, 1).get_num_blocks_to_allocate("a", 48, (), 40) == 12
    )
