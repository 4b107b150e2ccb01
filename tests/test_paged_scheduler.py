"""Scheduler scenarios with exact per-step traces, worked out by hand from nano-vllm's rules.

Block size 4 everywhere so every block boundary is visible. A trace row is
(kind, seq_ids, tokens computed per sequence, preempted, finished, blocks in use after the
step); sequence ids start at 0 in every test.
"""

from __future__ import annotations

import itertools
from collections import deque

import pytest

from refimpl.course.runners import (
    FakeModelRunner,
    MaxStepsExceeded,
    SchedulerDriver,
    run_to_completion,
)
from refimpl.errors import InvariantError
from refimpl.paged import SamplingParams, Scheduler, SchedulerConfig, Sequence, SequenceStatus

BS = 4


@pytest.fixture(autouse=True)
def fresh_seq_ids(monkeypatch):
    monkeypatch.setattr(Sequence, "counter", itertools.count())


def seq(tokens, max_tokens=64, ignore_eos=False):
    return Sequence(
        list(tokens),
        SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos),
        block_size=BS,
    )


def sched(num_blocks=10, **kwargs):
    return Scheduler(
        SchedulerConfig(num_kvcache_blocks=num_blocks, kvcache_block_size=BS, **kwargs)
    )


def trace(steps):
    return [
        (
            r.kind,
            r.seq_ids,
            r.num_scheduled_tokens,
            r.preempted_seq_ids,
            r.finished_seq_ids,
            r.num_blocks_in_use,
        )
        for r in steps
    ]


def assert_reference_outputs(runner, seqs):
    """Every sequence generated exactly what it would generate alone, unbatched and
    uncached."""
    for s in seqs:
        assert s.status == SequenceStatus.FINISHED
        assert s.block_table == []
        assert s.completion_token_ids == runner.reference_completion(
            s.prompt_token_ids, s.max_tokens, s.ignore_eos
        )


def test_plain_prefill_then_decode():
    s = sched()
    a, b = seq(range(10, 15), max_tokens=3), seq(range(20, 23), max_tokens=2)
    driver = SchedulerDriver(s)
    driver.add([a, b])
    driver.step()
    assert (a.block_table, b.block_table) == ([0, 1], [2])
    assert (a.status, a.is_prefill, len(a), a.num_cached_tokens) == (
        SequenceStatus.RUNNING,
        True,
        6,
        5,
    )
    driver.run()
    assert trace(driver.steps) == [
        ("prefill", (0, 1), (5, 3), (), (), 3),
        ("decode", (0, 1), (1, 1), (), (1,), 2),
        ("decode", (0,), (1,), (), (0,), 0),
    ]
    assert not a.is_prefill
    assert len(s.block_manager.free_block_ids) == 10
    assert_reference_outputs(driver.runner, [a, b])


def test_decode_sets_is_prefill_false_and_one_token():
    s = sched()
    a = seq(range(3), max_tokens=5)
    s.add(a)
    seqs, is_prefill = s.schedule()
    assert (seqs, is_prefill, a.num_scheduled_tokens) == ([a], True, 3)
    s.postprocess(seqs, [7], is_prefill)
    assert a.is_prefill and a.num_scheduled_tokens == 0 and a.token_ids == [0, 1, 2, 7]
    seqs, is_prefill = s.schedule()
    assert (seqs, is_prefill, a.num_scheduled_tokens, a.is_prefill) == ([a], False, 1, False)


