"""Replay vLLM's recorded answers (tests/data/vllm_oracle.json, written by
`make crosscheck-record` from an installed vLLM) through refimpl: no vLLM needed here.

Each stream is a list of scheduler operations on one set of cache groups; after every operation
the outputs (hit blocks and length, new blocks or None) and the whole pool state (every table,
the free queue in order, every ref count, which blocks are hashed) must equal vLLM's. The planner
part compares planner C's groups, block count, stride and tensors on random DeepSeek-V4-shaped
layer mixes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.crosscheck.planner import plan_refimpl  # noqa: E402
from tools.crosscheck.refimpl_side import RefimplAllocator  # noqa: E402
from tools.crosscheck.streams import GROUP_SETS, Harness  # noqa: E402
from tools.crosscheck.allocator import _jsonable  # noqa: E402

ORACLE = json.loads((ROOT / "tests" / "data" / "vllm_oracle.json").read_text())


def test_the_recording_covers_every_group_set_and_real_work():
    assert ORACLE["vllm_version"].startswith("0.3")
    assert {s["group_set"] for s in ORACLE["streams"]} == set(GROUP_SETS)
    outputs = [obs[0] for s in ORACLE["streams"] for obs in s["observations"]]
    hits = [o for o in outputs if isinstance(o, list) and o[0] == "hit"]
    assert any(o[2] > 0 for o in hits), "no prefix hit recorded"
    assert any(o[-1] is None for o in outputs if isinstance(o, list)), "no failed allocation recorded"


@pytest.mark.parametrize("stream", ORACLE["streams"], ids=lambda s: f"{s['seed']}-{s['group_set']}")
def test_refimpl_allocator_replays_vllm(stream):
    gs = GROUP_SETS[stream["group_set"]]
    harness = Harness(RefimplAllocator(gs), gs.max_model_len)
    for i, (op, expected) in enumerate(zip(stream["ops"], stream["observations"])):
        got = _jsonable((harness.play(tuple(op)), harness.observe()))
        assert got == expected, f"operation {i}: {op}"


@pytest.mark.parametrize("entry", ORACLE["planner"], ids=lambda e: f"config-{e['seed']}")
def test_refimpl_planner_c_replays_vllm(entry):
    assert plan_refimpl(entry["case"]) == entry["plan"]


def test_the_replay_catches_the_old_one_token_window_rule(monkeypatch):
    """Before vLLM parity, a 1-token window hashed every block; the recorded stream exposes it."""
    from refimpl.hybrid.single_type_kv_cache_manager import SlidingWindowManager

    monkeypatch.setattr(SlidingWindowManager, "reachable_block_mask", lambda self, num_full_blocks: None)
    (stream,) = [s for s in ORACLE["streams"] if s["group_set"] == "window-1"]
    gs = GROUP_SETS["window-1"]
    harness = Harness(RefimplAllocator(gs), gs.max_model_len)
    replayed = [_jsonable((harness.play(tuple(op)), harness.observe())) for op in stream["ops"]]
    assert replayed != stream["observations"]
