"""Traces (Mooncake's and refimpl's JSONL), the infinite-cache upper bound, the step clocks and
the replay loop of `simulate`."""

from __future__ import annotations

import hashlib
import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl.sched.clock import ArrivalOrderClock, MeasuredStepTime, RooflineStepTime
from refimpl.sched.traces import (
    MOONCAKE_BLOCK_SIZE,
    SLICE_PATH,
    SLICE_SHA256,
    mooncake_token_ids,
    parse_trace,
    prefix_hit_upper_bound,
    read_trace,
)


def _line(t, n, out, ids):
    return json.dumps(
        {"timestamp": t, "input_length": n, "output_length": out, "hash_ids": ids}
    )


# --- reading


def test_slice_ships_with_its_checksum_and_licence():
    data = SLICE_PATH.read_bytes()
    assert hashlib.sha256(data).hexdigest() == SLICE_SHA256
    assert SLICE_SHA256 in (SLICE_PATH.parent / "README.md").read_text()
    assert "Apache License" in (SLICE_PATH.parent / "LICENSE-APACHE").read_text()
    trace = read_trace(SLICE_PATH)
    assert len(trace) == 100
    assert [r.arrival_ms for r in trace] == sorted(r.arrival_ms for r in trace)
    assert all(len(r.hash_ids) == -(-r.input_length // MOONCAKE_BLOCK_SIZE) for r in trace)


def test_a_changed_slice_is_refused(tmp_path, monkeypatch):
    import refimpl.sched.traces as traces

    copy = tmp_path / "slice.jsonl"
    copy.write_bytes(
        SLICE_PATH.read_bytes().replace(b'"output_length": ', b'"output_length": 1', 1)
    )
    monkeypatch.setattr(traces, "SLICE_PATH", copy)
    with pytest.raises(ValueError, match="sha256"):
        traces.read_trace(copy)


def test_mooncake_tokens_are_512_per_block_and_the_last_block_is_partial():
    ids = mooncake_token_ids([7, 3], 600)
    assert len(ids) == 600
    filler = [j % 256 for j in range(1, 512)]
    assert ids[:512] == [256 + 7, *filler]
    assert ids[512:] == [256 + 3, *filler[:87]]
    # one id per block above 256 (CPython's shared small ints hold the rest)
    assert [i for i, t in enumerate(ids) if t > 256] == [0, 512]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True), min_size=2),
    st.data(),
)
def test_mooncake_prompts_share_a_prefix_exactly_as_far_as_their_block_ids_agree(
    prompts, data
):
    """The made-up tokens keep Mooncake's meaning: the longest common token prefix of two
    prompts is where their block ids (and, in a shared last block, their lengths) part."""
    lengths = [
        512 * (len(p) - 1) + data.draw(st.integers(1, 512), label="last block")
        for p in prompts
    ]
    cases = [(p, n, mooncake_token_ids(p, n)) for p, n in zip(prompts, lengths)]
    for (a, n, ta), (b, m, tb) in itertools.pairwise(cases):
        same_ids = 0
        while same_ids < min(len(a), len(b)) and a[same_ids] == b[same_ids]:
            same_ids += 1
        expected = min(512 * same_ids, n, m)
        common = 0
        while common < min(n, m) and ta[common] == tb[common]:
            common += 1
        assert common == expected


def test_jsonl_prompts_as_ids_or_named_segments():
    trace = parse_trace(
        [
            json.dumps(
                {"timestamp": 0, "segments": [["sys", 5], ["u1", 2]], "output_length": 3}
            ),
            json.dumps(
                {"timestamp": 2.5, "segments": [["sys", 5], ["u2", 4]], "output_length": 1}
            ),
            json.dumps({"timestamp": 3, "prompt_token_ids": [9, 8, 7], "output_length": 2}),
        ]
    )
    a, b, c = (r.prompt_token_ids for r in trace)
    assert a[:5] == b[:5] and a[5] != b[5] and len(a) == 7 and len(b) == 9
    assert c == [9, 8, 7]
    assert [r.arrival_ms for r in trace] == [0.0, 2.5, 3.0]
    assert prefix_hit_upper_bound(trace) == [0, 5, 0]