def test_chunked_prefill_only_for_the_first_sequence():
    # Budget 6: A (3 tokens) fits; B (10) is not first, so it is not cut and waits for the next
    # step, where it is first and gets a 6-token chunk; its last 4 tokens then share a step
    # with C.
    s = sched(max_num_batched_tokens=6)
    a, b, c = (
        seq(range(3), max_tokens=1),
        seq(range(10, 20), max_tokens=1),
        seq(range(30, 32), max_tokens=1),
    )
    driver = SchedulerDriver(s)
    driver.add([a, b, c])
    driver.step()
    driver.step()
    # B keeps its place at the head of `waiting`, already holding all 3 of its blocks.
    assert list(s.waiting) == [b, c] and b.status == SequenceStatus.WAITING
    # A's block 0 went to the queue tail
    assert (b.block_table, b.num_cached_tokens) == ([1, 2, 3], 6)
    # only full blocks
    assert s.block_manager.blocks[1].hash != -1 and s.block_manager.blocks[2].hash == -1
    driver.run()
    assert trace(driver.steps) == [
        ("prefill", (0,), (3,), (), (0,), 0),
        ("prefill", (1,), (6,), (), (), 3),
        ("prefill", (1, 2), (4, 2), (), (1, 2), 0),
    ]
    assert [r.chunked_seq_ids for r in driver.steps] == [(), (1,), ()]
    assert_reference_outputs(driver.runner, [a, b, c])


def test_chunk_takes_what_is_left_of_the_budget_then_next_sequence_waits():
    s = sched(max_num_batched_tokens=6)
    a, b = seq(range(10), max_tokens=2), seq(range(20, 23), max_tokens=2)
    steps = run_to_completion(s, [a, b])
    assert trace(steps) == [
        ("prefill", (0,), (6,), (), (), 3),
        # B (3 tokens) does not fit in the 2 left and is not first
        ("prefill", (0,), (4,), (), (), 3),
        ("prefill", (1,), (3,), (), (), 4),
        ("decode", (0, 1), (1, 1), (), (0, 1), 0),
    ]


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_prefix_hits_reduce_scheduled_tokens(enable_prefix_caching):
    s = sched(enable_prefix_caching=enable_prefix_caching)
    shared = list(range(100, 108))
    a = seq(shared + [1, 2], max_tokens=1)
    driver = SchedulerDriver(s)
    driver.add(a)
    driver.run()
    b = seq(shared + [3, 4, 5], max_tokens=1)
    driver.add(b)
    driver.run()
    if enable_prefix_caching:
        # A's two full blocks were freed but not overwritten: B pulls them out of the free
        # queue.
        assert [r.prefix_hit_tokens for r in driver.steps] == [(0,), (8,)]
        assert trace(driver.steps) == [
            ("prefill", (0,), (10,), (), (0,), 0),
            ("prefill", (1,), (3,), (), (1,), 0),
        ]
    else:
        assert [r.prefix_hit_tokens for r in driver.steps] == [(0,), (0,)]
        assert trace(driver.steps) == [
            ("prefill", (0,), (10,), (), (0,), 0),
            ("prefill", (1,), (11,), (), (1,), 0),
        ]
    assert_reference_outputs(driver.runner, [a, b])


def test_prefix_hit_on_blocks_in_use_shares_them():
    s = sched()
    shared = list(range(100, 108))
    a, b = seq(shared + [1], max_tokens=3), seq(shared + [2, 3], max_tokens=2)
    driver = SchedulerDriver(s)
    driver.add(a)
    driver.step()
    driver.add(b)
    driver.step()
    assert a.block_table == [0, 1, 2] and b.block_table == [0, 1, 3]
    assert [s.block_manager.blocks[i].ref_count for i in range(4)] == [2, 2, 1, 1]
    driver.run()
    assert trace(driver.steps) == [
        ("prefill", (0,), (9,), (), (), 3),
        # 8 of B's 10 tokens come from A's blocks, which stay shared
        ("prefill", (1,), (2,), (), (), 4),
        ("decode", (0, 1), (1, 1), (), (1,), 3),
        ("decode", (0,), (1,), (), (0,), 0),
    ]
    assert [r.prefix_hit_tokens for r in driver.steps] == [(0,), (8,), (0, 0), (0,)]
    assert_reference_outputs(driver.runner, [a, b])


