"""Property tests for the block manager.

- A hypothesis state machine drives random allocate / decode-append / compute-and-hash / free
  steps over
  prompts that share prefixes, runs `check_invariants` after every step, compares every
  observable (tables, ref counts, free-queue order, prefix-cache map) with a literal
  deque-based model of nano-vllm's rules (`nanovllm_oracle.OracleBlockManager`), and frees
  everything at the end to check that no block leaks.
- FreeBlockQueue is compared with `collections.deque` on random operation sequences.
- `check_invariants` is shown to catch each broken rule when a state is corrupted on purpose.
"""

import random
from collections import Counter, deque

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from nanovllm_oracle import INDEX, PREFIXES, TAIL, OracleBlockManager

from refimpl.errors import InvariantError
from refimpl.paged import (
    BlockManager,
    FreeBlockQueue,
    Sequence,
    check_invariants,
    compute_hash,
)

# --- the state machine


class BlockManagerMachine(RuleBasedStateMachine):
    """Rules have no preconditions (a rule with nothing to act on does nothing), so that
    hypothesis never has to discard a run; `admit` is always possible, which keeps the runs
    busy."""

    def __init__(self) -> None:
        super().__init__()
        self.bm = None

    @initialize(
        block_size=st.sampled_from([1, 2, 4]),
        num_blocks=st.integers(1, 20),
        caching=st.sampled_from([True, True, True, False]),
    )
    def setup(self, block_size, num_blocks, caching):
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
        self.ref = OracleBlockManager(num_blocks, block_size, caching)
        self.waiting: list[Sequence] = []  # no blocks: refused, or preempted
        self.running: list[Sequence] = []  # holding blocks
        # what happened, to check the runs cover the interesting cases
        self.seen: Counter[str] = Counter()

    def _note(self, what: str) -> None:
        self.seen[what] += 1
        if currently_in_test_context():
            event(what)

    # --- rules
    @rule(
        prefix=st.sampled_from(PREFIXES),
        tail=TAIL,
        retry_waiting=st.booleans(),
        index=INDEX,
        fewer_hits=st.sampled_from([0, 0, 0, 1]),
    )
    def admit(self, prefix, tail, retry_waiting, index, fewer_hits):
        """A new request (or one that waits) asks for its blocks: can_allocate, then
        allocate."""
        if retry_waiting and self.waiting:
            seq = self.waiting.pop(index % len(self.waiting))
        else:
            seq = Sequence(list(prefix) + tail or [3], block_size=self.bm.block_size)
        num_cached_blocks = self.bm.can_allocate(seq)
        assert num_cached_blocks == self.ref.can_allocate(seq.token_ids)
        # Taking fewer hits than offered is allowed; it may need more free blocks and then not
        # fit.
        take = max(0, num_cached_blocks - fewer_hits)
        fits = num_cached_blocks != -1 and self.ref.allocate(seq.seq_id, seq.token_ids, take)
        if fits:
            used_before = set(self.bm.used_block_ids)
            self.bm.allocate(seq, take)
            assert seq.num_cached_tokens == take * self.bm.block_size
            self._note(f"admit: {min(take, 2)}{'+' if take >= 2 else ''} hit(s)")
            if any(b not in used_before for b in seq.block_table[:take]):
                self._note("admit: revived a freed cached block")
            if any(b in used_before for b in seq.block_table[:take]):
                self._note("admit: shared an in-use block")
            self.running.append(seq)
        else:
            self._note("admit: does not fit")
            with pytest.raises(ValueError):
                self.bm.allocate(seq, take)
            assert seq.block_table == []
            self.waiting.append(seq)

    @rule(index=INDEX, chunk=st.one_of(st.integers(1, 6), st.just(64)))
    def compute_and_hash(self, index, chunk):
        """One model step on up to `chunk` uncomputed tokens, then postprocess's
        registration."""
        candidates = [s for s in self.running if s.num_cached_tokens < len(s)]
        if not candidates:
            return
        seq = candidates[index % len(candidates)]
        seq.num_scheduled_tokens = min(chunk, len(seq) - seq.num_cached_tokens)
        self.bm.hash_blocks(seq)
        self.ref.hash_blocks(
            seq.seq_id, seq.token_ids, seq.num_cached_tokens, seq.num_scheduled_tokens
        )
        seq.num_cached_tokens += seq.num_scheduled_tokens
        seq.num_scheduled_tokens = 0

    @rule(index=INDEX, token_id=st.integers(0, 3))
    def decode_append(self, index, token_id):
        """Append the sampled token, then give it a slot; with no free block, preempt as the
        scheduler does."""
        candidates = [s for s in self.running if s.num_cached_tokens == len(s)]
        if not candidates:
            return
        seq = candidates[index % len(candidates)]
        seq.append_token(token_id)
        # a table one block short is fine for this moment
        check_invariants(self.bm, self.running)
        can = self.bm.can_append(seq)
        assert can == self.ref.can_append(len(seq))
        if can:
            self.bm.may_append(seq)
            self.ref.may_append(seq.seq_id, len(seq))
            assert len(seq.block_table) == seq.num_blocks
        else:
            with pytest.raises(ValueError, match="no free block"):
                self.bm.may_append(seq)
            self._note("decode: preempted, no free block")
            self._free(seq)
            seq.is_prefill = True
            self.waiting.append(seq)

    @rule(index=INDEX)
    def finish(self, index):
        if self.running:
            self._free(self.running[index % len(self.running)])

    def _free(self, seq):
        self.bm.deallocate(seq)
        self.ref.deallocate(seq.seq_id)
        assert seq.block_table == [] and seq.num_cached_tokens == 0
        self.running.remove(seq)

    # --- checks
    @invariant()
    def invariants_hold_and_match_the_oracle(self):
        if self.bm is None:
            return
        check_invariants(self.bm, self.running)
        bm, ref = self.bm, self.ref
        assert list(bm.free_block_ids) == list(ref.free)
        assert bm.used_block_ids == ref.used
        assert bm.hash_to_block_id == ref.cache
        assert [b.ref_count for b in bm.blocks] == ref.ref_count
        assert [b.hash for b in bm.blocks] == ref.hash
        assert [b.token_ids for b in bm.blocks] == ref.tokens
        assert {s.seq_id: s.block_table for s in self.running} == ref.tables

    def teardown(self):
        if self.bm is None:
            return
        for seq in list(self.running):
            self._free(seq)
        check_invariants(self.bm, [])
        assert len(self.bm.free_block_ids) == self.bm.num_blocks
        assert self.bm.used_block_ids == set()
        assert all(b.ref_count == 0 for b in self.bm.blocks)
        assert list(self.bm.free_block_ids) == list(self.ref.free)


