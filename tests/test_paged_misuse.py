"""Part I's entry points refuse misuse with a ValueError or TypeError naming the argument,
before anything changes: the whole state (every block, the free queue, the hash map, the
manager's record of block tables, the queues and every sequence) is compared before and after
each refusal.

The listed cases come first; then a property test drives random misuse (double free, copies of
freed and of live sequences, repeated postprocess, foreign block ids, a never-scheduled
sequence) between the steps of random workloads.
"""

from __future__ import annotations

import copy
import itertools
import random

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from refimpl.errors import InvariantError
from refimpl.paged import (
    BlockManager,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    Sequence,
    SequenceStatus,
    check_invariants,
)


@pytest.fixture(autouse=True)
def fresh_seq_ids(monkeypatch):
    monkeypatch.setattr(Sequence, "counter", itertools.count())


def manager_snapshot(bm: BlockManager) -> tuple:
    return (
        [(b.block_id, b.ref_count, b.hash, list(b.token_ids)) for b in bm.blocks],
        dict(bm.hash_to_block_id),
        list(bm.free_block_ids),
        set(bm.used_block_ids),
        {seq_id: list(table) for seq_id, table in bm.block_tables.items()},
    )


def seq_snapshot(seq: Sequence) -> tuple:
    return (
        seq.seq_id,
        list(seq.token_ids),
        seq.num_tokens,
        seq.num_cached_tokens,
        seq.num_scheduled_tokens,
        seq.status,
        seq.is_prefill,
        list(seq.block_table),
        list(seq.block_hashes),
    )


def snapshot(scheduler: Scheduler, seqs) -> tuple:
    return (
        manager_snapshot(scheduler.block_manager),
        [s.seq_id for s in scheduler.waiting],
        [s.seq_id for s in scheduler.running],
        scheduler.num_preemptions,
        [seq_snapshot(s) for s in seqs],
    )


def refused(
    scheduler: Scheduler,
    seqs,
    action,
    error=ValueError,
    match: str | None = None,
    holders=None,
) -> None:
    """`action()` raises `error` (matching `match`) and leaves everything as it was; the
    invariants still hold for `holders` (the sequences that really hold blocks; default: every
    one with a table)."""
    before = snapshot(scheduler, seqs)
    with pytest.raises(error, match=match):
        action()
    assert snapshot(scheduler, seqs) == before
    if holders is None:
        holders = [s for s in seqs if s.block_table]
    check_invariants(scheduler.block_manager, holders)


def sched(num_blocks: int = 8, **kwargs) -> Scheduler:
    return Scheduler(
        SchedulerConfig(num_kvcache_blocks=num_blocks, kvcache_block_size=4, **kwargs)
    )


def seq(tokens, max_tokens: int = 4, **kwargs) -> Sequence:
    return Sequence(
        list(tokens), SamplingParams(max_tokens=max_tokens, **kwargs), block_size=4
    )


def step(scheduler: Scheduler, token: int = 7) -> tuple[list[Sequence], bool]:
    seqs, is_prefill = scheduler.schedule()
    scheduler.postprocess(seqs, [token] * len(seqs), is_prefill)
    return seqs, is_prefill


@pytest.fixture
def two_running():
    """A and B running (B hit A's first block), C waiting for room; blocks 3 and 4 free."""
    s = sched(num_blocks=5)
    a, b, c = seq(range(6)), seq([0, 1, 2, 3, 9]), seq(range(50, 62))
    s.add(a)
    step(s)
    s.add(b)
    s.add(c)
    step(s)
    assert (a.block_table, b.block_table, list(s.waiting), list(s.running)) == (
        [0, 1],
        [0, 2],
        [c],
        [a, b],
    )
    return s, a, b, c


# --- BlockManager.deallocate
def test_deep_copy_of_a_freed_sequence(two_running):
    s, a, b, c = two_running
    ghost = copy.deepcopy(a)
    s.block_manager.deallocate(a)
    s.running.remove(a)
    refused(
        s,
        [b, c, ghost],
        lambda: s.block_manager.deallocate(ghost),
        match="did not give it",
        holders=[b],
    )
    assert min(block.ref_count for block in s.block_manager.blocks) == 0  # never below zero