def test_preemption_of_the_last_running_sequence_then_recompute():
    # Pool of 4 blocks. At step 1 A and B both cross into a second block: A takes the last free
    # block, so C (the last running sequence) is preempted to make room for B.
    s = sched(num_blocks=4)
    a, b, c = (seq(range(k * 10, k * 10 + 4), max_tokens=5) for k in range(3))
    driver = SchedulerDriver(s)
    driver.add([a, b, c])
    driver.step()
    record = driver.step()
    assert record.preempted_seq_ids == (2,) and s.num_preemptions == 1
    assert (c.status, c.is_prefill, c.block_table, c.num_cached_tokens) == (
        SequenceStatus.WAITING,
        True,
        [],
        0,
    )
    assert list(s.waiting) == [c] and list(s.running) == [a, b]
    assert (a.block_table, b.block_table) == ([0, 3], [1, 2])  # B got C's freed block 2
    driver.run()
    assert trace(driver.steps) == [
        ("prefill", (0, 1, 2), (4, 4, 4), (), (), 3),
        ("decode", (0, 1), (1, 1), (2,), (), 4),
        ("decode", (0, 1), (1, 1), (), (), 4),  # C cannot get 2 blocks yet, so decode goes on
        ("decode", (0, 1), (1, 1), (), (), 4),
        ("decode", (0, 1), (1, 1), (), (0, 1), 0),
        # recompute: 4 prompt tokens + the 1 it had generated
        ("prefill", (2,), (5,), (), (), 2),
        ("decode", (2,), (1,), (), (), 2),
        ("decode", (2,), (1,), (), (), 2),
        ("decode", (2,), (1,), (), (2,), 0),
    ]
    # its old block was overwritten by B
    assert [r.prefix_hit_tokens for r in driver.steps][5] == (0,)
    assert_reference_outputs(driver.runner, [a, b, c])


def test_preemption_takes_from_the_back_and_keeps_arrival_order():
    # Pool of 5, four 4-token sequences all crossing into a 2nd block at step 1. A takes the
    # only free block; B preempts D (the last), not C; C then finds nothing free and nobody
    # behind it, so it preempts itself. Both go back to the front of `waiting`, C before D.
    s = sched(num_blocks=5)
    a, b, c, d = (seq(range(k * 10, k * 10 + 4), max_tokens=5) for k in range(4))
    driver = SchedulerDriver(s)
    driver.add([a, b, c, d])
    driver.step()
    driver.step()
    assert trace(driver.steps) == [
        ("prefill", (0, 1, 2, 3), (4, 4, 4, 4), (), (), 4),
        ("decode", (0, 1), (1, 1), (3, 2), (), 4),
    ]
    assert list(s.waiting) == [c, d] and list(s.running) == [a, b]
    assert (a.block_table, b.block_table) == ([0, 4], [1, 3])
    assert list(s.block_manager.free_block_ids) == [2]  # C's block, still cached
    driver.run()
    assert_reference_outputs(driver.runner, [a, b, c, d])


def test_preempted_sequence_goes_to_the_front_of_waiting():
    s = sched(num_blocks=4)
    a, b, c = (seq(range(k * 10, k * 10 + 4), max_tokens=5) for k in range(3))
    d = seq(range(50, 55), max_tokens=4)  # needs 2 blocks: cannot start while only 1 is free
    s.add(a), s.add(b), s.add(c)
    seqs, is_prefill = s.schedule()
    s.postprocess(seqs, [1, 2, 3], is_prefill)
    s.add(d)
    seqs, is_prefill = s.schedule()
    assert (seqs, is_prefill, s.preempted_last_step) == ([a, b], False, [c.seq_id])
    assert s.waiting == deque([c, d])


def test_decode_preempts_itself_when_it_is_the_only_one_left():
    s = sched(num_blocks=3)
    a, b = seq(range(4), max_tokens=5), seq(range(10, 14), max_tokens=5)
    steps = run_to_completion(s, [a, b])
    assert trace(steps)[:2] == [
        ("prefill", (0, 1), (4, 4), (), (), 2),
        # B found no block and nobody behind it: it preempted itself
        ("decode", (0,), (1,), (1,), (), 2),
    ]
    assert s.num_preemptions == 1


