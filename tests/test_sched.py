"""refimpl.sched: vLLM v1's scheduler rules that a reader can check by hand (the step-for-step
proof against vLLM is tests/test_sched_vllm_oracle.py)."""

from __future__ import annotations

import pytest

from refimpl.hybrid import FullAttentionSpec
from refimpl.hybrid.kv_cache_planning import get_kv_cache_config, get_kv_cache_groups
from refimpl.sched import (
    AsyncScheduler,
    ModelRunnerOutput,
    Scheduler,
    SchedulerConfig,
    make_scheduler,
)


def kv_config(num_blocks: int, block_size: int = 4):
    specs = {
        "l0": FullAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=8, dtype="float16"
        )
    }
    return get_kv_cache_config(get_kv_cache_groups(specs), 1 << 30, num_blocks)


def sched(num_blocks=64, **kw) -> Scheduler:
    cfg = dict(max_num_batched_tokens=32, max_num_seqs=4, max_model_len=64)
    cfg.update(kw)
    return make_scheduler(SchedulerConfig(**cfg), kv_config(num_blocks))


def run_output(out, sampled: dict[str, list[int]]) -> ModelRunnerOutput:
    ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(
        ids, {r: i for i, r in enumerate(ids)}, [sampled.get(r, []) for r in ids]
    )


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="policy"):
        SchedulerConfig(
            max_num_batched_tokens=8, max_num_seqs=2, max_model_len=8, policy="lifo"
        )
    with pytest.raises(ValueError, match="chunked prefill"):
        SchedulerConfig(
            max_num_batched_tokens=8,
            max_num_seqs=2,
            max_model_len=16,
            enable_chunked_prefill=False,
        )
    with pytest.raises(ValueError, match="max_num_seqs"):
        SchedulerConfig(max_num_batched_tokens=2, max_num_seqs=4, max_model_len=16)


def test_bad_requests_are_refused_before_any_state_changes():
    s = sched()
    s.add_request(s.make_request("a", [1, 2, 3]))
    with pytest.raises(ValueError, match="already scheduled"):
        s.add_request(s.make_request("a", [4]))
    with pytest.raises(ValueError, match="max_model_len"):
        s.add_request(s.make_request("b", list(range(1, 65))))
    with pytest.raises(ValueError, match="empty prompt"):
        s.make_request("c", [])
    assert [r.request_id for r in s.waiting] == ["a"] and list(s.requests) == ["a"]


def test_chunked_prefill_then_decode_and_finished_ids_flush_next_step():
    s = sched()
    s.add_request(s.make_request("a", list(range(1, 41)), max_tokens=1))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 32}  # the budget
    s.update_from_output(out, run_output(out, {}))  # a prefill chunk samples nothing
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 8}
    assert out.scheduled_cached_reqs.num_computed_tokens == [32]
    s.update_from_output(out, run_output(out, {"a": [7]}))  # max_tokens=1: finished
    assert not s.running and "a" not in s.requests
    out = s.schedule()  # the V1 runner hears of it on the next step
    assert out.finished_req_ids == {"a"} and out.total_num_scheduled_tokens == 0
    assert s.schedule().finished_req_ids == set()


def test_long_prefill_threshold_caps_only_when_someone_could_starve():
    s = sched(long_prefill_token_threshold=8)
    s.add_request(s.make_request("a", list(range(1, 30))))
    assert s.schedule().num_scheduled_tokens == {"a": 29}
    s = sched(long_prefill_token_threshold=8)
    s.add_request(s.make_request("a", list(range(1, 30))))
    s.add_request(s.make_request("b", list(range(1, 30))))
    assert s.schedule().num_scheduled_tokens == {"a": 8, "b": 8}


def test_prefix_hit_is_the_new_request_computed_tokens():
    s = sched()
    s.add_request(s.make_request("a", list(range(1, 18)), max_tokens=1))
    out = s.schedule()
    s.update_from_output(out, run_output(out, {"a": [5]}))
    s.add_request(s.make_request("b", list(range(1, 14))))
    out = s.schedule()
    (new,) = out.scheduled_new_reqs
    assert new.num_computed_tokens == 12  # three full 4-token blocks; never the last token
    assert out.num_scheduled_tokens == {"b": 1}


def test_fcfs_preempts_the_last_running_request_and_resumes_it_first():
    s = sched(num_blocks=5, max_num_batched_tokens=16)  # 4 usable blocks of 4 tokens
    s.add_request(s.make_request("a", [1] * 7, max_tokens=10))
    s.add_request(s.make_request("b", [2] * 7, max_tokens=10))
    out = s.schedule()
    assert set(out.num_scheduled_tokens) == {"a", "b"}
    s.update_from_output(out, run_output(out, {"a": [3], "b": [3]}))
    out = s.schedule()  # both decode into their 2nd block: full
    s.update_from_output(out, run_output(out, {r: [3] for r in out.num_scheduled_tokens}))
    for _ in range(8):
        out = s.schedule()
        if out.preempted_req_ids:
            break
        s.update_from_output(out, run_output(out, {r: [3] for r in out.num_scheduled_tokens}))
    assert out.preempted_req_ids == {"b"}
    assert [r.request_id for r in s.waiting] == ["b"] and s.requests[
        "b"
    ].num_computed_tokens == 0


def test_priority_queue_orders_by_priority_then_arrival():
    s = sched(policy="priority", max_num_seqs=1)
    s.add_request(s.make_request("late-urgent", [1], priority=0, arrival_time=2.0))
    s.add_request(s.make_request("early", [1], priority=1, arrival_time=0.0))
    s.add_request(s.make_request("early-urgent", [1], priority=0, arrival_time=1.0))
    assert [r.request_id for r in s.waiting] == ["early-urgent", "late-urgent", "early"]


def test_async_schedules_the_next_decode_before_the_output_is_back():
    s = sched(async_scheduling=True)
    assert isinstance(s, AsyncScheduler)
    s.add_request(s.make_request("a", [1, 2, 3], max_tokens=5))
    first = s.schedule()
    second = s.schedule()  # step 1 runs; its token is a placeholder
    assert second.num_scheduled_tokens == {"a": 1}
    assert s.requests["a"].num_output_placeholders == 2
    s.update_from_output(first, run_output(first, {"a": [9]}))
    assert s.requests["a"].num_output_placeholders == 1
    assert s.requests["a"].output_token_ids == [9]