BAD = [
    (["", "  "], "empty"),
    ([_line(0, -3, 4, [1])], "line 1: input_length must be at least 1"),
    ([_line(0, 10, -1, [1])], "line 1: output_length must be at least 1"),
    ([_line(5, 10, 1, [1]), _line(4, 10, 1, [2])], "line 2: timestamp 4 is before"),
    ([_line(0, 10, 1, [1]), _line(1, 600, 1, [4, 4])], "line 2: hash id 4 repeats"),
    ([_line(0, 600, 1, [1])], "line 1: 1 hash_ids for input_length 600"),
    ([_line(0, 10, 1, [-1])], "line 1: hash_ids must be a list of integers from 0"),
    ([_line(0, 10, 1, [2**63 - 256])], "line 1: hash_ids must be a list of integers from 0"),
    (["{not json"], "line 1: not JSON"),
    ([_line(0, 10, 1, [1]), json.dumps({"timestamp": 1, "output_length": 1})], "line 2"),
    (
        [
            json.dumps({"timestamp": 0, "segments": [["s", 4]], "output_length": 1}),
            json.dumps({"timestamp": 1, "segments": [["s", 5]], "output_length": 1}),
        ],
        "line 2: segment 's' has length 5 here and 4",
    ),
]


@pytest.mark.parametrize(("lines", "words"), BAD)
def test_bad_traces_get_one_line_naming_the_line(tmp_path, lines, words):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as info:
        read_trace(path)
    message = str(info.value)
    assert words in message and "\n" not in message


def test_a_bad_trace_prints_nothing_to_stdout(tmp_path, capsys):
    from refimpl.__main__ import main

    path = tmp_path / "t.jsonl"
    path.write_text(_line(0, 10, 1, [1]) + "\n" + _line(1, 600, 1, [4, 4]) + "\n")
    code = main(
        ["simulate", "--config", "tests/data/configs/tiny-llama", "--trace", str(path)]
    )
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert "line 2: hash id 4 repeats" in err and err.count("\n") == 1


# --- the upper bound, counted independently


def _longest_earlier_prefix(prompts: list[np.ndarray]) -> list[int]:
    """Brute force over tokens: the longest common prefix with any earlier prompt."""
    out = []
    for i, p in enumerate(prompts):
        best = 0
        for q in prompts[:i]:
            m = min(len(p), len(q))
            diff = np.flatnonzero(p[:m] != q[:m])
            best = max(best, int(diff[0]) if len(diff) else m)
        out.append(min(best, len(p) - 1))
    return out


def test_upper_bound_from_hash_ids_equals_a_token_by_token_count():
    trace = read_trace(SLICE_PATH)[:60]
    prompts = [np.asarray(r.prompt_token_ids) for r in trace]
    bound = prefix_hit_upper_bound(trace)
    assert bound == _longest_earlier_prefix(prompts)
    assert sum(bound) > 0


def test_upper_bound_counts_partial_blocks_and_the_last_token():
    lines = [
        _line(0, 600, 1, [1, 2]),  # block 2 holds 88 tokens
        _line(1, 700, 1, [1, 2]),  # block 2 holds 188: only 88 were seen
        _line(2, 512, 1, [1]),  # all seen: the last token still runs
        _line(3, 1024, 1, [5, 1]),  # block 1 is seen, but not at the start
    ]
    assert prefix_hit_upper_bound(parse_trace(lines)) == [0, 600, 511, 0]


# --- clocks


def test_measured_step_times_interpolate_between_points():
    clock = MeasuredStepTime(((100, 0.02), (1000, 0.05)))
    assert clock.step_seconds([(50, 60)]) == 0.02
    assert clock.step_seconds([(300, 300), (250, 260)]) == pytest.approx(0.035)
    assert clock.step_seconds([(5000, 5000)]) == 0.05
    with pytest.raises(ValueError, match="one time per token count"):
        MeasuredStepTime(((1, 0.1), (1, 0.2)))