def test_eos_and_ignore_eos():
    eos = 1000
    s = sched(eos=eos)
    runner = FakeModelRunner.for_scheduler(s, vocab_size=1000, eos_after=2)
    a, b = seq(range(3), max_tokens=5), seq(range(10, 13), max_tokens=5, ignore_eos=True)
    steps = run_to_completion(s, [a, b], runner)
    assert trace(steps) == [
        ("prefill", (0, 1), (3, 3), (), (), 2),
        ("decode", (0, 1), (1, 1), (), (), 2),
        # both crossed into a 2nd block; A sampled EOS and freed its 2
        ("decode", (0, 1), (1, 1), (), (0,), 2),
        ("decode", (1,), (1,), (), (), 2),
        ("decode", (1,), (1,), (), (1,), 0),
    ]
    assert a.completion_token_ids[-1] == eos and len(a.completion_token_ids) == 3
    assert b.completion_token_ids[2] == eos and len(b.completion_token_ids) == 5
    assert eos not in a.completion_token_ids[:-1]
    assert_reference_outputs(runner, [a, b])


def test_max_tokens_including_one_token_finishes_in_prefill():
    s = sched()
    a, b = seq(range(3), max_tokens=1), seq(range(10, 13), max_tokens=3)
    steps = run_to_completion(s, [a, b])
    assert trace(steps) == [
        ("prefill", (0, 1), (3, 3), (), (0,), 1),
        ("decode", (1,), (1,), (), (), 1),
        ("decode", (1,), (1,), (), (1,), 0),
    ]
    assert [len(x.completion_token_ids) for x in (a, b)] == [1, 3]


def test_max_num_seqs_limits_prefill_and_decode_batches():
    s = sched(max_num_seqs=2)
    a, b, c = (seq(range(k * 10, k * 10 + 2), max_tokens=3) for k in range(3))
    steps = run_to_completion(s, [a, b, c])
    assert trace(steps) == [
        ("prefill", (0, 1), (2, 2), (), (), 2),
        ("prefill", (2,), (2,), (), (), 3),  # waiting sequences always go before decodes
        # C is third in `running`: no room in a batch of 2
        ("decode", (0, 1), (1, 1), (), (), 3),
        ("decode", (0, 1), (1, 1), (), (0, 1), 1),
        ("decode", (2,), (1,), (), (), 1),
        ("decode", (2,), (1,), (), (2,), 0),
    ]


# --- confusing cases
def test_prompt_length_equal_to_block_size():
    s = sched()
    a = seq(range(4), max_tokens=3)
    driver = SchedulerDriver(s)
    driver.add(a)
    driver.step()
    # The prompt exactly fills block 0, which is registered at once; the sampled 5th token has
    # no block yet: the next decode step must add one.
    assert a.block_table == [0] and len(a) == 5 and s.block_manager.blocks[0].hash != -1
    driver.run()
    assert trace(driver.steps) == [
        ("prefill", (0,), (4,), (), (), 1),
        ("decode", (0,), (1,), (), (), 2),
        ("decode", (0,), (1,), (), (0,), 0),
    ]
    # The same 4-token prompt again: its only block is its last block, which is never looked
    # up.
    b = seq(range(4), max_tokens=1)
    driver.add(b)
    driver.run()
    assert driver.steps[-1].prefix_hit_tokens == (0,) and driver.steps[
        -1
    ].num_scheduled_tokens == (4,)


