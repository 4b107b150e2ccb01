"""Bad input gets a clear ValueError, raised before anything changes (the state is compared
before and after)."""

import pytest

from refimpl.paged import BlockManager, SamplingParams, Sequence, check_invariants


def snapshot(bm, *seqs):
    """Everything observable about a manager and some sequences, as plain values."""
    return (
        [(b.block_id, b.ref_count, b.hash, list(b.token_ids)) for b in bm.blocks],
        dict(bm.hash_to_block_id),
        list(bm.free_block_ids),
        set(bm.used_block_ids),
        [
            (
                s.token_ids[:],
                s.num_tokens,
                s.num_cached_tokens,
                s.num_scheduled_tokens,
                s.block_table[:],
            )
            for s in seqs
        ],
    )


def prefilled(bm, token_ids):
    seq = Sequence(token_ids, block_size=bm.block_size)
    bm.allocate(seq, bm.can_allocate(seq))
    seq.num_scheduled_tokens = seq.num_tokens - seq.num_cached_tokens
    bm.hash_blocks(seq)
    seq.num_cached_tokens, seq.num_scheduled_tokens = seq.num_tokens, 0
    return seq


def assert_unchanged_after_value_error(bm, seqs, action, match):
    before = snapshot(bm, *seqs)
    with pytest.raises(ValueError, match=match):
        action()
    assert snapshot(bm, *seqs) == before
    check_invariants(bm, [s for s in seqs if s.block_table and s.block_size == bm.block_size])


@pytest.fixture
def busy():
    """A 6-block manager (block size 4) with two running sequences sharing a cached first
    block."""
    bm = BlockManager(6, 4)
    a = prefilled(bm, [1, 2, 3, 4, 5, 6])
    b = prefilled(bm, [1, 2, 3, 4, 7])
    assert (a.block_table, b.block_table) == ([0, 1], [0, 2])
    return bm, a, b


# --- construction
def test_empty_prompt():
    with pytest.raises(ValueError, match="empty prompt"):
        Sequence([])
    with pytest.raises(ValueError, match="empty prompt"):
        Sequence(iter(()), block_size=4)


@pytest.mark.parametrize("block_size", [0, -4, 2.0, True, "4", None])
def test_non_positive_or_non_integer_block_size(block_size):
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        Sequence([1, 2], block_size=block_size)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        BlockManager(4, block_size)


@pytest.mark.parametrize("num_blocks", [0, -1, 3.0, False, None])
def test_non_positive_or_non_integer_pool_size(num_blocks):
    with pytest.raises(
        ValueError, match=r"num_blocks \(the pool size\) must be a positive integer"
    ):
        BlockManager(num_blocks, 4)


@pytest.mark.parametrize("flag", [None, 1, "no"])
def test_prefix_caching_flag_must_be_a_bool(flag):
    with pytest.raises(ValueError, match="enable_prefix_caching must be True or False"):
        BlockManager(4, 4, enable_prefix_caching=flag)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_tokens": 0}, "max_tokens must be an integer >= 1"),
        ({"max_tokens": -1}, "max_tokens must be an integer >= 1"),
        ({"temperature": -0.5}, "temperature must be >= 0"),
    ],
)
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


# --- allocate
def test_allocate_when_it_does_not_fit(busy):
    bm, a, b = busy
    too_big = Sequence(range(100, 117), block_size=4)  # 5 blocks, 3 free
    assert bm.can_allocate(too_big) == -1
    assert_unchanged_after_value_error(
        bm, [a, b, too_big], lambda: bm.allocate(too_big, 0), "needs 5 free blocks but only 3"
    )


def test_allocate_does_not_fit_even_with_a_freed_hit(busy):
    bm, a, b = busy
    bm.deallocate(b)  # block 2 freed; block 0 still used by a
    bm.deallocate(a)  # blocks 1 and 0 freed, block 0 still cached
    hog = prefilled(bm, range(500, 508))  # takes blocks 3 and 4
    # 4 blocks: 1 freed hit + 3 new
    seq = Sequence([1, 2, 3, 4] + list(range(600, 612)), block_size=4)
    assert len(bm.free_block_ids) == 4 and bm.can_allocate(seq) == 1
    hog2 = prefilled(bm, [9])  # one fewer free block: now it cannot fit
    assert bm.can_allocate(seq) == -1
    assert_unchanged_after_value_error(
        bm, [hog, hog2, seq], lambda: bm.allocate(seq, 1), "needs 4 free blocks but only 3"
    )