TestBlockManagerMachine = BlockManagerMachine.TestCase


@pytest.mark.parametrize("seed", range(4))
def test_long_random_workloads_match_the_oracle(seed):
    """The same rules driven by a seeded RNG for many steps: longer histories than hypothesis
    builds."""
    rng = random.Random(seed)
    machine = BlockManagerMachine()
    machine.setup(block_size=[1, 2, 4, 4][seed], num_blocks=rng.randint(6, 24), caching=True)
    for _ in range(2000):
        kind = rng.choices(["admit", "compute", "decode", "finish"], weights=[3, 4, 4, 1])[0]
        index = rng.randrange(1000)
        if kind == "admit":
            tail = [rng.randrange(4) for _ in range(rng.randrange(7))]
            machine.admit(
                rng.choice(PREFIXES), tail, rng.random() < 0.5, index, rng.choice([0, 0, 0, 1])
            )
        elif kind == "compute":
            machine.compute_and_hash(index, rng.choice([1, 2, 3, 5, 64]))
        elif kind == "decode":
            machine.decode_append(index, rng.randrange(4))
        else:
            machine.finish(index)
        machine.invariants_hold_and_match_the_oracle()
    machine.teardown()
    for what in (
        "admit: revived a freed cached block",
        "admit: shared an in-use block",
        "admit: 2+ hit(s)",
        "admit: does not fit",
        "decode: preempted, no free block",
    ):
        assert machine.seen[what] > 0, (
            f"the workload never reached: {what} ({dict(machine.seen)})"
        )


# --- FreeBlockQueue vs deque
@given(num_blocks=st.integers(0, 30), data=st.data())
def test_free_queue_matches_deque(num_blocks, data):
    queue, model = FreeBlockQueue(range(num_blocks)), deque(range(num_blocks))
    outside = []  # ids currently out of the queue
    for _ in range(data.draw(st.integers(0, 60), label="steps")):
        ops = ["popleft"] + (["append"] if outside else []) + (["remove"] if model else [])
        op = data.draw(st.sampled_from(ops), label="op")
        if op == "popleft":
            if model:
                got, want = queue.popleft(), model.popleft()
                assert got == want
                outside.append(got)
            else:
                with pytest.raises(IndexError):
                    queue.popleft()
        elif op == "append":
            block_id = outside.pop(data.draw(st.integers(0, len(outside) - 1), label="append"))
            queue.append(block_id)
            model.append(block_id)
        else:
            block_id = data.draw(st.sampled_from(list(model)), label="remove")
            queue.remove(block_id)
            model.remove(block_id)
            outside.append(block_id)
        assert list(queue) == list(model)
        assert len(queue) == len(model)
        if model:
            assert queue[0] == model[0] and queue[-1] == model[-1]
    for block_id in range(num_blocks):
        assert (block_id in queue) == (block_id in model)


def test_free_queue_rejects_double_append_and_missing_remove():
    queue = FreeBlockQueue([3, 1, 2])
    with pytest.raises(ValueError, match="already in the free queue"):
        queue.append(1)
    with pytest.raises(ValueError, match="not in the free queue"):
        queue.remove(7)
    with pytest.raises(IndexError):
        FreeBlockQueue().popleft()
    assert list(queue) == [3, 1, 2]


