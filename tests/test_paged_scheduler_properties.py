"""Property tests: random workloads and scheduler configurations.

After every step the driver runs `check_invariants` over every live sequence and the fake
runner reads each sequence's whole history back through its block table. At the end everything
has finished, no block is leaked, and every sequence generated exactly what it generates alone:
batching, chunking, prefix caching and preemption change nothing in the output.
"""

from __future__ import annotations

from hypothesis import event, given
from hypothesis import strategies as st
from nanovllm_oracle import EOS, VOCAB, Workload, configs, workloads

from refimpl.course.runners import FakeModelRunner, SchedulerDriver
from refimpl.paged import SamplingParams, Scheduler, SchedulerConfig, Sequence, SequenceStatus


def run_workload(workload: Workload, config: SchedulerConfig):
    scheduler = Scheduler(config)
    runner = FakeModelRunner.for_scheduler(
        scheduler, vocab_size=VOCAB, eos_period=workload.eos_period
    )
    driver = SchedulerDriver(scheduler, runner)  # check=True: invariants after every step
    seqs = [
        Sequence(
            r.prompt,
            SamplingParams(max_tokens=r.max_tokens, ignore_eos=r.ignore_eos),
            block_size=workload.block_size,
        )
        for r in workload.requests
    ]
    pending = sorted(zip(workload.requests, seqs), key=lambda pair: pair[0].arrival)
    step = 0
    while pending or not scheduler.is_finished():
        while pending and (pending[0][0].arrival <= step or scheduler.is_finished()):
            driver.add(pending.pop(0)[1])
        driver.step()
        step += 1
        assert step < 2000, "the scheduler made no progress"
    return scheduler, runner, driver, seqs


@given(st.data())
def test_random_workloads_finish_without_leaks_and_match_the_reference(data):
    workload = data.draw(workloads())
    config = data.draw(configs(workload))
    scheduler, runner, driver, seqs = run_workload(workload, config)

    bm = scheduler.block_manager
    assert not bm.used_block_ids and len(bm.free_block_ids) == config.num_kvcache_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)
    for s in seqs:
        assert s.status == SequenceStatus.FINISHED and s.block_table == []
        assert s.completion_token_ids == runner.reference_completion(
            s.prompt_token_ids, s.max_tokens, s.ignore_eos
        )
    assert sorted(seq_id for r in driver.steps for seq_id in r.finished_seq_ids) == sorted(
        s.seq_id for s in seqs
    )

    for r in driver.steps:
        assert 1 <= len(r.seq_ids) <= config.max_num_seqs
        assert r.num_blocks_in_use <= config.num_kvcache_blocks
        if r.is_prefill:
            assert r.num_batched_tokens <= config.max_num_batched_tokens
            # only the first sequence may be cut
            assert set(r.chunked_seq_ids) <= {r.seq_ids[0]}
            assert not r.preempted_seq_ids
        else:
            assert (
                set(r.num_scheduled_tokens) == {1}
                and not r.chunked_seq_ids
                and not any(r.prefix_hit_tokens)
            )
        if not config.enable_prefix_caching:
            assert not any(r.prefix_hit_tokens)
    assert runner.num_computed_tokens == sum(r.num_batched_tokens for r in driver.steps)
    event(f"preempted: {scheduler.num_preemptions > 0}")
    event(f"chunked: {any(r.chunked_seq_ids for r in driver.steps)}")
    event(f"prefix hits: {any(any(r.prefix_hit_tokens) for r in driver.steps)}")
    event(
        "eos stop: "
        f"{any(s.completion_token_ids[-1] == EOS and len(s.completion_token_ids) < s.max_tokens for s in seqs)}"
    )
    assert scheduler.num_preemptions == sum(len(r.preempted_seq_ids) for r in driver.steps)


@given(st.data())
def test_outputs_are_equal_across_configurations(data):
    workload = data.draw(workloads())
    first = data.draw(configs(workload))
    second = data.draw(configs(workload))
    outputs = []
    for config in (first, second):
        _, _, _, seqs = run_workload(workload, config)
        outputs.append([s.completion_token_ids for s in seqs])
    assert outputs[0] == outputs[1]


@given(st.data())
def test_prefix_caching_changes_no_output(data):
    workload = data.draw(workloads())
    config = data.draw(configs(workload))
    on = SchedulerConfig(**{**config.__dict__, "enable_prefix_caching": True})
    off = SchedulerConfig(**{**config.__dict__, "enable_prefix_caching": False})
    results = [run_workload(workload, c) for c in (on, off)]
    (_, _, _, seqs_on), (_, _, _, seqs_off) = results
    assert [s.completion_token_ids for s in seqs_on] == [
        s.completion_token_ids for s in seqs_off
    ]
    # Without a cache every prompt token is computed at least once.
    _, runner_off, _, _ = results[1]
    assert runner_off.num_computed_tokens >= sum(len(r.prompt) for r in workload.requests)