def test_deep_copy_of_a_freed_sequence_whose_blocks_went_to_another(two_running):
    s, a, b, c = two_running
    ghost = copy.deepcopy(b)
    s.block_manager.deallocate(b)  # block 2 freed; block 0 still A's
    s.running.remove(b)
    # takes the three free blocks, 2 among them
    s.block_manager.allocate(d := seq(range(80, 92)), 0)
    assert d.block_table == [3, 4, 2] and ghost.block_table == [0, 2]
    refused(
        s,
        [a, c, d, ghost],
        lambda: s.block_manager.deallocate(ghost),
        match="did not give it",
        holders=[a, d],
    )


def test_deep_copy_of_a_live_sequence(two_running):
    s, a, b, c = two_running
    twin = copy.deepcopy(a)
    for method in ("deallocate", "may_append"):
        refused(
            s,
            [a, b, c, twin],
            lambda: getattr(s.block_manager, method)(twin),
            match="did not give it",
            holders=[a, b],
        )
    twin.block_table = []
    refused(
        s,
        [a, b, c, twin],
        lambda: s.block_manager.allocate(twin, 0),
        match="already has blocks",
    )


@pytest.mark.parametrize("table", [[-1], [0, -1], [0, 0], [99], [3], [0, 1.0], [0, "1"]])
def test_table_with_foreign_ids(two_running, table):
    s, a, b, c = two_running
    a.block_table[:] = table  # edited in place: the manager's record is this very list
    before = snapshot(s, [a, b, c])
    with pytest.raises(ValueError, match="must list blocks in use, each once"):
        s.block_manager.deallocate(a)
    assert snapshot(s, [a, b, c]) == before
    assert min(block.ref_count for block in s.block_manager.blocks) >= 0


def test_a_hand_made_table(two_running):
    s, a, b, c = two_running
    stranger = seq(range(8))
    stranger.block_table = [1]  # A's block: the manager never gave it to this sequence
    for method in ("deallocate", "may_append"):
        refused(
            s,
            [a, b, c, stranger],
            lambda: getattr(s.block_manager, method)(stranger),
            match="did not give it",
            holders=[a, b],
        )


def test_a_manager_with_no_record_yet_refuses_a_hand_made_table():
    """The record alone decides, even while it is empty: no block is handed to a table the
    manager never filled (no exception for a manager that holds no record)."""
    bm = BlockManager(4, 4)
    stranger = seq(range(4))  # its next token starts block 1
    stranger.block_table = [0]
    for method in ("may_append", "deallocate"):
        before = (manager_snapshot(bm), seq_snapshot(stranger))
        with pytest.raises(ValueError, match="did not give it"):
            getattr(bm, method)(stranger)
        assert (manager_snapshot(bm), seq_snapshot(stranger)) == before


def test_an_allocate_that_keeps_no_record_gets_its_sequences_refused():
    """A subclass whose own `allocate` fills tables without recording them: `deallocate`
    refuses the sequence before anything changes (the record is part of `allocate`)."""

    class OwnAllocate(BlockManager):
        def allocate(self, seq, num_cached_blocks):
            for _ in range(seq.num_blocks):
                seq.block_table.append(self._allocate_block())

    bm = OwnAllocate(4, 4)
    x = seq(range(6))
    bm.allocate(x, 0)
    before = manager_snapshot(bm)
    with pytest.raises(ValueError, match="did not give it"):
        bm.deallocate(x)
    assert manager_snapshot(bm) == before


@pytest.mark.parametrize(
    "method",
    ["can_allocate", "allocate", "deallocate", "can_append", "may_append", "hash_blocks"],
)
@pytest.mark.parametrize("wrong", [None, {"block_table": [0]}, [1, 2, 3]])
def test_block_manager_methods_name_a_wrong_type(method, wrong):
    bm = BlockManager(4, 4)
    args = (wrong, 0) if method == "allocate" else (wrong,)
    before = manager_snapshot(bm)
    with pytest.raises(TypeError, match="seq must be a Sequence"):
        getattr(bm, method)(*args)
    assert manager_snapshot(bm) == before


# --- Scheduler.postprocess and preempt
def test_postprocess_twice_for_one_step():
    s = sched()
    a = seq(range(3))
    s.add(a)
    seqs, is_prefill = s.schedule()
    s.postprocess(seqs, [5], is_prefill)
    refused(
        s,
        [a],
        lambda: s.postprocess(seqs, [5], is_prefill),
        match="pass the batch of the latest schedule",
    )
    assert len(a) == 4  # one sampled token, not two
    seqs, is_prefill = s.schedule()  # the next step is fine
    s.postprocess(seqs, [6], is_prefill)
    refused(s, [a], lambda: s.postprocess(seqs, [6], is_prefill), match="latest schedule")


