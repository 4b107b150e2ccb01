"""KVCacheManager: prefix hits (never the last token), allocate_slots across groups, watermark,
full-sequence admission, None without side effects, and a random-workload property test."""

import pytest
from hybrid_helpers import action, full, step, swa
from hypothesis import given
from hypothesis import strategies as st

from refimpl.hybrid.invariants import check_pool_invariants
from refimpl.hybrid.kv_cache_manager import KVCacheManager
from refimpl.hybrid.kv_cache_utils import hash_block_tokens
from refimpl.hybrid.request import Request


def free_ids(m):
    return [b.block_id for b in m.block_pool.free_block_queue]


def test_request_hashes_chain_and_grow():
    r = Request("r", [1, 2, 3, 4, 5, 6, 7], hash_block_size=4)
    assert len(r.block_hashes) == 1
    assert r.block_hashes[0] == hash_block_tokens(None, [1, 2, 3, 4])
    r.append_output_token_ids([8])
    assert r.block_hashes[1] == hash_block_tokens(r.block_hashes[0], [5, 6, 7, 8])
    assert Request("s", [9, 2, 3, 4], 4).block_hashes[0] != r.block_hashes[0]


def test_allocate_slots_across_groups_then_decode_frees_window_blocks():
    m = KVCacheManager(
        [full(), swa()], num_blocks=20, max_model_len=64, prefix_cache_retention_interval=None
    )
    r = m.make_request("a", range(10))
    new = step(m, r, 10)
    assert new.get_block_ids() == ([1, 2, 3], [4, 5, 6])
    for t in range(10, 17):  # decode 7 tokens
        r.append_output_token_ids([100 + t])
        step(m, r, 1)
    assert r.num_computed_tokens == 17
    # block 4 left the window of 8 at 11 computed tokens, block 5 at 15; both were full and
    # hashed, so they went to the back of the free queue (still good for a prefix hit)
    assert m.get_block_ids("a") == ([1, 2, 3, 7, 9], [0, 0, 6, 8, 10])
    assert free_ids(m)[-2:] == [4, 5]
    m.free(r)
    assert m.block_pool.get_num_free_blocks() == 19
    check_pool_invariants(m.block_pool, [[]])


def test_get_computed_blocks_never_returns_the_last_token():
    m = KVCacheManager(
        [full(), swa()], num_blocks=20, max_model_len=64, prefix_cache_retention_interval=None
    )
    a = m.make_request("a", range(8))
    step(m, a, 8)
    m.free(a)
    same = m.make_request("b", range(8))
    hits, n, same.shared_prefix_boundary = m.get_computed_blocks(same)
    assert n == 4  # 8 tokens cached, but token 7 must run again for its logits
    assert hits.get_block_ids() == ([1], [3])
    longer = m.make_request("c", range(9))
    hits, n, longer.shared_prefix_boundary = m.get_computed_blocks(longer)
    assert n == 8 and hits.get_block_ids() == ([1, 2], [3, 4])


def test_second_request_reuses_the_prefix_and_allocates_the_rest():
    m = KVCacheManager(
        [full(), swa()], num_blocks=20, max_model_len=64, prefix_cache_retention_interval=None
    )
    a = m.make_request("a", range(16))
    step(m, a, 16)
    m.free(a)
    # free queue: unhashed first, then hashed in reverse table order
    assert free_ids(m)[:1] == [9]
    b = m.make_request("b", [*range(12), 50, 51, 52, 53, 54])
    hits, n, b.shared_prefix_boundary = m.get_computed_blocks(b)
    assert n == 12
    assert hits.get_block_ids() == ([1, 2, 3], [0, 6, 7])
    new = step(m, b, b.num_tokens - n, num_new_computed_tokens=n, new_computed_blocks=hits)
    assert m.get_block_ids("b") == ([1, 2, 3, 9, 10], [0, 6, 7, 11, 12])
    assert new.get_block_ids() == ([9, 10], [11, 12])
    check_pool_invariants(m.block_pool, m.get_blocks("b").blocks)