def test_allocate_twice(busy):
    bm, a, b = busy
    assert_unchanged_after_value_error(
        bm, [a, b], lambda: bm.allocate(a, 0), "already has blocks"
    )


@pytest.mark.parametrize("num_cached_blocks", [2, 3, -1, 1.0, True])
def test_num_cached_blocks_beyond_the_real_hits(busy, num_cached_blocks):
    bm, a, b = busy
    seq = Sequence([1, 2, 3, 4, 5, 6, 99, 99, 99], block_size=4)  # only block 0 is cached
    assert bm.can_allocate(seq) == 1
    assert_unchanged_after_value_error(
        bm, [a, b, seq], lambda: bm.allocate(seq, num_cached_blocks), "an integer from 0 to 1 "
    )


def test_num_cached_blocks_must_be_zero_when_caching_is_off():
    bm = BlockManager(4, 4, enable_prefix_caching=False)
    seq = Sequence([1, 2, 3, 4, 5], block_size=4)
    assert_unchanged_after_value_error(
        bm, [seq], lambda: bm.allocate(seq, 1), "an integer from 0 to 0 "
    )


# --- append
def test_append_past_the_pool():
    bm = BlockManager(2, 2)
    seq = prefilled(bm, [1, 2, 3, 4])  # both blocks used
    seq.append_token(5)  # starts a third block
    assert not bm.can_append(seq)
    assert_unchanged_after_value_error(
        bm, [seq], lambda: bm.may_append(seq), "no free block to append"
    )


def test_append_to_an_unallocated_sequence():
    bm = BlockManager(2, 2)
    seq = Sequence([1], block_size=2)
    assert_unchanged_after_value_error(
        bm, [seq], lambda: bm.may_append(seq), "allocate it before appending"
    )


def test_may_append_twice_for_the_same_token():
    bm = BlockManager(4, 2)
    seq = prefilled(bm, [1, 2])
    seq.append_token(3)
    bm.may_append(seq)
    assert seq.block_table == [0, 1]
    assert_unchanged_after_value_error(
        bm, [seq], lambda: bm.may_append(seq), "already has a block for token 3"
    )


# --- deallocate
def test_deallocate_an_unallocated_sequence(busy):
    bm, a, b = busy
    never = Sequence([1, 2, 3], block_size=4)
    assert_unchanged_after_value_error(
        bm, [a, b, never], lambda: bm.deallocate(never), "holds no blocks"
    )


def test_deallocate_twice(busy):
    bm, a, b = busy
    bm.deallocate(a)
    assert_unchanged_after_value_error(bm, [b, a], lambda: bm.deallocate(a), "holds no blocks")


# --- hash_blocks
def test_hash_blocks_beyond_the_block_table():
    bm = BlockManager(4, 1)
    seq = prefilled(bm, [1, 2])
    seq.append_token(3)  # sampled, but may_append was never called: no block for token 3 yet
    seq.num_scheduled_tokens = 1
    assert_unchanged_after_value_error(
        bm, [seq], lambda: bm.hash_blocks(seq), "holds only 2 blocks"
    )


@pytest.mark.parametrize(("num_cached", "num_scheduled"), [(0, 6), (4, 2), (0, -1)])
def test_hash_blocks_with_more_scheduled_tokens_than_the_sequence_has(
    num_cached, num_scheduled
):
    bm = BlockManager(4, 4)
    seq = Sequence([1, 2, 3, 4, 5], block_size=4)
    bm.allocate(seq, 0)
    seq.num_cached_tokens, seq.num_scheduled_tokens = num_cached, num_scheduled
    assert_unchanged_after_value_error(
        bm, [seq], lambda: bm.hash_blocks(seq), "num_scheduled_tokens"
    )


# --- mixed block sizes
@pytest.mark.parametrize(
    "method",
    ["can_allocate", "allocate", "deallocate", "can_append", "may_append", "hash_blocks"],
)
def test_sequence_block_size_differs_from_the_manager(busy, method):
    bm, a, b = busy
    other = Sequence([1, 2, 3, 4, 5], block_size=2)
    other.block_table = [3]  # so only the block size check can stop deallocate/may_append
    args = (other, 0) if method == "allocate" else (other,)
    assert_unchanged_after_value_error(
        bm,
        [a, b, other],
        lambda: getattr(bm, method)(*args),
        "has block_size 2 but this BlockManager uses 4",
    )
