"""The Scheduler moves blocks only through nano-vllm's six BlockManager methods, where
nano-vllm does.

An object that has nothing but `can_allocate`, `allocate`, `can_append`, `may_append`,
`hash_blocks` and `deallocate` (it forwards them to a real BlockManager and logs each call) is
plugged into a Scheduler: if the Scheduler reached for anything else (the free queue, the hash
map, a private helper) it would fail with an AttributeError. The log of a hand-worked run with
a prefix hit, a chunked prefill, decodes, a preemption and a blocked waiting head must be
exactly the calls nano-vllm's `schedule()` / `postprocess()` make, in its order; on random
workloads the log must follow nano-vllm's protocol call by call.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nanovllm_oracle import VOCAB, Workload, configs, workloads

from refimpl.course.runners import FakeModelRunner
from refimpl.paged import BlockManager, SamplingParams, Scheduler, SchedulerConfig, Sequence

PUBLIC_METHODS = (
    "can_allocate",
    "allocate",
    "can_append",
    "may_append",
    "hash_blocks",
    "deallocate",
)


class PublicOnly:
    """Only nano-vllm's six methods, each forwarded to a BlockManager and logged as (method,
    seq_id, result)."""

    __slots__ = ("_inner", "calls")

    def __init__(self, inner: BlockManager) -> None:
        self._inner = inner
        self.calls: list[tuple[str, int, object]] = []

    def _forward(self, name: str, seq: Sequence, *args):
        result = getattr(self._inner, name)(seq, *args)
        self.calls.append((name, seq.seq_id, result))
        return result

    def can_allocate(self, seq):
        return self._forward("can_allocate", seq)

    def allocate(self, seq, num_cached_blocks):
        return self._forward("allocate", seq, num_cached_blocks)

    def can_append(self, seq):
        return self._forward("can_append", seq)

    def may_append(self, seq):
        return self._forward("may_append", seq)

    def hash_blocks(self, seq):
        return self._forward("hash_blocks", seq)

    def deallocate(self, seq):
        return self._forward("deallocate", seq)


def plugged_scheduler(config: SchedulerConfig) -> tuple[Scheduler, PublicOnly, BlockManager]:
    scheduler = Scheduler(config)
    inner = scheduler.block_manager
    spy = PublicOnly(inner)
    scheduler.block_manager = spy
    return scheduler, spy, inner


@pytest.fixture(autouse=True)
def fresh_seq_ids(monkeypatch):
    monkeypatch.setattr(Sequence, "counter", itertools.count())


def test_a_worked_run_makes_exactly_nano_vllms_calls():
    """Block size 4, a pool of 4 blocks, 8 tokens per step (worked out by hand from nano-vllm's
    code).

    A (11 tokens) is cut into a chunk of 8 then 3; B shares A's first block (an in-use hit). At
    step 3 A starts a new block with the pool empty, so B (the newest running) is preempted; at
    step 4 B does not fit (its second block's entry went with the block A just took) and A
    decodes alone; at step 5 B comes back with its freed first block revived from the cache.
    """
    config = SchedulerConfig(
        num_kvcache_blocks=4, kvcache_block_size=4, max_num_batched_tokens=8
    )
    scheduler, spy, inner = plugged_scheduler(config)
    a = Sequence(list(range(8)) + [100, 101, 102], SamplingParams(max_tokens=4), block_size=4)
    b = Sequence([0, 1, 2, 3, 200, 201, 202], SamplingParams(max_tokens=3), block_size=4)
    A, B = a.seq_id, b.seq_id
    scheduler.add(a)
    log = []
    for step in range(6):
        if step == 1:
            scheduler.add(b)
        spy.calls.clear()
        seqs, is_prefill = scheduler.schedule()
        scheduled = list(spy.calls)
        spy.calls.clear()
        scheduler.postprocess(seqs, [300 + step] * len(seqs), is_prefill)
        log.append((is_prefill, [s.seq_id for s in seqs], scheduled, list(spy.calls)))
    assert scheduler.is_finished()
    assert log == [
        (
            True,
            [A],
            [("can_allocate", A, 0), ("allocate", A, None)],  # 8 of A's 11 tokens
            [("hash_blocks", A, None)],
        ),
        # A's last 3; B hits block 0
        (
            True,
            [A, B],
            [("can_allocate", B, 1), ("allocate", B, None)],
            [("hash_blocks", A, None), ("hash_blocks", B, None)],
        ),
        (
            False,
            [A, B],
            [
                ("can_append", A, True),
                ("may_append", A, None),
                ("can_append", B, True),
                ("may_append", B, None),
            ],
            [("hash_blocks", A, None), ("hash_blocks", B, None)],
        ),
        (
            False,
            [A],
            [
                ("can_append", A, False),
                ("deallocate", B, None),
                ("can_append", A, True),
                ("may_append", A, None),
            ],
            [("hash_blocks", A, None)],
        ),
        (
            False,
            [A],
            [("can_allocate", B, -1), ("can_append", A, True), ("may_append", A, None)],
            [("hash_blocks", A, None), ("deallocate", A, None)],
        ),  # A reaches max_tokens
        # block 0 revived from the free queue
        (
            True,
            [B],
            [("can_allocate", B, 1), ("allocate", B, None)],
            [("hash_blocks", B, None), ("deallocate", B, None)],
        ),
    ]
    assert scheduler.num_preemptions == 1
    assert len(inner.free_block_ids) == 4 and not inner.used_block_ids


def test_a_plugged_block_manager_decides():
    """What the plugged manager answers is what the Scheduler does: one that never finds a
    cached block makes B compute its whole prompt."""

    class NoHits(BlockManager):
        def _prefix_hits(self, seq, limit):
            return []

    config = SchedulerConfig(num_kvcache_blocks=8, kvcache_block_size=4)
    scheduler = Scheduler(config)
    scheduler.block_manager = NoHits(8, 4)
    a, b = (
        Sequence([0, 1, 2, 3, 4], SamplingParams(max_tokens=2), block_size=4) for _ in range(2)
    )
    scheduler.add(a)
    seqs, _ = scheduler.schedule()
    scheduler.postprocess(seqs, [7], True)
    scheduler.add(b)
    seqs, is_prefill = scheduler.schedule()
    assert (seqs, is_prefill, b.num_scheduled_tokens, b.block_table) == ([b], True, 5, [2, 3])
    assert (
        Scheduler(config).block_manager.can_allocate(Sequence([0, 1, 2, 3, 4], block_size=4))
        == 0
    )


def protocol_errors(
    calls: list[tuple[str, int, object]],
    seqs: list[Sequence],
    is_prefill: bool,
    post_calls: list[tuple[str, int, object]],
) -> list[str]:
    """Where one step's calls leave nano-vllm's order (an empty list when they follow it)."""
    errors = []
    names = [name for name, _, _ in calls]
    if is_prefill:
        # (can_allocate, allocate)* then at most one refused or unused can_allocate; no decode
        # calls.
        if {"can_append", "may_append", "hash_blocks", "deallocate"} & set(names):
            errors.append(f"a prefill step made decode calls: {names}")
        for i, (name, seq_id, _result) in enumerate(calls):
            if name == "allocate" and (
                i == 0 or calls[i - 1][:2] != ("can_allocate", seq_id) or calls[i - 1][2] == -1
            ):
                errors.append(
                    f"allocate({seq_id}) not right after an accepting can_allocate({seq_id})"
                )
    else:
        # A decode step may start with the waiting head's refused can_allocate, nothing else of
        # a prefill.
        if calls and calls[0][0] == "can_allocate" and calls[0][2] == -1:
            names = names[1:]
        if {"can_allocate", "allocate", "hash_blocks"} & set(names):
            errors.append(
                f"a decode step made prefill calls: {[name for name, _, _ in calls]}"
            )
        for i, (name, seq_id, _) in enumerate(calls):
            if name == "may_append" and (
                i == 0 or calls[i - 1] != ("can_append", seq_id, True)
            ):
                errors.append(
                    f"may_append({seq_id}) not right after can_append({seq_id}) -> True"
                )
            if (
                name == "can_append"
                and calls[i][2] is False
                and (i + 1 == len(calls) or calls[i + 1][0] != "deallocate")
            ):
                errors.append(f"can_append({seq_id}) -> False not followed by a preemption")
        appended = [seq_id for name, seq_id, _ in calls if name == "may_append"]
        if appended != [s.seq_id for s in seqs]:
            errors.append(
                f"may_append went to {appended}, the batch is {[s.seq_id for s in seqs]}"
            )
    # postprocess: hash_blocks for every sequence in batch order, each maybe followed by its
    # deallocate.
    hashed = [seq_id for name, seq_id, _ in post_calls if name == "hash_blocks"]
    if hashed != [s.seq_id for s in seqs]:
        errors.append(f"hash_blocks went to {hashed}, the batch is {[s.seq_id for s in seqs]}")
    for i, (name, seq_id, _) in enumerate(post_calls):
        if name == "deallocate" and (
            i == 0 or post_calls[i - 1][:2] != ("hash_blocks", seq_id)
        ):
            errors.append(f"postprocess freed {seq_id} out of turn")
        if name not in ("hash_blocks", "deallocate"):
            errors.append(f"postprocess called {name}")
    return errors


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_workloads_follow_nano_vllms_protocol(data):
    workload: Workload = data.draw(workloads())
    config = data.draw(configs(workload))
    scheduler, spy, _ = plugged_scheduler(config)
    runner = FakeModelRunner(
        config.num_kvcache_blocks,
        config.kvcache_block_size,
        vocab_size=VOCAB,
        eos=config.eos,
        eos_period=workload.eos_period,
    )
    pending = sorted(workload.requests, key=lambda r: r.arrival)
    step = 0
    while pending or not scheduler.is_finished():
        while pending and (pending[0].arrival <= step or scheduler.is_finished()):
            r = pending.pop(0)
            scheduler.add(
                Sequence(
                    r.prompt,
                    SamplingParams(max_tokens=r.max_tokens, ignore_eos=r.ignore_eos),
                    block_size=workload.block_size,
                )
            )
        spy.calls.clear()
        seqs, is_prefill = scheduler.schedule()
        calls = list(spy.calls)
        spy.calls.clear()
        scheduler.postprocess(seqs, runner.run(seqs, is_prefill), is_prefill)
        assert protocol_errors(calls, seqs, is_prefill, spy.calls) == [], f"step {step}"
        step += 1
        assert step < 2000