def test_none_when_it_does_not_fit_and_nothing_changes():
    m = KVCacheManager(
        [full(), swa()], num_blocks=8, max_model_len=64, prefix_cache_retention_interval=None
    )
    a = m.make_request("a", range(12))
    step(m, a, 12)  # 3 + 3 blocks of the 7 usable ones
    m.free(a)
    b = m.make_request("b", range(13))
    hits, n, b.shared_prefix_boundary = m.get_computed_blocks(b)
    assert n == 12
    before = (free_ids(m), [blk.ref_cnt for blk in m.block_pool.blocks])
    c = m.make_request("c", range(100, 130))
    assert m.allocate_slots(c, 30) is None
    assert (free_ids(m), [blk.ref_cnt for blk in m.block_pool.blocks]) == before
    assert m.get_block_ids("c") == ([], [])
    # b fits exactly: full attention revives 3 hits and takes 1 new block; the window revives
    # 2 hits (its first hit block is the null block) and takes 1 new block: 7 blocks
    assert m.coordinator.get_num_blocks_to_allocate("b", 13, hits.blocks, 12) == 7
    assert step(m, b, 1, num_new_computed_tokens=n, new_computed_blocks=hits) is not None
    check_pool_invariants(m.block_pool, m.get_blocks("b").blocks)


def test_watermark_applies_to_waiting_requests_when_others_run():
    m = KVCacheManager([full()], num_blocks=11, max_model_len=64, watermark=0.2)
    assert m.watermark_blocks == 2
    r = m.make_request("r", range(36))  # 9 blocks; 10 are free
    assert m.allocate_slots(r, 36) is None  # vLLM's default: others may be running
    assert m.allocate_slots(r, 36, has_scheduled_reqs=True) is None
    # nobody else is running: no watermark
    assert step(m, r, 36, has_scheduled_reqs=False) is not None


def test_full_sequence_must_fit():
    m = KVCacheManager(
        [full(), swa()], num_blocks=21, max_model_len=400, max_num_batched_tokens=8
    )
    r = m.make_request("r", range(80))
    # first chunk of 8 tokens needs 4 blocks, but the whole request needs 20 for full attention
    # plus the window cap cdiv(7 + 8, 4) + 1 = 5 for the sliding window: 25 > 20
    assert m.allocate_slots(r, 8, full_sequence_must_fit=True) is None
    assert m.block_pool.get_num_free_blocks() == 20
    assert step(m, r, 8) is not None
    short = m.make_request("s", range(40))  # 10 + 5 = 15 <= 16 free
    assert step(m, short, 8, full_sequence_must_fit=True) is not None


def test_bad_arguments_raise_before_any_change():
    m = KVCacheManager([full()], num_blocks=5, max_model_len=64)
    r = m.make_request("r", range(8))
    with pytest.raises(ValueError, match="num_new_tokens"):
        m.allocate_slots(r, 0)  # nothing to compute and nothing to adopt
    with pytest.raises(ValueError, match="cannot schedule"):
        m.allocate_slots(r, 9)
    with pytest.raises(ValueError, match="new_computed_blocks"):
        m.allocate_slots(r, 1, num_new_computed_tokens=4)
    with pytest.raises(ValueError, match="watermark"):
        KVCacheManager([full()], num_blocks=5, max_model_len=64, watermark=1.5)
    assert m.block_pool.get_num_free_blocks() == 4


# --- property test


@given(
    actions=st.lists(action, max_size=30),
    num_blocks=st.integers(2, 40),
    caching=st.booleans(),
    fine=st.booleans(),
)
def test_random_workload_keeps_pool_and_tables_consistent(actions, num_blocks, caching, fine):
    if fine:  # hits may end inside 8-token blocks: partial hits and copy-on-write
        m = KVCacheManager(
            [full(8), swa(2, 5)],
            num_blocks=num_blocks,
            max_model_len=64,
            enable_caching=caching,
            hash_block_size=2,
            alignment_tokens=2,
        )
    else:
        m = KVCacheManager(
            [full(4), swa(4, 8), swa(2, 5)],
            num_blocks=num_blocks,
            max_model_len=64,
            enable_caching=caching,
        )
    live: list[Request] = []
    for i, act in enumerate(actions):
        if act[0] == "add":
            r = m.make_request(f"r{i}", act[1])
            hits, n, r.shared_prefix_boundary = m.get_computed_blocks(r)
            assert n % m.scheduler_block_size == 0 and n < r.num_tokens
            free_before = m.block_pool.get_num_free_blocks()
            if (
                step(
                    m, r, r.num_tokens - n, num_new_computed_tokens=n, new_computed_blocks=hits
                )
                is None
            ):
                assert m.block_pool.get_num_free_blocks() == free_before
            else:
                live.append(r)
        elif act[0] == "run" and live:
            r = live[act[1] % len(live)]
            if r.num_tokens + act[2] > m.max_model_len:
                continue
            r.append_output_token_ids([7] * act[2])
            before = m.get_block_ids(r.request_id)
            freeable = m.coordinator.num_freeable_skipped_blocks(
                r.request_id, r.num_computed_tokens
            )
            free_before = m.block_pool.get_num_free_blocks()
            # only the blocks that left a window were freed (as in vLLM)
            if step(m, r, act[2]) is None:
                assert m.block_pool.get_num_free_blocks() == free_before + freeable
                after = m.get_block_ids(r.request_id)
                assert all(
                    a == b or a == 0 for ga, gb in zip(after, before) for a, b in zip(ga, gb)
                )
                assert [len(g) for g in after] == [len(g) for g in before]
        elif act[0] == "free" and live:
            m.free(live.pop(act[1] % len(live)))
        tables = [blocks for r in live for blocks in m.get_blocks(r.request_id).blocks]
        pending = [
            list(pair)
            for mgr in m.coordinator.single_type_managers
            for pair in mgr.pending_copies
        ]
        check_pool_invariants(m.block_pool, tables + pending + [[]])
        if i % 3 == 2:
            m.take_kv_cache_block_copies()
        for r in live:  # every group covers the computed tokens (null blocks included)
            for mgr, blocks in zip(
                m.coordinator.single_type_managers, m.get_blocks(r.request_id).blocks
            ):
                assert len(blocks) * mgr.block_size >= r.num_computed_tokens
    for r in live:
        m.free(r)
    m.take_kv_cache_block_copies()
    assert m.block_pool.get_num_free_blocks() == num_blocks - 1


