"""refimpl's scheduler replays vLLM 0.32's own `Scheduler` on the Mooncake trace slice, step
for step, without vLLM.

`tests/data/vllm_sched_trace_oracle.json` holds, per setting (dense, sliding window and
DeepSeek V4's real caches, the Mamba hybrid tiny-granite-h with prefix caching on and off, and
Llama 4's chunked local caches for tiny-llama4; retention None, 0, k; chunked or not; sync or
async), the sha256
digest of vLLM's step log over the shipped slice's 100 requests, recorded by
`python -m tools.crosscheck.sched_trace --record ...` after checking refimpl equal step for
step. `tools.crosscheck.sched_trace` says how the trace becomes arrivals per step.

A whole replay takes a few seconds: the fast test replays one setting, the slow ones all of
them and the mutants (a rule undone must fail the trace replay).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_sched_vllm_oracle import MUTANTS, mutant
from tools.crosscheck.sched_streams import Setting, digest, drive
from tools.crosscheck.sched_trace import RefimplTraceSide, trace_settings, trace_stream

ORACLE = json.loads(
    (Path(__file__).parent / "data" / "vllm_sched_trace_oracle.json").read_text()
)
SETTINGS = {e["setting"]["name"]: e for e in ORACLE["settings"]}
FAST = "trace-dense-ret0-nochunk-sync"  # the quickest (about 2 s): 5 preemptions


def replay(name: str, scheduler_cls=None) -> str:
    setting = Setting.from_json(SETTINGS[name]["setting"])
    side = RefimplTraceSide(setting, scheduler_cls)
    return digest(drive(side, trace_stream(), setting.async_scheduling, max_steps=10**6))


def test_trace_oracle_covers_every_setting():
    assert set(SETTINGS) == {s.name for s in trace_settings()}
    for s in trace_settings():
        assert Setting.from_json(SETTINGS[s.name]["setting"]) == s, s.name
    for layout in ("dense", "swa", "dsv4", "mamba", "llama4"):
        for mode in ("chunk-sync", "chunk-async", "nochunk-sync", "nochunk-async"):
            assert any(n.startswith(f"trace-{layout}") and n.endswith(mode) for n in SETTINGS)
    # the slice exercises the cache: prefix hits wherever prefix caching is on, preemptions
    # in every layout
    assert all(
        e["totals"]["hit_tokens"] > 0
        for e in SETTINGS.values()
        if e["setting"].get("enable_prefix_caching", True)
    )
    for layout in ("dense", "swa", "dsv4", "mamba", "llama4"):
        assert any(
            e["totals"]["preemptions"] > 0
            for n, e in SETTINGS.items()
            if n.startswith(f"trace-{layout}")
        ), layout


def test_replays_vllm_on_the_trace_one_setting():
    assert replay(FAST) == SETTINGS[FAST]["digest"]


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in SETTINGS if n != FAST])
def test_replays_vllm_on_the_trace(name):
    assert replay(name) == SETTINGS[name]["digest"]


#: (rule undone, setting): the replay must differ from vLLM's digest (the junction pin only
#: matters where retention frees window blocks, so at retention 0 and k)
TRACE_MUTANTS = [
    ("long-prefill-threshold", "trace-dense-ret0-chunk-sync"),
    ("long-prefill-threshold", "trace-dsv4-ret0-chunk-sync"),
    ("junction-pin", "trace-swa-ret0-chunk-sync"),
    ("junction-pin", "trace-dsv4-ret0-chunk-sync"),
    ("long-prefill-threshold", "trace-mamba-ret0-chunk-sync"),
]


@pytest.mark.slow
@pytest.mark.parametrize("rule,name", TRACE_MUTANTS)
def test_trace_replay_fails_with_a_rule_undone(rule, name):
    assert replay(name, mutant(*MUTANTS[rule])) != SETTINGS[name]["digest"]


@pytest.mark.slow
def test_trace_replay_fails_with_preemption_order_undone():
    """Preempting the first running request instead of the last drives the cache into a
    state refimpl's manager refuses (vLLM's order never does)."""
    with pytest.raises(ValueError, match="new_computed_blocks"):
        replay("trace-dense-ret0-chunk-sync", mutant(*MUTANTS["preemption-order"]))


@pytest.mark.slow
def test_trace_replay_fails_with_the_mamba_split_undone():
    """Without vLLM's Mamba chunk split, the trace replays unlike vLLM."""
    from tests.test_sched_vllm_oracle_mamba import SCHEDULER_MUTANTS

    old, new, _ = SCHEDULER_MUTANTS["aligned-split"]
    name = "trace-mamba-ret0-chunk-sync"
    assert replay(name, mutant(old, new)) != SETTINGS[name]["digest"]


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["no skipped chunks", "hit from block 0"])
def test_trace_replay_fails_with_a_chunked_local_rule_undone(monkeypatch, rule):
    """Each chunked local rule undone makes the Llama 4 trace replay unlike vLLM."""
    from test_hybrid_vllm_oracle import undo_chunked_local_rule

    undo_chunked_local_rule(monkeypatch, rule)
    name = "trace-llama4-ret0-chunk-sync"
    try:
        assert replay(name) != SETTINGS[name]["digest"]
    except ValueError:
        pass  # the mutant cannot even drive the cache through the trace