# --- check_invariants catches each rule
def _healthy():
    """Block size 2, pool 6: a and b share a registered block 0; c is freed, its full block
    still cached."""
    bm = BlockManager(6, 2)
    seqs = []
    for token_ids in ([1, 2, 3, 4], [1, 2, 4, 5, 6], [7, 8, 9]):
        seq = Sequence(token_ids, block_size=2)
        bm.allocate(seq, bm.can_allocate(seq))
        seq.num_scheduled_tokens = len(seq) - seq.num_cached_tokens
        bm.hash_blocks(seq)
        seq.num_cached_tokens, seq.num_scheduled_tokens = len(seq), 0
        seqs.append(seq)
    a, b, c = seqs
    bm.deallocate(c)
    assert (a.block_table, b.block_table) == ([0, 1], [0, 2, 3])
    assert list(bm.free_block_ids) == [5, 4]
    check_invariants(bm, [a, b])
    return bm, a, b


def _dupe_in_free_queue(bm, a, b):
    bm.free_block_ids = deque([5, 4, 5])


def _block_used_and_free(bm, a, b):
    bm.used_block_ids.add(5)


def _block_lost(bm, a, b):
    bm.free_block_ids.remove(5)


def _unknown_block(bm, a, b):
    bm.used_block_ids.add(17)


def _wrong_block_id(bm, a, b):
    bm.blocks[2].block_id = 3


def _table_holds_block_twice(bm, a, b):
    a.block_table.append(0)


def _table_too_long(bm, a, b):
    a.block_table.append(4)


def _table_too_short(bm, a, b):
    # a has 4 tokens: 2 blocks, and its newest token does not start a new block
    a.block_table.pop()


def _block_content_differs(bm, a, b):
    bm.blocks[2].token_ids = [4, 99]


def _hash_breaks_the_chain(bm, a, b):
    bm.blocks[2].hash = compute_hash([4, 5])  # right tokens, but not chained to block 0


def _registered_after_a_gap(bm, a, b):
    bm.blocks[2].hash = -1  # b's logical block 1 loses its registration ...
    bm.blocks[3].hash = 555  # ... while its logical block 2 claims one


def _ref_count_too_high(bm, a, b):
    bm.blocks[1].ref_count = 2


def _free_block_held_by_a_sequence(bm, a, b):
    bm.used_block_ids.remove(1)
    bm.free_block_ids.append(1)


def _used_block_without_owner(bm, a, b):
    bm.free_block_ids.remove(4)
    bm.used_block_ids.add(4)


def _cache_points_outside_the_pool(bm, a, b):
    bm.hash_to_block_id[123] = 99


def _cache_entry_disagrees(bm, a, b):
    bm.hash_to_block_id[123] = 0


def _cache_entry_on_partial_block(bm, a, b):
    bm.blocks[5].hash = 123  # c's freed last block, which held a single token
    bm.blocks[5].token_ids = [9]
    bm.hash_to_block_id[123] = 5


def _cache_used_while_disabled(bm, a, b):
    bm.enable_prefix_caching = False


CORRUPTIONS = [
    ("free-queue-unique", _dupe_in_free_queue),
    ("used-free-disjoint", _block_used_and_free),
    ("used-free-partition", _block_lost),
    ("used-free-partition", _unknown_block),
    ("block-id", _wrong_block_id),
    ("table-unique", _table_holds_block_twice),
    ("table-length", _table_too_long),
    ("table-length", _table_too_short),
    ("block-content", _block_content_differs),
    ("hash-chain", _hash_breaks_the_chain),
    ("hash-prefix", _registered_after_a_gap),
    ("ref-count", _ref_count_too_high),
    ("free-ref-zero", _free_block_held_by_a_sequence),
    ("used-ref-positive", _used_block_without_owner),
    ("hash-map-target", _cache_points_outside_the_pool),
    ("hash-map-agrees", _cache_entry_disagrees),
    ("hash-map-full", _cache_entry_on_partial_block),
    ("no-cache-when-disabled", _cache_used_while_disabled),
]


@pytest.mark.parametrize(
    ("rule", "corrupt"), CORRUPTIONS, ids=[f.__name__.strip("_") for _, f in CORRUPTIONS]
)
def test_check_invariants_names_the_broken_rule(rule, corrupt):
    bm, a, b = _healthy()
    corrupt(bm, a, b)
    with pytest.raises(InvariantError, match=rf"^\[{rule}\]"):
        check_invariants(bm, [a, b])


def test_check_invariants_catches_a_missing_sequence():
    bm, a, b = _healthy()
    with pytest.raises(InvariantError, match=r"^\[ref-count\]"):
        check_invariants(bm, [a])  # b's blocks look referenced by nobody