def test_fully_cached_prompt_still_recomputes_its_last_block():
    s = sched()
    prompt = list(range(100, 108))
    driver = SchedulerDriver(s)
    a = seq(prompt, max_tokens=1)
    driver.add(a)
    driver.run()  # A's table was [0, 1]; freed last block first, so the queue ends ... 1, 0
    b = seq(prompt, max_tokens=2)
    driver.add(b)
    driver.step()
    # Only block 0 is looked up; block 1 holds the same tokens but is the last block:
    # recomputed.
    assert b.block_table == [0, 2]
    assert (driver.steps[-1].prefix_hit_tokens, driver.steps[-1].num_scheduled_tokens) == (
        (4,),
        (4,),
    )
    # Registering B's copy moved the cache entry for the second block from block 1 to block 2.
    h1 = s.block_manager.blocks[1].hash
    assert h1 == s.block_manager.blocks[2].hash and s.block_manager.hash_to_block_id[h1] == 2
    # One more token and the whole 8-token prefix is a hit (B's blocks, shared while B runs).
    c = seq(prompt + [5], max_tokens=2)
    driver.add(c)
    driver.step()
    assert (driver.steps[-1].prefix_hit_tokens, driver.steps[-1].num_scheduled_tokens) == (
        (8,),
        (1,),
    )
    assert c.block_table[:2] == [0, 2] and [
        s.block_manager.blocks[i].ref_count for i in (0, 2)
    ] == [2, 2]
    driver.run()
    assert_reference_outputs(driver.runner, [a, b, c])


def test_identical_prompts_in_one_step_both_miss():
    s = sched()
    prompt = list(range(100, 108))
    a, b = seq(prompt, max_tokens=2), seq(prompt, max_tokens=2)
    driver = SchedulerDriver(s)
    driver.add([a, b])
    driver.step()
    # Hashes are registered only in postprocess, so B found nothing of A's and got its own
    # blocks.
    assert driver.steps[0].prefix_hit_tokens == (0, 0)
    assert (a.block_table, b.block_table) == ([0, 1], [2, 3])
    # Both registered the same two hashes; the later registration (B) won the map.
    assert sorted(s.block_manager.hash_to_block_id.values()) == [2, 3]
    assert [s.block_manager.blocks[i].hash for i in (0, 1)] == [
        s.block_manager.blocks[i].hash for i in (2, 3)
    ]
    driver.run()
    assert trace(driver.steps) == [
        ("prefill", (0, 1), (8, 8), (), (), 4),
        ("decode", (0, 1), (1, 1), (), (0, 1), 0),
    ]
    assert a.completion_token_ids == b.completion_token_ids
    assert_reference_outputs(driver.runner, [a, b])


def test_chunked_prefill_after_a_preemption():
    # B is preempted after generating 4 tokens; its recompute (5 tokens) is bigger than the
    # 4-token budget, so the first step back is a chunk.
    s = sched(num_blocks=3, max_num_batched_tokens=4)
    a, b = seq(range(3), max_tokens=8), seq([50], max_tokens=8)
    steps = run_to_completion(s, [a, b])
    assert trace(steps) == [
        ("prefill", (0, 1), (3, 1), (), (), 2),
        ("decode", (0, 1), (1, 1), (), (), 2),
        ("decode", (0, 1), (1, 1), (), (), 3),
        ("decode", (0, 1), (1, 1), (), (), 3),
        ("decode", (0,), (1,), (1,), (), 2),
        # B's first block is cached but B needs 2 free blocks
        ("decode", (0,), (1,), (), (), 2),
        # A takes the last free block: B's cached block is gone
        ("decode", (0,), (1,), (), (), 3),
        ("decode", (0,), (1,), (), (0,), 0),
        ("prefill", (1,), (4,), (), (), 2),
        ("prefill", (1,), (1,), (), (), 2),
        ("decode", (1,), (1,), (), (), 2),
        ("decode", (1,), (1,), (), (), 2),
        ("decode", (1,), (1,), (), (1,), 0),
    ]
    assert [r.chunked_seq_ids for r in steps][8:10] == [(1,), ()]
    runner = FakeModelRunner.for_scheduler(s)
    assert_reference_outputs(runner, [a, b])