def test_postprocess_of_a_never_scheduled_waiting_sequence():
    s = sched(num_blocks=4)
    a, big = seq(range(9)), seq(range(100, 112))  # big waits: 3 blocks + A's 3 > 4
    s.add(a)
    s.add(big)
    seqs, is_prefill = s.schedule()
    assert seqs == [a]
    refused(
        s,
        [a, big],
        lambda: s.postprocess([big], [5], True),
        match="WAITING, num_scheduled_tokens=0",
    )
    refused(s, [a, big], lambda: s.postprocess([a, big], [5, 5], True), match=r"seqs\[1\]")
    stranger = seq(range(3))
    refused(
        s,
        [a, big, stranger],
        lambda: s.postprocess([stranger], [5], True),
        match="latest schedule",
    )
    s.postprocess(seqs, [5], is_prefill)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        # a prefill batch called a decode
        (lambda seqs: (seqs, [5], False), ValueError, "is_prefill=True"),
        (lambda seqs: (seqs, [5], 1), TypeError, "is_prefill must be True or False"),
        (lambda seqs: (seqs + seqs, [5, 5], True), ValueError, "twice"),
        (lambda seqs: (seqs, [5.0], True), TypeError, r"token_ids\[0\] must be an integer"),
        (
            lambda seqs: (seqs, [-3], True),
            ValueError,
            r"token_ids\[0\] must be from 0 to 2\*\*63 - 1",
        ),
        (lambda seqs: (seqs, [2**70], True), ValueError, r"token_ids\[0\]"),
        (lambda seqs: (seqs, ["7"], True), TypeError, r"token_ids\[0\]"),
        (
            lambda seqs: ([{"seq_id": 0}], [5], True),
            TypeError,
            r"seqs\[0\] must be a Sequence",
        ),
        (lambda seqs: (seqs, [5, 6], True), ValueError, "2 sampled tokens for 1 sequences"),
    ],
)
def test_postprocess_refuses_bad_arguments(args, error, match):
    s = sched()
    a = seq(range(3))
    s.add(a)
    seqs, is_prefill = s.schedule()
    refused(s, [a], lambda: s.postprocess(*args(seqs)), error, match)
    s.postprocess(seqs, [5], is_prefill)  # the right call still works afterwards
    assert len(a) == 4


def test_add_of_a_copy_of_a_queued_sequence(two_running):
    s, a, b, c = two_running
    refused(
        s,
        [a, b, c],
        lambda: s.add(copy.deepcopy(a)),
        match="RUNNING and cannot be added again",
    )
    # waiting, never scheduled: only its seq_id gives it away
    for twin in (copy.deepcopy(c), copy.copy(c)):
        refused(s, [a, b, c], lambda: s.add(twin), match="already scheduled")


def test_postprocess_of_a_copy_of_a_scheduled_sequence(two_running):
    s, a, b, c = two_running
    seqs, is_prefill = s.schedule()
    twin = copy.deepcopy(seqs[0])
    refused(
        s,
        [a, b, c, twin],
        lambda: s.postprocess([twin] + seqs[1:], [5] * len(seqs), is_prefill),
        match="latest schedule",
        holders=[a, b],
    )


def test_preempt_of_a_sequence_still_running(two_running):
    s, a, b, c = two_running
    refused(s, [a, b, c], lambda: s.preempt(a), match="still in `running`")


def test_check_invariants_notices_a_second_postprocess():
    """If postprocess were run twice (here: its moves repeated by hand), a running sequence
    would hold two tokens that are neither cached nor scheduled; check_invariants names the
    rule."""
    s = sched()
    a = seq(range(3))
    s.add(a)
    step(s)
    check_invariants(s.block_manager, [a])
    a.append_token(9)  # the second postprocess's token: its K/V would never be computed
    with pytest.raises(InvariantError, match="one-uncached-token"):
        check_invariants(s.block_manager, [a])


# --- construction
@pytest.mark.parametrize(
    ("tokens", "error", "match"),
    [
        ([1, 2.5], TypeError, r"token_ids\[1\] must be an integer token id, got 2.5"),
        ([1, -1], ValueError, r"token_ids\[1\] must be from 0 to 2\*\*63 - 1"),
        ([2**70], ValueError, r"token_ids\[0\]"),
        ([2**63], ValueError, r"token_ids\[0\]"),
        (["a"], TypeError, r"token_ids\[0\]"),
        ([None], TypeError, r"token_ids\[0\]"),
        ([3, True], TypeError, r"token_ids\[1\] must be an integer token id, got True"),
        (5, TypeError, "token_ids must be an iterable"),
    ],
)
def test_sequence_token_ids_are_checked(tokens, error, match):
    with pytest.raises(error, match=match):
        Sequence(tokens, block_size=4)


