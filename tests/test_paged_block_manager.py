"""BlockManager scenarios with exact expected states: block tables, ref counts, free-queue
order (head first) and prefix-cache contents, following nano-vllm's rules as the write-up "3.4
KV Cache and BlockManager" states them."""

import pytest

import refimpl.paged.block_manager as block_manager_module
import refimpl.paged.invariants as invariants_module
from refimpl.paged import BlockManager, Sequence, check_invariants, compute_hash


# --- helpers
def free_order(bm):
    return list(bm.free_block_ids)


def ref_counts(bm):
    return [b.ref_count for b in bm.blocks]


def chain_hashes(blocks_of_tokens):
    """The chained hash of each block, computed independently of the manager."""
    h, out = -1, []
    for tokens in blocks_of_tokens:
        h = compute_hash(tokens, h)
        out.append(h)
    return out


def admit(bm, tokens, *, expect_cached=None):
    """Create a sequence, match its prefix and allocate it (what the scheduler does)."""
    seq = Sequence(tokens, block_size=bm.block_size)
    num_cached_blocks = bm.can_allocate(seq)
    assert num_cached_blocks != -1, "the sequence should fit"
    if expect_cached is not None:
        assert num_cached_blocks == expect_cached
    bm.allocate(seq, num_cached_blocks)
    return seq


def run_chunk(bm, seq, num_tokens):
    """Simulate one model step on `num_tokens` tokens followed by postprocess's bookkeeping."""
    seq.num_scheduled_tokens = num_tokens
    bm.hash_blocks(seq)
    seq.num_cached_tokens += num_tokens
    seq.num_scheduled_tokens = 0


def prefill(bm, seq):
    run_chunk(bm, seq, seq.num_tokens - seq.num_cached_tokens)


def decode(bm, seq, token_id):
    """Append a sampled token, give it a slot, compute it."""
    seq.append_token(token_id)
    assert bm.can_append(seq)
    bm.may_append(seq)
    run_chunk(bm, seq, 1)


def tokens(start, n):
    """n distinct token ids starting at `start` (distinct ranges never share blocks)."""
    return list(range(start, start + n))


# --- FIFO allocation and free
def test_fifo_allocation_from_the_head_and_reverse_free_to_the_tail():
    bm = BlockManager(8, 4)
    assert free_order(bm) == [0, 1, 2, 3, 4, 5, 6, 7]
    a = admit(bm, tokens(100, 6))  # 2 blocks
    b = admit(bm, tokens(200, 9))  # 3 blocks
    assert a.block_table == [0, 1]
    assert b.block_table == [2, 3, 4]
    assert free_order(bm) == [5, 6, 7]
    assert bm.used_block_ids == {0, 1, 2, 3, 4}
    assert ref_counts(bm) == [1, 1, 1, 1, 1, 0, 0, 0]
    check_invariants(bm, [a, b])

    bm.deallocate(a)  # last block first: 1 goes to the tail before 0
    assert free_order(bm) == [5, 6, 7, 1, 0]
    assert a.block_table == [] and a.num_cached_tokens == 0
    bm.deallocate(b)
    assert free_order(bm) == [5, 6, 7, 1, 0, 4, 3, 2]
    assert ref_counts(bm) == [0] * 8
    assert bm.used_block_ids == set()

    c = admit(bm, tokens(300, 9))
    assert c.block_table == [5, 6, 7]  # the longest-free blocks are reused first
    d = admit(bm, tokens(400, 16))
    assert d.block_table == [1, 0, 4, 3]
    assert free_order(bm) == [2]
    check_invariants(bm, [c, d])