def test_partial_hit_copy_on_write_with_fine_alignment():
    # one full-attention group of 8-token blocks, hashes and hit alignment every 4 tokens
    m = KVCacheManager(
        [full(8)], num_blocks=20, max_model_len=64, hash_block_size=4, alignment_tokens=4
    )
    assert m.coordinator.single_type_managers[0].is_fine_grained
    a = m.make_request("A", range(14))
    step(m, a, 14)
    assert m.get_block_ids("A") == ([1, 2],)
    # block 1 is full and hashed; block 2 holds 6 tokens and is registered for its first 4
    # (its own key, standing for 12 tokens, as vLLM files a partial entry)
    assert [m.block_pool.blocks[i].block_hash_num_tokens for i in (1, 2)] == [8, 12]
    assert m.block_pool.cached_block_hashes_by_block == {}
    b = m.make_request("B", [*range(13), 90, 91, 92, 93, 94, 95, 96])
    hits, n, b.shared_prefix_boundary = m.get_computed_blocks(b)
    assert n == 12 and hits.get_block_ids() == ([1, 2],)
    # 1 new + 1 copy
    assert m.coordinator.get_num_blocks_to_allocate("B", 20, hits.blocks, 12) == 2
    new = step(m, b, 8, num_new_computed_tokens=n, new_computed_blocks=hits)
    assert new.get_block_ids() == ([3, 4],)  # the copy first, then the new block
    # B writes tokens 12.. into its own copy of block 2
    assert m.get_block_ids("B") == ([1, 3, 4],)
    pending = [[src, dst] for src, dst in m.coordinator.single_type_managers[0].pending_copies]
    assert [[b.block_id for b in pair] for pair in pending] == [[2, 3]]
    assert [m.block_pool.blocks[i].ref_cnt for i in (1, 2, 3, 4)] == [2, 2, 2, 1]
    check_pool_invariants(
        m.block_pool, [*m.get_blocks("A").blocks, *m.get_blocks("B").blocks, *pending]
    )
    assert m.take_kv_cache_block_copies() == [(0, 2, 3)]
    assert [m.block_pool.blocks[i].ref_cnt for i in (1, 2, 3, 4)] == [2, 1, 1, 1]
    check_pool_invariants(m.block_pool, [*m.get_blocks("A").blocks, *m.get_blocks("B").blocks])
    # A fills block 2: the full key (16 tokens) replaces the partial one as the block's own
    # key, and the prompt's tail boundary (12 tokens) stays reachable as an extra key (vLLM's
    # partial tail block), so a request sharing 13 tokens still reuses 12 of them
    a.append_output_token_ids([50, 51])
    step(m, a, 2)
    assert (
        m.block_pool.blocks[2].block_hash_num_tokens == 16
        and len(m.block_pool.cached_block_hashes_by_block[2]) == 1
    )
    c = m.make_request("C", [*range(13), 70, 71, 72])
    assert m.get_computed_blocks(c)[1] == 12
    d = m.make_request("D", [*range(11), 70, 71, 72])  # shares 11 tokens: only block 1's 8
    assert m.get_computed_blocks(d)[1] == 8
    # with the default alignment (the block size) the same request B would only hit 8 tokens
    coarse = KVCacheManager([full(8)], num_blocks=20, max_model_len=64, hash_block_size=4)
    a2 = coarse.make_request("A", range(14))
    step(coarse, a2, 14)
    assert coarse.get_computed_blocks(coarse.make_request("B", b.prompt_token_ids))[1] == 8