def test_largest_token_id_is_accepted_and_hashed():
    x = Sequence([2**63 - 1, 0, 5, 2**62], block_size=2)
    bm = BlockManager(4, 2)
    bm.allocate(x, bm.can_allocate(x))
    x.num_scheduled_tokens = 4
    bm.hash_blocks(x)
    assert x.block_hashes == [
        BlockManager.compute_hash([2**63 - 1, 0]),
        BlockManager.compute_hash([5, 2**62], BlockManager.compute_hash([2**63 - 1, 0])),
    ]


@pytest.mark.parametrize(
    ("token", "error"),
    [(1.0, TypeError), (-1, ValueError), (2**64, ValueError), ("3", TypeError)],
)
def test_append_token_is_checked_before_anything_changes(token, error):
    x = Sequence([1, 2], block_size=4)
    before = seq_snapshot(x)
    with pytest.raises(error, match="token_id"):
        x.append_token(token)
    assert seq_snapshot(x) == before


def test_wrong_object_types_name_the_argument():
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams, got dict"):
        Sequence([1, 2], {"max_tokens": 3})
    with pytest.raises(TypeError, match="config must be a SchedulerConfig, got dict"):
        Scheduler({"num_kvcache_blocks": 4})
    with pytest.raises(TypeError, match="config must be a SchedulerConfig, got type"):
        Scheduler(dict)
    with pytest.raises(TypeError, match="seq must be a Sequence"):
        sched().add([1, 2, 3])


@pytest.mark.parametrize("temperature", ["hot", None, [0.5], True])
def test_temperature_of_a_wrong_type_is_named(temperature):
    with pytest.raises(TypeError, match="temperature must be a number"):
        SamplingParams(temperature=temperature)


@pytest.mark.parametrize("ignore_eos", ["yes", 1, None, 0.0])
def test_ignore_eos_must_be_a_bool(ignore_eos):
    with pytest.raises(TypeError, match="ignore_eos must be True or False"):
        SamplingParams(ignore_eos=ignore_eos)


# --- random misuse between the steps of random workloads
MISUSE = (
    "free_finished",
    "free_copy_of_freed",
    "free_copy_of_live",
    "append_copy_of_live",
    "foreign_ids",
    "stale_postprocess",
    "postprocess_waiting",
    "wrong_kind",
    "duplicate_in_batch",
    "bad_token",
    "preempt_running",
    "allocate_copy",
)