def test_preempted_sequence_can_hit_its_own_freed_blocks():
    # B holds a full first block and a partial second one. Preemption frees the last block
    # first, so A reuses B's partial block while B's full block stays cached for B's recompute.
    s = sched(num_blocks=4)
    a, b = seq(range(8), max_tokens=2), seq(range(10, 15), max_tokens=4)
    driver = SchedulerDriver(s)
    driver.add([a, b])
    driver.step()
    assert (a.block_table, b.block_table) == ([0, 1], [2, 3])
    driver.step()
    assert list(s.block_manager.free_block_ids) == [2, 3, 1, 0]
    driver.run()
    assert trace(driver.steps) == [
        ("prefill", (0, 1), (8, 5), (), (), 4),
        # A needs a 3rd block: B (behind it) is preempted
        ("decode", (0,), (1,), (1,), (0,), 0),
        # B's first block is a hit: 2 of its 6 tokens are computed
        ("prefill", (1,), (2,), (), (), 2),
        ("decode", (1,), (1,), (), (), 2),
        ("decode", (1,), (1,), (), (1,), 0),
    ]
    assert driver.steps[2].prefix_hit_tokens == (4,) and b.block_table == []
    assert_reference_outputs(driver.runner, [a, b])


# --- bad input
def test_add_rejects_a_sequence_that_can_never_fit():
    s = sched(num_blocks=2)
    too_big = seq(range(5), max_tokens=5)  # grows to 9 computed tokens: 3 blocks
    with pytest.raises(ValueError, match="3 blocks.*only 2"):
        s.add(too_big)
    assert not s.waiting and not s.running and too_big.status == SequenceStatus.WAITING
    fits = seq(range(4), max_tokens=5)  # the 9th token is never computed: 8 tokens, 2 blocks
    s.add(fits)
    assert list(s.waiting) == [fits]


def test_add_rejects_wrong_block_size_duplicates_and_finished():
    s = sched()
    with pytest.raises(ValueError, match="block_size"):
        s.add(Sequence([1, 2], block_size=8))
    a = seq([1, 2], max_tokens=1)
    s.add(a)
    with pytest.raises(ValueError, match="already"):
        s.add(a)
    run_to_completion(s, [])
    with pytest.raises(ValueError, match="FINISHED"):
        s.add(a)
    assert s.is_finished()


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_kvcache_blocks", 0),
        ("num_kvcache_blocks", -3),
        ("num_kvcache_blocks", 2.5),
        ("num_kvcache_blocks", True),
        ("kvcache_block_size", 0),
        ("max_num_seqs", 0),
        ("max_num_batched_tokens", 0),
        ("max_num_batched_tokens", "16"),
        ("eos", -2),
        ("eos", 1.0),
        ("enable_prefix_caching", "yes"),
    ],
)
def test_bad_scheduler_config_values(field, value):
    kwargs = {"num_kvcache_blocks": 4, field: value}
    with pytest.raises(
        ValueError,
        match=field.replace("kvcache_", "") if field == "kvcache_block_size" else field,
    ):
        SchedulerConfig(**kwargs)


def test_postprocess_rejects_wrong_token_count_before_changing_anything():
    s = sched()
    a = seq(range(3), max_tokens=2)
    s.add(a)
    seqs, is_prefill = s.schedule()
    with pytest.raises(ValueError, match="2 sampled tokens for 1 sequences"):
        s.postprocess(seqs, [1, 2], is_prefill)
    assert (a.num_cached_tokens, a.num_scheduled_tokens, len(a)) == (0, 3, 3)


def test_preempt_without_blocks_is_an_error_before_any_change():
    s = sched()
    a = seq(range(5), max_tokens=3)
    run_to_completion(s, [a])  # finished: decoded (is_prefill False), blocks freed
    before = (a.status, a.is_prefill, list(s.waiting), s.num_preemptions)
    assert before == (SequenceStatus.FINISHED, False, [], 0)
    with pytest.raises(ValueError, match="holds no blocks"):
        s.preempt(a)
    assert (a.status, a.is_prefill, list(s.waiting), s.num_preemptions) == before


def test_schedule_with_nothing_queued_is_an_error():
    with pytest.raises(ValueError, match="nothing to schedule"):
        sched().schedule()


