"""The Scheduler in lockstep with a literal model of nano-vllm's scheduler, step by step.

`OracleScheduler` restates the upstream loop as plainly as possible (deque queues, nano-vllm's
literal `len % block_size == 1` boundary test, a deque free queue through `OracleBlockManager`)
and never looks at a `Scheduler`. Both get the same requests at the same steps and the same
sampled tokens; after every schedule() and every postprocess() the batch, each sequence's chunk
size, the queue orders, every sequence's tokens, cached count, status, is_prefill and block
table, the free-queue order, the prefix-cache map and every block's ref count and hash must be
equal. A different order anywhere (which sequence is preempted, which block comes from the
head, which cache entry survives) fails at the step that made it.

Block size 1 is left out: upstream's `len % 1 == 1` is never true, so upstream cannot run it.
"""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import event, given
from hypothesis import strategies as st
from nanovllm_oracle import (
    VOCAB,
    OracleScheduler,
    OracleSeq,
    Request,
    Workload,
    configs,
    workloads,
)

from refimpl.course.runners import FakeModelRunner
from refimpl.paged import SamplingParams, Scheduler, SchedulerConfig, Sequence


def assert_same_state(
    sched: Scheduler,
    ref: OracleScheduler,
    seqs: dict[int, Sequence],
    ref_seqs: dict[int, OracleSeq],
    where: str,
) -> None:
    bm, rbm = sched.block_manager, ref.bm
    assert [s.seq_id for s in sched.waiting] == [s.seq_id for s in ref.waiting], where
    assert [s.seq_id for s in sched.running] == [s.seq_id for s in ref.running], where
    assert list(bm.free_block_ids) == list(rbm.free), where
    assert bm.used_block_ids == rbm.used, where
    assert bm.hash_to_block_id == rbm.cache, where
    assert [b.ref_count for b in bm.blocks] == rbm.ref_count, where
    assert [b.hash for b in bm.blocks] == rbm.hash, where
    for seq_id, r in ref_seqs.items():
        seq = seqs[seq_id]
        assert seq.block_table == rbm.tables.get(seq_id, []), where
        assert (seq.token_ids, seq.num_cached_tokens) == (r.token_ids, r.num_cached_tokens), (
            where
        )
        assert (seq.status.name, seq.is_prefill) == (r.status, r.is_prefill), where


def run_lockstep(
    workload: Workload, config: SchedulerConfig
) -> tuple[Scheduler, Counter[str]]:
    """Run both schedulers to the end; returns ours and counts of what happened on the way."""
    sched, ref = Scheduler(config), OracleScheduler(config)
    seen: Counter[str] = Counter()
    runner = FakeModelRunner.for_scheduler(
        sched, vocab_size=VOCAB, eos_period=workload.eos_period
    )
    seqs: dict[int, Sequence] = {}
    ref_seqs: dict[int, OracleSeq] = {}
    pending = sorted(workload.requests, key=lambda r: r.arrival)
    step = 0
    while pending or not sched.is_finished():
        while pending and (pending[0].arrival <= step or sched.is_finished()):
            r = pending.pop(0)
            seq = Sequence(
                r.prompt,
                SamplingParams(max_tokens=r.max_tokens, ignore_eos=r.ignore_eos),
                block_size=workload.block_size,
            )
            sched.add(seq)
            ref_seqs[seq.seq_id] = OracleSeq(
                seq.seq_id, list(r.prompt), r.max_tokens, r.ignore_eos
            )
            ref.waiting.append(ref_seqs[seq.seq_id])
            seqs[seq.seq_id] = seq
        fresh = {seq.seq_id for seq in sched.waiting if not seq.block_table}
        batch, is_prefill = sched.schedule()
        seen["steps"] += 1
        seen["preempted"] += len(sched.preempted_last_step)
        seen["chunked"] += is_prefill and batch[0].num_cached_tokens + batch[
            0
        ].num_scheduled_tokens < len(batch[0])
        seen["hit tokens"] += sum(
            s.num_cached_tokens for s in batch if is_prefill and s.seq_id in fresh
        )
        ref_batch, ref_is_prefill = ref.schedule()
        where = f"step {step}"
        assert (is_prefill, [s.seq_id for s in batch]) == (
            ref_is_prefill,
            [r.seq_id for r in ref_batch],
        ), where
        assert [s.num_scheduled_tokens for s in batch] == [
            r.num_scheduled_tokens for r in ref_batch
        ], where
        assert_same_state(sched, ref, seqs, ref_seqs, where + " after schedule")
        token_ids = runner.run(batch, is_prefill)
        sched.postprocess(batch, token_ids, is_prefill)
        ref.postprocess(ref_batch, token_ids, is_prefill)
        assert_same_state(sched, ref, seqs, ref_seqs, where + " after postprocess")
        step += 1
        assert step < 2000, "the scheduler made no progress"
    return sched, seen


@given(st.data())
def test_scheduler_matches_the_literal_upstream_loop_step_by_step(data):
    workload = data.draw(workloads(block_sizes=[2, 3, 4, 8]))
    config = data.draw(configs(workload))
    sched, seen = run_lockstep(workload, config)
    assert not sched.block_manager.used_block_ids
    for what in ("preempted", "chunked", "hit tokens"):
        event(f"{what}: {seen[what] > 0}")


def test_long_seeded_workloads_match_the_literal_upstream_loop():
    """Longer runs than hypothesis builds: many requests on shared prefixes, a tight pool, a
    small budget."""
    total: Counter[str] = Counter()
    for seed in range(3):
        rng = random.Random(seed)
        block_size = [2, 4, 3][seed]
        prefixes = [[rng.randrange(6) for _ in range(rng.randrange(4, 13))] for _ in range(3)]
        requests = tuple(
            Request(
                prompt=tuple(
                    rng.choice(prefixes)
                    + [rng.randrange(6) for _ in range(rng.randrange(0, 6))]
                ),
                max_tokens=rng.randint(1, 12),
                ignore_eos=rng.random() < 0.5,
                arrival=rng.randrange(40),
            )
            for _ in range(30)
        )
        workload = Workload(block_size, requests, eos_period=[None, 5, 3][seed])
        need = max(workload.blocks_needed(r) for r in requests)
        config = SchedulerConfig(
            num_kvcache_blocks=need + 4,
            kvcache_block_size=block_size,
            max_num_seqs=4,
            max_num_batched_tokens=12,
            eos=VOCAB if workload.eos_period else -1,
        )
        sched, seen = run_lockstep(workload, config)
        assert not sched.block_manager.used_block_ids
        total += seen
    for what in ("preempted", "chunked", "hit tokens"):
        assert total[what] > 0, f"the workloads never reached: {what} ({dict(total)})"