def attempt(
    kind: str, s: Scheduler, rng: random.Random, pool: dict, batch
) -> tuple[object, tuple] | None:
    """(a call that must be refused, the error types allowed), or None when the state offers no
    such misuse."""
    bm = s.block_manager
    live = [x for x in pool["all"] if x.block_table]
    finished = [x for x in pool["all"] if x.status == SequenceStatus.FINISHED]
    if kind == "free_finished" and finished:
        return (lambda: bm.deallocate(rng.choice(finished))), (ValueError,)
    if kind == "free_copy_of_freed" and pool["copies_of_freed"]:
        return (lambda: bm.deallocate(rng.choice(pool["copies_of_freed"]))), (ValueError,)
    if kind == "free_copy_of_live" and live:
        return (lambda: bm.deallocate(copy.deepcopy(rng.choice(live)))), (ValueError,)
    if kind == "append_copy_of_live" and live:
        return (lambda: bm.may_append(copy.deepcopy(rng.choice(live)))), (ValueError,)
    if kind == "allocate_copy" and live:
        twin = copy.deepcopy(rng.choice(live))
        twin.block_table = []
        return (lambda: bm.allocate(twin, 0)), (ValueError,)
    if kind == "foreign_ids":
        stranger = Sequence(rng.choice(pool["prompts"]), block_size=bm.block_size)
        stranger.block_table = [
            rng.choice([-1, bm.num_blocks, rng.randrange(bm.num_blocks)])
            for _ in range(rng.randint(1, 3))
        ]
        return (lambda: bm.deallocate(stranger)), (ValueError,)
    if kind == "stale_postprocess" and pool["last_batch"] and batch is None:
        seqs, is_prefill = pool["last_batch"]
        return (lambda: s.postprocess(seqs, [1] * len(seqs), is_prefill)), (ValueError,)
    if kind == "postprocess_waiting":
        never = [x for x in s.waiting if x.num_scheduled_tokens == 0]
        if never:
            x = rng.choice(never)
            return (lambda: s.postprocess([x], [1], x.is_prefill)), (ValueError,)
    if batch is not None:
        seqs, is_prefill = batch
        if kind == "wrong_kind":
            return (lambda: s.postprocess(seqs, [1] * len(seqs), not is_prefill)), (
                ValueError,
            )
        if kind == "duplicate_in_batch":
            return (
                lambda: s.postprocess(seqs + seqs[:1], [1] * (len(seqs) + 1), is_prefill)
            ), (ValueError,)
        if kind == "bad_token":
            bad = rng.choice([-1, 2**64, 1.5, "x"])
            return (lambda: s.postprocess(seqs, [1] * (len(seqs) - 1) + [bad], is_prefill)), (
                ValueError,
                TypeError,
            )
        if kind == "preempt_running" and s.running:
            return (lambda: s.preempt(rng.choice(list(s.running)))), (ValueError,)
    return None


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    num_blocks=st.integers(4, 12),
    block_size=st.sampled_from([1, 2, 4]),
    max_num_batched_tokens=st.integers(4, 24),
    kinds=st.lists(st.sampled_from(MISUSE), min_size=5, max_size=40),
)
def test_random_misuse_is_refused_and_changes_nothing(
    seed, num_blocks, block_size, max_num_batched_tokens, kinds
):
    rng = random.Random(seed)
    s = Scheduler(
        SchedulerConfig(
            num_kvcache_blocks=num_blocks,
            kvcache_block_size=block_size,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=4,
        )
    )
    prompts = [
        [rng.randrange(4) for _ in range(rng.randint(1, 2 * block_size + 1))] for _ in range(3)
    ]
    pool = {"all": [], "copies_of_freed": [], "last_batch": None, "prompts": prompts}
    batch = None
    tried = 0
    for kind in kinds:
        # One legitimate move (add, schedule or postprocess), then one misuse attempt.
        if rng.random() < 0.3 or s.is_finished():
            x = Sequence(
                rng.choice(prompts) + [rng.randrange(4)],
                SamplingParams(max_tokens=rng.randint(1, 4)),
                block_size=block_size,
            )
            if s.max_blocks_needed(x) <= num_blocks:
                s.add(x)
                pool["all"].append(x)
        elif batch is None:
            batch = s.schedule()
        else:
            live_before = [(x, copy.deepcopy(x)) for x in batch[0]]
            s.postprocess(batch[0], [rng.randrange(4) for _ in batch[0]], batch[1])
            pool["copies_of_freed"] += [
                twin for x, twin in live_before if x.status == SequenceStatus.FINISHED
            ]
            pool["last_batch"], batch = batch, None
        misuse = attempt(kind, s, rng, pool, batch)
        if misuse is None:
            continue
        action, errors = misuse
        before = snapshot(s, pool["all"])
        with pytest.raises(errors):
            action()
        assert snapshot(s, pool["all"]) == before, kind
        check_invariants(s.block_manager, [x for x in pool["all"] if x.block_table])
        event(f"refused: {kind}")
        tried += 1
    event(f"misuse attempts per example: {min(tried, 10)}{'+' if tried >= 10 else ''}")


def test_a_count_from_can_allocate_that_went_stale_is_refused():
    """allocate takes can_allocate's hits as they are only while nothing changed in between:
    here the one cached block is handed out again first, so the count of 1 is refused."""
    bm = BlockManager(3, 4)
    first = seq(range(5))
    bm.allocate(first, 0)
    first.num_scheduled_tokens = 5
    bm.hash_blocks(first)  # block 0 cached
    bm.deallocate(first)  # free queue: 2, 1, 0
    again = seq(range(5))
    assert bm.can_allocate(again) == 1
    # takes 2, 1 and 0: the cached block is overwritten
    bm.allocate(filler := seq(range(100, 112)), 0)
    bm.deallocate(filler)
    before = manager_snapshot(bm)
    with pytest.raises(ValueError, match="an integer from 0 to 0"):
        bm.allocate(again, 1)
    assert manager_snapshot(bm) == before
    assert bm.can_allocate(again) == 0