# --- runner and driver
def test_runner_tokens_are_a_pure_function_of_history():
    r1 = FakeModelRunner(4, BS, vocab_size=50)
    r2 = FakeModelRunner(9, BS, vocab_size=50)
    assert r1.next_token([1, 2, 3], 3) == r2.next_token([1, 2, 3], 3)
    tokens = [r1.next_token(list(range(n)), n) for n in range(1, 40)]
    assert all(0 <= t < 50 for t in tokens) and len(set(tokens)) > 10


def test_runner_eos_rules():
    r = FakeModelRunner(4, BS, vocab_size=10, eos=3, eos_after=4)
    out = r.reference_completion([1, 2], max_tokens=20)
    # ordinary tokens avoid the EOS id
    assert len(out) == 5 and out[-1] == 3 and 3 not in out[:-1]
    assert len(r.reference_completion([1, 2], max_tokens=20, ignore_eos=True)) == 20
    periodic = FakeModelRunner(4, BS, vocab_size=10, eos=10, eos_period=3)
    lengths = {len(periodic.reference_completion([k], max_tokens=50)) for k in range(30)}
    assert len(lengths) > 3 and max(lengths) < 50  # stops at varied, deterministic points
    with pytest.raises(ValueError, match="eos"):
        FakeModelRunner(4, BS, eos_after=2)
    with pytest.raises(ValueError, match="vocab_size"):
        FakeModelRunner(4, BS, vocab_size=1)


def test_runner_detects_a_wrong_block_table():
    s = sched()
    a, b = seq(range(6), max_tokens=3), seq(range(10, 16), max_tokens=3)
    driver = SchedulerDriver(s, check=False)
    driver.add([a, b])
    driver.step()
    b.block_table[0] = a.block_table[0]  # B now reads A's K/V for its first block
    with pytest.raises(InvariantError, match="sequence 1: the cache slot for position 0"):
        driver.step()


def test_driver_max_steps_guard():
    s = sched()
    driver = SchedulerDriver(s)
    driver.add(seq(range(3), max_tokens=10))
    with pytest.raises(MaxStepsExceeded, match="after 4 steps"):
        driver.run(max_steps=4)
    assert len(driver.steps) == 4
    assert len(driver.run()) == 6  # the rest; the driver can continue
    with pytest.raises(ValueError, match="max_steps"):
        driver.run(max_steps=0)


def test_driver_needs_the_runner_that_filled_the_cache():
    s = sched()
    first = SchedulerDriver(s)
    first.add(seq(range(8), max_tokens=1))
    first.run()  # two full blocks stay cached after the sequence finished
    with pytest.raises(ValueError, match="pass that FakeModelRunner"):
        SchedulerDriver(s)
    stranger = SchedulerDriver(s, FakeModelRunner.for_scheduler(s))
    stranger.add(seq(range(9), max_tokens=1))
    with pytest.raises(InvariantError, match="never written by this runner"):
        stranger.step()
    again = SchedulerDriver(s, first.runner)
    again.add(seq(range(9), max_tokens=1))
    assert again.step().prefix_hit_tokens == (8,)


def test_driver_add_is_all_or_nothing():
    s = sched(num_blocks=2)
    driver = SchedulerDriver(s)
    first = seq(range(2), max_tokens=2)
    driver.add(first)
    with pytest.raises(ValueError, match="could never run"):
        driver.add([seq(range(3), max_tokens=2), seq(range(9), max_tokens=2)])
    assert list(s.waiting) == [first]


def test_driver_checks_invariants_after_each_step():
    s = sched()
    driver = SchedulerDriver(s)
    driver.add(seq(range(6), max_tokens=3))
    driver.step()
    s.block_manager.blocks[s.running[0].block_table[0]].ref_count += 1  # break the ledger
    with pytest.raises(InvariantError, match="ref-count"):
        driver.step()


def test_driver_rejects_a_runner_of_another_size():
    with pytest.raises(ValueError, match="does not match"):
        SchedulerDriver(sched(num_blocks=4), FakeModelRunner(5, BS))