def test_reverse_free_keeps_the_shared_early_blocks_cached_longest():
    bm = BlockManager(9, 4)
    prompt = tokens(0, 13)  # three full blocks and one token
    a = admit(bm, prompt)
    prefill(bm, a)
    assert a.block_table == [0, 1, 2, 3]
    h0, h1, h2 = chain_hashes([prompt[0:4], prompt[4:8], prompt[8:12]])
    assert bm.hash_to_block_id == {h0: 0, h1: 1, h2: 2}
    bm.deallocate(a)
    # The tail of A (the blocks least likely to be shared) sits nearest the head.
    assert free_order(bm) == [4, 5, 6, 7, 8, 3, 2, 1, 0]
    # Freed blocks keep their content and stay findable until overwritten.
    assert [b.hash for b in bm.blocks[:3]] == [h0, h1, h2]
    assert ref_counts(bm) == [0] * 9

    # An unrelated 7-block request eats into A's blocks from A's end: L2 is lost, L0 and L1
    # survive. (Had A freed front to back, this request would have overwritten L0 and L1
    # instead.)
    other = admit(bm, tokens(1000, 28), expect_cached=0)
    assert other.block_table == [4, 5, 6, 7, 8, 3, 2]
    assert bm.hash_to_block_id == {h0: 0, h1: 1}
    assert free_order(bm) == [1, 0]
    bm.deallocate(other)
    assert free_order(bm) == [1, 0, 2, 3, 8, 7, 6, 5, 4]

    again = admit(bm, prompt[:8] + [99], expect_cached=2)
    assert again.block_table == [0, 1, 2]  # two revived hits, then the head of the queue
    assert again.num_cached_tokens == 8
    assert free_order(bm) == [3, 8, 7, 6, 5, 4]
    check_invariants(bm, [again])