def test_alignment_must_be_a_multiple_of_the_hash_block_size():
    with pytest.raises(ValueError, match="alignment_tokens"):
        KVCacheManager(
            [full(8)], num_blocks=5, max_model_len=64, hash_block_size=4, alignment_tokens=6
        )


def test_running_request_that_does_not_fit_still_frees_its_window_blocks():
    m = KVCacheManager(
        [full(), swa()], num_blocks=10, max_model_len=64, prefix_cache_retention_interval=None
    )
    r = m.make_request("r", range(16))
    step(m, r, 16)  # 4 + 4 blocks, 1 free
    r.append_output_token_ids(list(range(100, 108)))
    # 8 more tokens need 2 + 2 blocks; the 2 window blocks that left the window make only 3
    # free
    assert m.coordinator.num_freeable_skipped_blocks("r", 16) == 2
    assert m.allocate_slots(r, 8) is None
    # as in vLLM, the blocks outside the window were freed before the check, and stay freed
    assert m.get_block_ids("r") == ([1, 2, 3, 4], [0, 0, 7, 8])
    assert [b.block_id for b in m.block_pool.free_block_queue] == [9, 6, 5]
    # 4 tokens need 1 + 1: fits thanks to the freed window blocks
    assert step(m, r, 4) is not None
    assert m.get_block_ids("r")[1][:2] == [0, 0]
    check_pool_invariants(m.block_pool, m.get_blocks("r").blocks)


def test_reserved_blocks_are_kept_out_of_reach():
    m = KVCacheManager([full()], num_blocks=11, max_model_len=64)
    r = m.make_request("r", range(36))  # 9 blocks of the 10 free
    assert m.allocate_slots(r, 36, reserved_blocks=2) is None
    assert m.block_pool.get_num_free_blocks() == 10
    assert step(m, r, 36, reserved_blocks=1) is not None


def test_get_max_num_blocks_bounds_what_a_request_ever_holds():
    # full attention keeps every block; the window of 8 keeps at most cdiv(8 - 1 + 4, 4) + 1 =
    # 4 blocks when a step schedules at most 4 tokens
    m = KVCacheManager(
        [full(), swa()],
        num_blocks=40,
        max_model_len=64,
        max_num_batched_tokens=4,
        prefix_cache_retention_interval=None,
    )
    assert [m.get_max_num_blocks(n) for n in (1, 8, 17, 33)] == [2, 4, 9, 13]
    r = m.make_request("a", range(4))
    step(m, r, 4)
    peak = 0
    for t in range(4, 33):
        r.append_output_token_ids([100 + t])
        step(m, r, 1)
        peak = max(
            peak, sum(1 for group in m.get_block_ids("a") for block_id in group if block_id)
        )
    assert peak == 12 <= m.get_max_num_blocks(33)
    with pytest.raises(ValueError, match="num_tokens"):
        m.get_max_num_blocks(0)


def test_decode_fast_path_leaves_the_same_state_as_the_full_path():
    """allocate_slots skips the coordinator's calls when `has_slots_for` says a step needs no
    block; a manager made to take the full path every time ends every step in the same state
    (tables, free queue, prefix hits), and the fast path did run."""

    def run(fast: bool):
        m = KVCacheManager([full()], num_blocks=12, max_model_len=64)
        answers = []
        has_slots_for = m.coordinator.has_slots_for

        def counted(*args):
            answers.append(fast and has_slots_for(*args))
            return answers[-1]

        m.coordinator.has_slots_for = counted
        states = []
        a = m.make_request("a", range(10))
        step(m, a, 10)
        for t in range(14):  # decode: a block fills every 4 tokens
            a.append_output_token_ids([100 + t])
            step(m, a, 1)
            m.cache_blocks(a, a.num_computed_tokens)
            states.append((m.get_block_ids("a"), free_ids(m)))
        m.free(a)
        b = m.make_request("b", [*range(10), *range(100, 113)])
        hits, n, _ = m.get_computed_blocks(b)
        states.append((hits.get_block_ids(), n, free_ids(m)))
        return states, sum(answers)

    fast_states, taken = run(True)
    full_states, not_taken = run(False)
    assert fast_states == full_states
    assert taken >= 10 and not_taken == 0
    assert fast_states[-1][1] == 20  # the decode tokens were registered as blocks filled