def test_roofline_is_memory_bound_for_decode_and_compute_bound_for_prefill():
    from refimpl.models import EngineArgs, plan_model
    from refimpl.simulate import roofline_step_time

    plan = plan_model(
        EngineArgs("benchmarks/configs/llama-3.1-70b-instruct", tensor_parallel_size=4)
    )
    clock = roofline_step_time(plan, "h100")
    # one decode token at 1,000 tokens of context: the weights' read dominates
    decode = clock.step_seconds([(1, 1000)])
    weights = plan.config.budget.weights_bytes
    assert decode == pytest.approx((weights + clock.kv_bytes_per_token * 1000) / 3.35e12)
    assert 0.008 < decode < 0.015  # ~35 GB per GPU at 3.35 TB/s
    # 80 layers x 2 KV heads per GPU x 128 x (K, V) x 2 bytes
    assert clock.kv_bytes_per_token == 80 * 2 * 128 * 2 * 2
    prefill = clock.step_seconds([(8192, 8192)])
    assert prefill > clock.weight_bytes / clock.memory_bandwidth
    assert prefill == pytest.approx(
        (8192 * clock.flops_per_token + clock.attention_flops_per_token_context * 8192**2)
        / 989e12
    )
    with pytest.raises(ValueError, match="peak_flops"):
        RooflineStepTime(1, 1, 1, 1, 0, 1)


# --- replay


def _tiny_plan(**kw):
    from refimpl.models import EngineArgs, plan_model

    return plan_model(EngineArgs("tests/data/configs/tiny-llama", **kw))


def test_arrival_order_clock_opens_one_step_per_arrival_time():
    from refimpl.simulate import simulate

    lines = [_line(0, 40, 3, [1]), _line(0, 40, 2, [2]), _line(7, 40, 2, [3])]
    trace = parse_trace(lines)
    plan = _tiny_plan(kv_cache_memory_bytes=1 << 24, block_size=16)
    sim = simulate(plan, trace, clock=ArrivalOrderClock())
    assert [r.arrival_step for r in sim.result.requests] == [0, 0, 1]
    assert all(r.finish_step >= 0 for r in sim.result.requests)


def test_simulated_hits_stay_under_the_upper_bound_and_reach_it_with_room():
    from refimpl.models import EngineArgs, plan_model
    from refimpl.simulate import simulate

    trace = [r for r in read_trace(SLICE_PATH) if r.input_length < 4000][:30]
    plan = plan_model(
        EngineArgs(
            "tests/data/configs/llama-3.1-8b",
            kv_cache_memory_bytes=2 << 30,
            max_model_len=8192,
        )
    )
    sim = simulate(plan, trace, clock="arrivals")
    bound = sim.upper_bound
    hits = [r.hit_tokens for r in sim.result.requests]
    assert all(h <= b for h, b in zip(hits, bound, strict=True))
    # with room for everything, a request misses at most the block its bound ends in
    assert all(b - h < 16 for h, b in zip(hits, bound, strict=True))
    assert sum(hits) > 0


def test_recomputed_tokens_are_the_computed_tokens_a_resume_did_not_find_cached():
    from refimpl.models import EngineArgs, plan_model
    from refimpl.simulate import simulate

    lines = [
        json.dumps({"timestamp": 0, "segments": [[f"u{i}", 1500]], "output_length": 800})
        for i in range(6)
    ]
    plan = plan_model(
        EngineArgs(
            "tests/data/configs/llama-3.1-8b",
            num_gpu_blocks_override=400,
            kv_cache_memory_bytes=1 << 30,
            max_model_len=4096,
        )
    )
    sim = simulate(plan, parse_trace(lines), clock="arrivals")
    preempted = [r for r in sim.result.requests if r.num_preemptions]
    assert preempted and all(r.recomputed_tokens > 0 for r in preempted)
    # one was preempted during its prefill and resumed with nothing cached: it computes again
    # everything it had computed (its whole prompt and a first output token)
    assert max(r.recomputed_tokens for r in preempted) >= 1500
    assert all(r.recomputed_tokens == 0 for r in sim.result.requests if not r.num_preemptions)