# --- append boundaries
@pytest.mark.parametrize("block_size", [1, 2, 4, 256])
def test_append_needs_a_block_exactly_when_the_newest_token_starts_one(block_size):
    final_len = 2 * block_size + 1
    num_pool_blocks = 3  # exactly the blocks final_len tokens need
    bm = BlockManager(num_pool_blocks, block_size)
    seq = admit(bm, [7])
    prefill(bm, seq)
    assert seq.block_table == [0]
    crossings = []
    for n in range(2, final_len + 1):
        seq.append_token(n)
        starts_new_block = (len(seq) - 1) % block_size == 0
        if starts_new_block:
            crossings.append(len(seq))
        assert bm.can_append(seq)
        before = list(seq.block_table)
        bm.may_append(seq)
        assert len(seq.block_table) == len(before) + starts_new_block
        assert len(seq.block_table) == seq.num_blocks
        run_chunk(bm, seq, 1)
        check_invariants(bm, [seq])
    assert crossings == [block_size + 1, 2 * block_size + 1]
    assert seq.block_table == [0, 1, 2]
    assert len(bm.free_block_ids) == 0
    # A full block is registered as soon as its last token is computed: two full blocks so far.
    assert sorted(bm.hash_to_block_id.values()) == ([0, 1, 2][: final_len // block_size])
    # block 2 holds one token: full only if size 1
    assert (bm.blocks[2].hash != -1) == (block_size == 1)

    # With the pool empty, a token inside the last block still fits; one starting a new block
    # does not.
    if block_size > 1:
        seq.append_token(0)
        assert bm.can_append(seq)
        bm.may_append(seq)
        assert seq.block_table == [0, 1, 2]
        run_chunk(bm, seq, 1)
        for _ in range(block_size - 2):
            seq.append_token(0)
            run_chunk(bm, seq, 1)
    seq.append_token(0)
    assert (len(seq) - 1) % block_size == 0
    assert not bm.can_append(seq)


@pytest.mark.parametrize(
    ("block_size", "new_block_lengths"),
    [(1, [1, 2, 3, 4, 5]), (2, [1, 3, 5, 7, 9]), (4, [1, 5, 9]), (256, [1, 257, 513])],
)
def test_new_block_lengths_listed(block_size, new_block_lengths):
    """The lengths at which the newest token is the first token of a block."""
    bm = BlockManager(1, block_size)  # one block: already used by the sequence below
    seq = admit(bm, [0])
    top = new_block_lengths[-1]
    found = []
    for n in range(1, top + 1):
        if n > 1:
            seq.append_token(0)
        if not bm.can_append(seq):  # the pool is empty, so only a crossing is refused
            found.append(n)
    assert found == new_block_lengths
    # nano-vllm's own test, len % block_size == 1, agrees except for block_size 1, where it
    # never fires.
    nano = [n for n in range(1, top + 1) if n % block_size == 1]
    assert nano == (new_block_lengths if block_size > 1 else [])


# --- the write-up's example
def test_writeup_example_block_size_4_twelve_tokens():
    """L0 hits in-use #1 (ref 1 -> 2), L1 pulls freed #3 out of the queue, L2 gets #6 from the
    head."""
    bm = BlockManager(8, 4)
    L0, L1, L2 = [10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]
    h0, h1, h2 = chain_hashes([L0, L1, L2])

    a = admit(bm, [1, 2, 3], expect_cached=0)  # an unrelated request
    prefill(bm, a)
    b = admit(bm, L0 + [40, 41], expect_cached=0)  # shares L0, stays running
    prefill(bm, b)
    assert (a.block_table, b.block_table) == ([0], [1, 2])
    assert bm.hash_to_block_id == {h0: 1}

    c = admit(bm, L0 + L1 + [50], expect_cached=1)  # hits L0 on #1, computes L1 into #3
    assert c.block_table == [1, 3, 4]
    assert c.num_cached_tokens == 4
    assert bm.blocks[1].ref_count == 2
    prefill(bm, c)
    assert bm.hash_to_block_id == {h0: 1, h1: 3}

    d = admit(bm, [60, 61], expect_cached=0)  # another unrelated request
    assert d.block_table == [5]
    bm.deallocate(c)  # finished: #4 then #3 go to the tail, #1 goes back to one reference
    assert free_order(bm) == [6, 7, 4, 3]
    assert ref_counts(bm) == [1, 1, 1, 0, 0, 1, 0, 0]
    assert bm.blocks[3].hash == h1  # freed but still findable
    check_invariants(bm, [a, b, d])

    # The new 12-token request from the figure.
    new = Sequence(L0 + L1 + L2, block_size=4)
    assert bm.can_allocate(new) == 2
    bm.allocate(new, 2)
    assert new.block_table == [1, 3, 6]
    assert new.num_cached_tokens == 8
    assert bm.blocks[1].ref_count == 2  # shared with b: 1 -> 2
    assert bm.blocks[3].ref_count == 1  # pulled back out of the free queue
    assert bm.blocks[6].ref_count == 1 and bm.blocks[6].hash == -1  # fresh from the head
    assert free_order(bm) == [7, 4]
    assert bm.used_block_ids == {0, 1, 2, 3, 5, 6}
    assert bm.hash_to_block_id == {h0: 1, h1: 3}  # L2 is never looked up nor registered yet
    check_invariants(bm, [a, b, d, new])

    prefill(bm, new)  # the model computes L2 only; then L2 is registered on #6
    assert bm.hash_to_block_id == {h0: 1, h1: 3, h2: 6}
    check_invariants(bm, [a, b, d, new])


def test_hit_on_an_in_use_block_needs_no_free_block():
    bm = BlockManager(5, 4)
    prompt = tokens(0, 13)
    a = admit(bm, prompt)
    prefill(bm, a)
    assert free_order(bm) == [4]
    same_prefix = Sequence(prompt[:12] + [77], block_size=4)  # 4 blocks, 3 in-use hits
    assert same_prefix.num_blocks == 4
    assert bm.can_allocate(same_prefix) == 3  # only the last block needs the one free block
    bm.allocate(same_prefix, 3)
    assert same_prefix.block_table == [0, 1, 2, 4]
    assert ref_counts(bm) == [2, 2, 2, 1, 1]
    third = Sequence(prompt[:12] + [78], block_size=4)
    assert bm.can_allocate(third) == -1  # its own last block finds no free block
    check_invariants(bm, [a, same_prefix])

    bm.deallocate(a)  # shared blocks keep one reference and stay in use
    assert ref_counts(bm) == [1, 1, 1, 0, 1]
    assert free_order(bm) == [3]


def test_hit_on_a_freed_block_still_costs_a_free_block():
    bm = BlockManager(4, 4)
    prompt = tokens(0, 9)
    a = admit(bm, prompt)
    prefill(bm, a)
    bm.deallocate(a)
    assert free_order(bm) == [3, 2, 1, 0]
    hog = admit(bm, tokens(500, 4))  # takes #3, which held nothing cached
    again = Sequence(prompt, block_size=4)
    assert bm.can_allocate(again) == 2  # 3 blocks needed, 3 free (two of them are the hits)
    bm.allocate(again, 2)
    assert again.block_table == [0, 1, 2]
    assert free_order(bm) == []
    bm.deallocate(again)
    blocked = Sequence(prompt + tokens(900, 4), block_size=4)  # 4 blocks: 2 freed hits + 2 new
    # only 3 free blocks: freed hits are not free of charge
    assert bm.can_allocate(blocked) == -1
    check_invariants(bm, [hog])


def test_first_miss_stops_matching():
    bm = BlockManager(10, 4)
    L0, L1, L2 = [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]
    a = admit(bm, L0 + L1 + L2 + [4])
    prefill(bm, a)
    # Same L0, different L1, same L2 content: L2's chained hash differs, and matching stopped
    # at L1 anyway.
    b = admit(bm, L0 + [9, 9, 9, 9] + L2 + [4], expect_cached=1)
    assert b.block_table[0] == a.block_table[0]
    assert b.num_cached_tokens == 4
    check_invariants(bm, [a, b])


def test_first_miss_stops_matching_even_when_a_later_block_is_still_cached():
    """L1's only cache entry is overwritten and then evicted while L2's entry survives: a later
    hit after a miss must not count (its K/V follows a prefix that is no longer cached)."""
    bm = BlockManager(10, 4)
    L0, L1, L2 = [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]
    a = admit(bm, L0 + L1 + L2 + [4])  # blocks 0-3
    e = admit(bm, L0 + L1 + [5])  # admitted before a is registered: blocks 4-6, no hits
    prefill(bm, a)
    prefill(bm, e)  # the newest registration wins: L0 -> 4, L1 -> 5
    h0, h1, h2 = chain_hashes([L0, L1, L2])
    assert bm.hash_to_block_id == {h0: 4, h1: 5, h2: 2}
    bm.deallocate(e)
    assert free_order(bm) == [7, 8, 9, 6, 5, 4]
    # five fresh blocks: 7, 8, 9, 6 and 5, which drops L1's entry
    f = admit(bm, tokens(100, 20))
    assert f.block_table == [7, 8, 9, 6, 5]
    assert bm.hash_to_block_id == {h0: 4, h2: 2}
    bm.deallocate(f)
    g = Sequence(L0 + L1 + L2 + [6], block_size=4)
    # L0 hits block 4; L1 misses; L2 (block 2, in use) is not counted
    assert bm.can_allocate(g) == 1
    bm.allocate(g, 1)
    assert free_order(bm) == [8, 7]  # f freed last-to-first behind block 4: 4, 5, 6, 9, 8, 7
    assert g.block_table == [4, 5, 6, 9] and g.num_cached_tokens == 4
    check_invariants(bm, [a, g])


def test_preempted_sequence_hits_its_own_freed_blocks():
    bm = BlockManager(6, 4)
    seq = admit(bm, tokens(0, 7))
    prefill(bm, seq)
    decode(bm, seq, 100)
    decode(bm, seq, 101)  # 9 tokens: blocks 0 and 1 full and registered, block 2 has 1 token
    assert seq.block_table == [0, 1, 2]
    assert len(bm.hash_to_block_id) == 2
    bm.deallocate(seq)  # preempted
    seq.is_prefill = True
    assert free_order(bm) == [3, 4, 5, 2, 1, 0]
    assert bm.can_allocate(seq) == 2
    bm.allocate(seq, 2)
    assert seq.block_table == [0, 1, 3]
    assert seq.num_cached_tokens == 8  # only the last token is recomputed
    check_invariants(bm, [seq])


# --- hash collisions and stale entries
def test_forced_hash_collision_is_caught_by_the_token_check(monkeypatch):
    bm = BlockManager(8, 4)
    real_a, real_b = [1, 2, 3, 4], [5, 6, 7, 8]

    def colliding_hash(token_ids, prefix=-1):
        # Block real_b pretends to have real_a's fingerprint.
        return compute_hash(real_a if list(token_ids) == real_b else token_ids, prefix)

    monkeypatch.setattr(block_manager_module, "compute_hash", colliding_hash)
    monkeypatch.setattr(invariants_module, "compute_hash", colliding_hash)
    a = admit(bm, real_a + [9])
    prefill(bm, a)
    h = compute_hash(real_a)
    assert bm.hash_to_block_id == {h: 0}

    b = Sequence(real_b + [9], block_size=4)
    assert bm.compute_hash(b.block(0)) == h  # the hashes really collide
    assert bm.can_allocate(b) == 0  # but the tokens differ, so it is a miss
    with pytest.raises(ValueError, match="an integer from 0 to 0 "):
        bm.allocate(b, 1)
    bm.allocate(b, 0)
    assert b.block_table == [2, 3]
    assert ref_counts(bm)[:4] == [1, 1, 1, 1]
    check_invariants(bm, [a, b])


def test_stale_hash_guard_keeps_the_newer_entry():
    bm = BlockManager(6, 4)
    prompt = [1, 2, 3, 4, 5]
    h = compute_hash(prompt[:4])
    # Two identical requests prefill in the same step: both miss, both compute block 0.
    a = admit(bm, prompt, expect_cached=0)
    b = admit(bm, prompt, expect_cached=0)
    assert (a.block_table, b.block_table) == ([0, 1], [2, 3])
    prefill(bm, a)
    prefill(bm, b)
    assert bm.hash_to_block_id == {h: 2}  # registered last wins
    assert bm.blocks[0].hash == h and bm.blocks[2].hash == h  # both blocks carry the hash
    check_invariants(bm, [a, b])
    for token_id in (6, 7, 8):  # a decodes until its block 1 fills: only block 1 is registered
        decode(bm, a, token_id)
    h1 = compute_hash([5, 6, 7, 8], h)
    assert bm.hash_to_block_id == {h: 2, h1: 1}  # block 0 was not registered again
    check_invariants(bm, [a, b])

    bm.deallocate(a)
    bm.deallocate(b)
    assert free_order(bm) == [4, 5, 1, 0, 3, 2]
    # Four unrelated blocks: #0 (the older copy) is overwritten; the entry for #2 must survive.
    other = admit(bm, tokens(100, 16), expect_cached=0)
    assert other.block_table == [4, 5, 1, 0]
    assert bm.hash_to_block_id == {h: 2}  # h1's entry went with #1, h's entry stayed on #2
    assert bm.blocks[0].hash == -1

    again = admit(bm, prompt, expect_cached=1)  # still a hit, on #2
    assert again.block_table == [2, 3]
    check_invariants(bm, [other, again])
    # When the owner of the entry itself is overwritten, the entry goes.
    bm.deallocate(again)
    assert free_order(bm) == [3, 2]
    admit(bm, tokens(200, 8), expect_cached=0)
    assert bm.hash_to_block_id == {}


# --- block size 256
def test_600_token_shared_prefix_reuses_512_tokens_at_block_size_256():
    bm = BlockManager(16, 256)
    shared = tokens(0, 600)
    first = admit(bm, shared + tokens(10_000, 200))  # 800 tokens: blocks 0-2 full
    prefill(bm, first)
    assert len(bm.hash_to_block_id) == 3
    second = admit(bm, shared + tokens(20_000, 100), expect_cached=2)
    assert second.num_cached_tokens == 512  # the remaining 88 shared tokens are recomputed
    assert second.block_table[:2] == first.block_table[:2]
    assert second.block_table[2] not in first.block_table
    check_invariants(bm, [first, second])


def test_identical_512_token_prompt_reuses_only_256_tokens():
    bm = BlockManager(8, 256)
    prompt = tokens(0, 512)
    first = admit(bm, prompt)
    prefill(bm, first)
    assert len(bm.hash_to_block_id) == 2  # both blocks are full and registered
    second = admit(bm, prompt, expect_cached=1)  # the last block is never looked up
    assert second.num_cached_tokens == 256
    assert second.block_table == [first.block_table[0], 2]
    check_invariants(bm, [first, second])


# --- prefix caching off
def _workload(bm):
    """Shared prompts, frees and decodes; returns every block table seen, in order."""
    shared = tokens(0, 8)
    tables = []
    live = []
    for i in range(4):
        seq = Sequence(shared + [1000 + i], block_size=bm.block_size)
        n = bm.can_allocate(seq)
        bm.allocate(seq, n)
        prefill(bm, seq)
        decode(bm, seq, 2000 + i)
        tables.append(list(seq.block_table))
        live.append(seq)
        if i % 2 == 1:
            bm.deallocate(live.pop(0))
        check_invariants(bm, live)
    return tables, live


def test_prefix_caching_disabled_matches_and_registers_nothing():
    bm = BlockManager(16, 4, enable_prefix_caching=False)
    tables, live = _workload(bm)
    assert bm.hash_to_block_id == {}
    assert all(b.hash == -1 and b.token_ids == [] for b in bm.blocks)
    assert all(seq.num_cached_tokens == seq.num_tokens for seq in live)
    # Every request took fresh blocks from the head of the queue, no sharing.
    assert tables == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert max(ref_counts(bm)) == 1
    assert free_order(bm) == [12, 13, 14, 15, 2, 1, 0, 5, 4, 3]

    cached = BlockManager(16, 4)
    cached_tables, _ = _workload(cached)
    # the same workload shares
    assert cached_tables == [[0, 1, 2], [0, 1, 3], [0, 1, 4], [0, 1, 5]]


def test_prefix_caching_disabled_allocates_like_enabled_without_hits():
    """With no shared content, both settings produce identical tables and queue orders."""
    managers = [BlockManager(12, 4), BlockManager(12, 4, enable_prefix_caching=False)]
    histories = []
    for bm in managers:
        history = []
        a = admit(bm, tokens(0, 10), expect_cached=0)
        b = admit(bm, tokens(100, 5), expect_cached=0)
        prefill(bm, a)
        prefill(bm, b)
        bm.deallocate(a)
        c = admit(bm, tokens(200, 13), expect_cached=0)
        decode(bm, b, 7)
        history.append(
            (list(b.block_table), list(c.block_table), free_order(bm), ref_counts(bm))
        )
        histories.append(history)
    assert histories[0] == histories[1]
    assert histories[0][0][:3] == ([3, 4], [5, 6, 7, 8], [9, 10, 11, 2, 1, 0])


# --- hash_blocks
def test_hash_blocks_registers_only_blocks_filled_this_step():
    bm = BlockManager(8, 4)
    prompt = tokens(0, 10)
    seq = admit(bm, prompt)
    assert seq.block_table == [0, 1, 2]
    h0, h1 = chain_hashes([prompt[0:4], prompt[4:8]])

    run_chunk(bm, seq, 3)  # chunk ends inside block 0: nothing is full yet
    assert bm.hash_to_block_id == {}
    assert bm.blocks[0].hash == -1
    run_chunk(bm, seq, 3)  # tokens 3..5: block 0 is now full, block 1 is half full
    assert bm.hash_to_block_id == {h0: 0}
    assert bm.blocks[0].token_ids == prompt[0:4]
    assert bm.blocks[1].hash == -1
    check_invariants(bm, [seq])
    # tokens 6..9: block 1 fills (chained from block 0's stored hash), block 2 does not
    run_chunk(bm, seq, 4)
    assert bm.hash_to_block_id == {h0: 0, h1: 1}
    assert bm.blocks[1].hash == h1
    assert bm.blocks[2].hash == -1
    assert seq.num_cached_tokens == 10
    check_invariants(bm, [seq])


def test_hash_blocks_after_a_prefix_hit_chains_from_the_hit():
    bm = BlockManager(8, 4)
    shared = tokens(0, 4)
    a = admit(bm, shared + [50])
    prefill(bm, a)
    b = admit(bm, shared + tokens(60, 5), expect_cached=1)  # 9 tokens, block 0 is a hit
    assert b.num_cached_tokens == 4
    prefill(bm, b)  # computes tokens 4..8: registers block 1 only
    h0, h1 = chain_hashes([shared, tokens(60, 4)])
    assert bm.hash_to_block_id == {h0: a.block_table[0], h1: b.block_table[1]}
    check_invariants(bm, [a, b])


def test_compute_hash_is_a_chain_of_xxh64():
    import numpy as np
    import xxhash

    block = [1, 2, 3, 4]
    assert (
        compute_hash(block) == xxhash.xxh64(np.array(block, dtype="<i8").tobytes()).intdigest()
    )
    prev = compute_hash([9, 9, 9, 9])
    expected = xxhash.xxh64(
        prev.to_bytes(8, "little") + np.array(block, dtype="<i8").tobytes()
    ).intdigest()
    assert compute_hash(block, prev) == expected
    assert compute_hash(block, prev) != compute_hash(block)  # same tokens, different history
    assert BlockManager.compute_hash(block, prev) == expected
