"""explain_prefix_match: the write-up's exact scenario, agreement with can_allocate/allocate on
random states."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.course.paged_scenarios import (
    EXAMPLE_A,
    EXAMPLE_B,
    EXAMPLE_C,
    cached_prefix_after_reuse,
    measure_reusable_prefix_tokens,
    prefix_cache_example,
    reusable_prefix_tokens,
)
from refimpl.course.paged_steps import compute_tokens, decode_step, prefill
from refimpl.course.prefix_match import MatchOutcome, explain_prefix_match
from refimpl.paged import BlockManager, Sequence, check_invariants, compute_hash

O = MatchOutcome


def snapshot(bm: BlockManager):
    return (
        list(bm.free_block_ids),
        sorted(bm.used_block_ids),
        dict(bm.hash_to_block_id),
        [(b.ref_count, b.hash, list(b.token_ids)) for b in bm.blocks],
    )


def test_writeup_example_exact():
    bm, holders, request = prefix_cache_example()
    check_invariants(bm, holders.values())
    assert list(bm.free_block_ids) == [6, 7, 4, 3]
    assert sorted(bm.used_block_ids) == [0, 1, 2, 5]
    before = snapshot(bm)
    m = explain_prefix_match(bm, request)
    assert snapshot(bm) == before
    assert m.outcomes() == [O.HIT_IN_USE, O.HIT_FREE, O.LAST_BLOCK]
    assert [b.block_id for b in m.blocks] == [1, 3, 6]
    assert [(b.ref_count_before, b.ref_count_after) for b in m.blocks] == [
        (1, 2),
        (0, 1),
        (0, 1),
    ]
    assert [b.from_queue_head for b in m.blocks] == [False, False, True]
    assert m.blocks[2].hash is None  # the last block is never hashed for lookup
    assert m.blocks[0].hash == compute_hash(EXAMPLE_A)
    assert m.blocks[1].hash == compute_hash(EXAMPLE_B, compute_hash(EXAMPLE_A))
    assert m.num_cached_blocks == 2 and m.num_cached_tokens == 8
    assert m.num_free_blocks_needed == 2 and m.num_free_blocks == 4 and m.num_fresh_blocks == 1
    assert m.can_allocate == bm.can_allocate(request) == 2
    bm.allocate(request, 2)
    assert request.block_table == [1, 3, 6]
    assert request.num_cached_tokens == 8
    assert bm.blocks[1].ref_count == 2
    assert list(bm.free_block_ids) == [7, 4]
    check_invariants(bm, [*holders.values(), request])


def test_miss_stops_walk_and_later_blocks_are_not_looked_up():
    bm, _, _ = prefix_cache_example()
    # Block 0 matches, block 1 differs, block 2 would match B's content but is never looked up.
    request = Sequence(EXAMPLE_A + EXAMPLE_C + EXAMPLE_B + [9], block_size=4)
    m = explain_prefix_match(bm, request)
    assert m.outcomes() == [O.HIT_IN_USE, O.MISS, O.NOT_LOOKED_UP, O.LAST_BLOCK]
    assert m.blocks[1].cached_block_id is None and "no cached block" in m.blocks[1].reason
    assert m.blocks[2].hash is None
    assert m.num_cached_blocks == 1
    assert [b.block_id for b in m.blocks] == [1, 6, 7, 4]  # fresh blocks in queue order


def test_revived_block_at_queue_head_is_not_also_handed_out_fresh():
    bm = BlockManager(3, 2)
    cached, other = Sequence([1, 2], block_size=2), Sequence([5], block_size=2)
    prefill(bm, cached)  # #0 holds [1, 2], registered
    prefill(bm, other)  # #1
    bm.deallocate(cached)
    bm.deallocate(other)
    assert list(bm.free_block_ids) == [2, 0, 1]
    request = Sequence([1, 2, 9, 9, 9], block_size=2)
    m = explain_prefix_match(bm, request)
    assert m.outcomes() == [O.HIT_FREE, O.MISS, O.LAST_BLOCK]
    assert [b.block_id for b in m.blocks] == [0, 2, 1]  # fresh blocks skip the revived #0
    bm.allocate(request, m.num_cached_blocks)
    assert request.block_table == [0, 2, 1]


def test_collision_is_caught_by_token_check():
    bm, _, _ = prefix_cache_example()
    request = Sequence(EXAMPLE_C + [9], block_size=4)
    fake = compute_hash(EXAMPLE_C)
    bm.hash_to_block_id[fake] = 1  # pretend xxhash gave block #1 (tokens A) the same hash as C
    bm.blocks[1].hash = fake
    m = explain_prefix_match(bm, request)
    assert m.outcomes() == [O.MISS, O.LAST_BLOCK]
    assert m.blocks[0].cached_block_id == 1 and "tokens differ" in m.blocks[0].reason
    assert m.can_allocate == bm.can_allocate(request) == 0


def test_does_not_fit_predicts_no_blocks():
    bm, _, request = prefix_cache_example()
    # 6 blocks, needs 5 > 4 free
    longer = Sequence(EXAMPLE_A + EXAMPLE_B + EXAMPLE_C + list(range(12)), block_size=4)
    m = explain_prefix_match(bm, longer)
    assert m.num_free_blocks_needed == 5 and not m.fits
    assert m.can_allocate == bm.can_allocate(longer) == -1
    assert m.num_cached_tokens == 0
    assert [b.block_id for b in m.blocks[2:]] == [None] * 4
    assert [b.block_id for b in m.blocks[:2]] == [1, 3]  # the cached blocks are still found


def test_prefix_caching_off():
    bm = BlockManager(4, 2, enable_prefix_caching=False)
    prefill(bm, Sequence([1, 2, 3], block_size=2))
    m = explain_prefix_match(bm, Sequence([1, 2, 3], block_size=2))
    assert m.outcomes() == [O.NOT_LOOKED_UP, O.LAST_BLOCK]
    assert m.blocks[0].reason == "prefix caching is off"
    assert m.can_allocate == 0


def test_block_size_mismatch():
    bm = BlockManager(4, 2)
    with pytest.raises(ValueError, match="block_size"):
        explain_prefix_match(bm, Sequence([1, 2, 3], block_size=4))


def test_reusable_prefix_tokens_writeup_numbers():
    assert reusable_prefix_tokens(600, 700, 256) == 512
    # exact match: the last block is recomputed
    assert reusable_prefix_tokens(512, 512, 256) == 256
    assert reusable_prefix_tokens(600, 600, 1) == 599
    assert measure_reusable_prefix_tokens(600, 700, 256) == 512
    assert measure_reusable_prefix_tokens(512, 512, 256) == 256
    with pytest.raises(ValueError, match="cannot exceed"):
        reusable_prefix_tokens(10, 5, 4)
    with pytest.raises(ValueError, match="block_size"):
        reusable_prefix_tokens(10, 20, 0)


@given(st.integers(0, 40), st.integers(1, 40), st.integers(1, 12))
def test_reusable_formula_matches_block_manager(shared, extra, block_size):
    # sometimes a prompt that is all prefix
    prompt_len = shared + extra if shared < 40 else shared
    assert measure_reusable_prefix_tokens(
        shared, prompt_len, block_size
    ) == reusable_prefix_tokens(shared, prompt_len, block_size)


def test_reverse_free_keeps_prefix_longest():
    assert cached_prefix_after_reuse(4, 2) == [4, 4, 3, 2, 1, 0]
    assert cached_prefix_after_reuse(4, 2, reverse_free=False) == [4, 0, 0, 0, 0, 0]


def test_decode_step_adds_blocks_at_boundaries_and_registers_full_blocks():
    bm = BlockManager(3, 4)
    seq = Sequence([1, 2, 3], block_size=4)
    prefill(bm, seq)
    added = [decode_step(bm, seq, t) for t in (4, 5, 6, 7, 8, 9)]
    assert added == [False, True, False, False, False, True]  # tokens 5 and 9 start blocks
    assert seq.block_table == [0, 1, 2] and seq.num_cached_tokens == len(seq) == 9
    assert sorted(bm.hash_to_block_id.values()) == [0, 1]  # two full blocks registered
    assert bm.blocks[1].hash == compute_hash([5, 6, 7, 8], compute_hash([1, 2, 3, 4]))
    for t in (10, 11, 12):
        decode_step(bm, seq, t)
    with pytest.raises(ValueError, match="free queue is empty"):
        decode_step(bm, seq, 13)
    assert len(seq) == 12 and seq.last_token == 12  # unchanged by the failed step
    check_invariants(bm, [seq])


# --- random states
# A prompt is built from an earlier prompt's prefix plus a random tail, so that states are full
# of shared prefixes, freed-but-cached blocks, and hash-table entries overwritten by twins.
prompt_spec = st.tuples(
    st.integers(0, 20), st.integers(0, 14), st.lists(st.integers(1, 3), max_size=6)
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("prefill"), prompt_spec),
        st.tuples(st.just("free"), st.integers(0, 10)),
        # listed twice: frees leave cached blocks to revive
        st.tuples(st.just("free"), st.integers(0, 10)),
        st.tuples(st.just("decode"), st.integers(0, 10), st.integers(1, 3)),
    ),
    max_size=14,
)


def build_prompt(history: list[list[int]], spec) -> list[int]:
    source, cut, tail = spec
    base = history[source % len(history)][:cut] if history else []
    return (base + tail) or [1]


@given(
    st.sampled_from([1, 2, 3]),
    st.integers(3, 12),
    ops,
    st.lists(prompt_spec, min_size=1, max_size=4),
)
def test_agrees_with_block_manager_on_random_states(
    block_size, num_blocks, operations, probes
):
    bm = BlockManager(num_blocks, block_size)
    live: list[Sequence] = []
    history: list[list[int]] = []
    for op in operations:
        if op[0] == "prefill":
            seq = Sequence(build_prompt(history, op[1]), block_size=block_size)
            history.append(list(seq.token_ids))
            if bm.can_allocate(seq) != -1:
                prefill(bm, seq)
                live.append(seq)
        elif live and op[0] == "free":
            bm.deallocate(live.pop(op[1] % len(live)))
        elif live and op[0] == "decode":
            seq = live[op[1] % len(live)]
            try:
                decode_step(bm, seq, op[2])
                history.append(list(seq.token_ids))
            except ValueError:  # no room: preempt, as the scheduler would
                bm.deallocate(seq)
                live.remove(seq)
        check_invariants(bm, live)
    for spec in probes:
        probe = Sequence(build_prompt(history, spec), block_size=block_size)
        before = snapshot(bm)
        m = explain_prefix_match(bm, probe)
        assert snapshot(bm) == before, "explain_prefix_match changed the block manager"
        assert m.can_allocate == bm.can_allocate(probe)
        outcomes = m.outcomes()
        assert outcomes[-1] is O.LAST_BLOCK
        hits = [o in (O.HIT_IN_USE, O.HIT_FREE) for o in outcomes]
        assert hits == sorted(hits, reverse=True)  # hits form a prefix
        assert outcomes.count(O.MISS) <= 1
        if m.fits:
            bm.allocate(probe, m.num_cached_blocks)
            assert probe.block_table == [b.block_id for b in m.blocks]
            assert [bm.blocks[b].ref_count for b in probe.block_table] == [
                b.ref_count_after for b in m.blocks
            ]
            assert probe.num_cached_tokens == m.num_cached_tokens
            live.append(probe)
            check_invariants(bm, live)


def test_compute_tokens_registers_exactly_the_blocks_a_chunk_filled():
    bm = BlockManager(8, 4)
    seq = Sequence(list(range(1, 11)), block_size=4)
    bm.allocate(seq, bm.can_allocate(seq))
    assert compute_tokens(bm, seq, 6) == [seq.block_table[0]]  # tokens 0-5 fill block 0 only
    assert compute_tokens(bm, seq, 4) == [seq.block_table[1]]  # tokens 6-9 fill block 1
    assert seq.num_cached_tokens == 10 and seq.num_scheduled_tokens == 0
    assert sorted(bm.hash_to_block_id.values()) == seq.block_table[:2]
    with pytest.raises(ValueError, match="0 uncomputed tokens"):
        compute_tokens(bm, seq, 1)
    check_invariants(bm, [seq])
