"""Replay vLLM's recorded answers (tests/data/vllm_oracle.json, written by
`make crosscheck-record` from an installed vLLM) through refimpl: no vLLM needed here.

Each stream is a list of scheduler operations on one set of cache groups, played at one
prefix-cache retention setting (None, vLLM's default 0, or twice the scheduler block size);
after every operation the outputs (hit blocks, length and pinned junction, new blocks or None,
reset answers) and the whole pool state (every table, the free queue in order, every ref count,
which blocks are hashed) must equal vLLM's. The planner part compares planner C's groups, block
count, stride and tensors on random DeepSeek-V4-shaped layer mixes, against plans vLLM made
from its own DeepSeek V4 layers and backends.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.crosscheck.allocator import _jsonable  # noqa: E402
from tools.crosscheck.planner import plan_refimpl  # noqa: E402
from tools.crosscheck.refimpl_side import RefimplAllocator  # noqa: E402
from tools.crosscheck.streams import GROUP_SETS, RETENTION_SETTINGS, Harness  # noqa: E402

ORACLE = json.loads((ROOT / "tests" / "data" / "vllm_oracle.json").read_text())


def test_the_recording_covers_every_group_set_retention_and_real_work():
    assert ORACLE["vllm_version"].startswith("0.3")
    for retention in RETENTION_SETTINGS:
        assert {
            s["group_set"] for s in ORACLE["streams"] if s["retention"] == retention
        } == set(GROUP_SETS)
    outputs = [obs[0] for s in ORACLE["streams"] for obs in s["observations"]]
    hits = [o for o in outputs if isinstance(o, list) and o[0] == "hit"]
    assert any(o[2] > 0 for o in hits), "no prefix hit recorded"
    assert any(o[4] > 0 for o in hits), "no shared-prefix junction recorded"
    assert any(o[-1] is None for o in outputs if isinstance(o, list)), (
        "no failed allocation recorded"
    )
    assert ["reset", True] in outputs and ["reset", False] in outputs
    refused = [
        s for s in ORACLE["streams"] if s["observations"][:1] == [["refused", "ValueError"]]
    ]
    assert {(s["group_set"], s["retention"]) for s in refused} == {
        ("full", "2x"),
        ("full-eagle", "2x"),
        # chunked local groups cache densely: vLLM refuses a positive retention without a
        # window
        ("full+chunk8", "2x"),
        ("chunk12+full-cap", "2x"),
        ("chunk-single", "2x"),
    }


def replay(stream) -> None:
    gs = GROUP_SETS[stream["group_set"]]
    # vLLM refused the configuration
    if stream["observations"][:1] == [["refused", "ValueError"]]:
        with pytest.raises(ValueError, match="prefix_cache_retention_interval"):
            RefimplAllocator(gs, stream["retention"])
        return
    harness = Harness(RefimplAllocator(gs, stream["retention"]), gs.max_model_len)
    for i, (op, expected) in enumerate(zip(stream["ops"], stream["observations"])):
        got = _jsonable((harness.play(tuple(op)), harness.observe()))
        assert got == expected, f"operation {i}: {op}"


def diverging(streams) -> int:
    """How many of the recorded streams refimpl (as patched now) replays unlike vLLM."""
    failures = 0
    for stream in streams:
        try:
            replay(stream)
        except AssertionError:
            failures += 1
    return failures


@pytest.mark.parametrize(
    "stream", ORACLE["streams"], ids=lambda s: f"{s['seed']}-{s['group_set']}-{s['retention']}"
)
def test_refimpl_allocator_replays_vllm(stream):
    replay(stream)


@pytest.mark.parametrize("entry", ORACLE["planner"], ids=lambda e: f"config-{e['seed']}")
def test_refimpl_planner_c_replays_vllm(entry):
    assert plan_refimpl(entry["case"]) == entry["plan"]


def test_the_replay_catches_the_old_one_token_window_rule(monkeypatch):
    """Before vLLM parity, a 1-token window hashed every block; the recorded stream exposes
    it."""
    from refimpl.hybrid.single_type_kv_cache_manager import SlidingWindowManager

    monkeypatch.setattr(
        SlidingWindowManager, "reachable_block_mask", classmethod(lambda cls, *a, **k: None)
    )
    (stream,) = [
        s
        for s in ORACLE["streams"]
        if s["group_set"] == "window-1" and s["retention"] == "none"
    ]
    gs = GROUP_SETS["window-1"]
    harness = Harness(RefimplAllocator(gs, "none"), gs.max_model_len)
    replayed = [
        _jsonable((harness.play(tuple(op)), harness.observe())) for op in stream["ops"]
    ]
    assert replayed != stream["observations"]


@pytest.mark.parametrize(
    "mutation", ["dense instead of 0", "no partial tail", "always hybrid"]
)
def test_the_replay_catches_each_vllm_032_rule(monkeypatch, mutation):
    """Each rule this recording pins down, undone, makes some recorded stream diverge."""
    from refimpl.hybrid import kv_cache_coordinator as C
    from refimpl.hybrid import kv_cache_manager as M
    from refimpl.hybrid.single_type_kv_cache_manager import FullAttentionManager

    streams = [s for s in ORACLE["streams"] if s["retention"] == "0"]
    if mutation == "dense instead of 0":  # replay vLLM's answers at 0 with refimpl at None
        streams = [
            {**s, "retention": "none"}
            for s in streams
            if s["observations"][:1] != [["refused", "ValueError"]]
        ]
    elif mutation == "no partial tail":
        monkeypatch.setattr(
            FullAttentionManager,
            "_cache_partial_tail_block",
            lambda self, request, num_tokens: None,
        )
    else:
        monkeypatch.setattr(
            M,
            "get_kv_cache_coordinator",
            lambda groups, n, **kw: (
                C.HybridKVCacheCoordinator(groups, n, **kw)
                if kw.get("enable_caching", True)
                else C.KVCacheCoordinatorNoPrefixCache(groups, n, **kw)
            ),
        )
    assert diverging(streams) > 0


def test_the_issue_cases_as_vllm_answered_them():
    """One eagle group hits 4 tokens (not 8); the flagged 8-token group hashes its tail
    block."""
    eagle, tail = [s for s in ORACLE["streams"] if s["seed"] == -1]
    assert eagle["observations"][-1][0][:3] == ["hit", [[1]], 4]
    # r0's full-attention table is [1, 2]: block 1 full, block 2 holds tokens 8-11 and is
    # hashed as the prompt's partial tail (retention 0 keeps no window block of this short
    # prompt)
    assert tail["observations"][1][1]["tables"] == {"r0": [[1, 2], [3, 4, 5]]}
    assert tail["observations"][1][1]["hashed"] == [[1, 2]]


def _hashed_ids(observation) -> list[int]:
    return [i for lo, hi in observation[1]["hashed"] for i in range(lo, hi + 1)]


def test_issue_30_retention_0_cases_as_vllm_answered_them():
    """Issue 30's two minimal cases (retention 0, a caller that ignores the junction the lookup
    reports): vLLM's hashed blocks after the last operation, then the whole replay."""
    groups, preempted = [s for s in ORACLE["streams"] if s["seed"] == -2]
    assert groups["group_set"] == "swa9+full16"
    assert _hashed_ids(groups["observations"][-1]) == [6, 14, 15, 19, 20]
    assert preempted["group_set"] == "full16+2swa12"
    assert _hashed_ids(preempted["observations"][-1]) == [1, 5, 6, 7, 13, 14, 21, 22, 23]
    # both lookups reported a junction at 16 tokens, which nobody pinned
    assert [o[0][4] for o in (groups["observations"][-1], preempted["observations"][-1])] == [
        16,
        16,
    ]
    replay(groups)
    replay(preempted)


def test_the_replay_catches_a_manager_that_pins_the_junction_itself(monkeypatch):
    """Before the fix, refimpl's get_computed_blocks stored the junction on the request
    itself; both issue cases then keep window blocks vLLM drops (10, 11 and 3, 9, 10, 17, 18,
    19), and so do recorded random streams whose caller does not pin."""
    from refimpl.hybrid.kv_cache_manager import KVCacheManager

    lookup = KVCacheManager.get_computed_blocks

    def pinning_lookup(self, request):
        blocks, hit, junction = lookup(self, request)
        request.shared_prefix_boundary = junction
        return blocks, hit, junction

    monkeypatch.setattr(KVCacheManager, "get_computed_blocks", pinning_lookup)
    caught = []
    for stream in [s for s in ORACLE["streams"] if s["retention"] == "0"]:
        try:
            replay(stream)
        except AssertionError:
            caught.append(stream["seed"])
    # both issue cases, and random streams as well
    assert caught.count(-2) == 2 and any(seed >= 0 for seed in caught)


def _mutant_coordinator_module(old: str, new: str) -> types.ModuleType:
    """A copy of `refimpl.hybrid.kv_cache_coordinator` with `old` replaced by `new`."""
    from refimpl.hybrid import kv_cache_coordinator

    source = Path(kv_cache_coordinator.__file__).read_text()
    assert old in source, old
    module = types.ModuleType("mutant_kv_cache_coordinator")
    exec(compile(source.replace(old, new), "mutant_coordinator.py", "exec"), module.__dict__)
    return module


CHUNKED_GROUP_SETS = ("full+chunk8", "chunk12+full-cap", "chunk-single", "full+swa7+chunk8")


def undo_chunked_local_rule(monkeypatch, rule: str) -> None:
    """Undo one of vLLM 0.32's chunked local attention rules in refimpl (the scheduler
    oracle's test uses it too)."""
    from refimpl.hybrid import kv_cache_manager as M
    from refimpl.hybrid.single_type_kv_cache_manager import (
        ChunkedLocalAttentionManager,
        FullAttentionManager,
    )

    if rule == "no skipped chunks":  # blocks of finished chunks are kept, like full attention
        monkeypatch.setattr(
            ChunkedLocalAttentionManager, "get_num_skipped_tokens", lambda self, n: 0
        )
    elif rule == "hit from block 0":  # a hit needs every block, not just its last chunk's
        monkeypatch.setattr(
            ChunkedLocalAttentionManager,
            "find_longest_cache_hit",
            FullAttentionManager.find_longest_cache_hit,
        )
    elif rule == "no admission cap":  # the full-sequence check asks for every block
        monkeypatch.setattr(
            ChunkedLocalAttentionManager, "max_admission_blocks_per_request", lambda self: None
        )
    elif rule == "full not first":  # the hybrid lookup keeps group order (refimpl's old sort)
        module = _mutant_coordinator_module(
            "key=lambda group: not isinstance(group.kv_cache_spec, FullAttentionSpec)",
            "key=lambda group: isinstance(group.kv_cache_spec, SlidingWindowSpec)",
        )
        monkeypatch.setattr(M, "get_kv_cache_coordinator", module.get_kv_cache_coordinator)
    else:
        raise ValueError(f"unknown rule {rule!r}")


@pytest.mark.parametrize(
    "rule", ["no skipped chunks", "hit from block 0", "no admission cap", "full not first"]
)
def test_the_replay_catches_each_chunked_local_rule(monkeypatch, rule):
    """Each chunked local attention rule, undone, makes a recorded chunked stream diverge."""
    undo_chunked_local_rule(monkeypatch, rule)
    streams = [
        s
        for s in ORACLE["streams"]
        if s["group_set"] in CHUNKED_GROUP_SETS
        and s["observations"][:1] != [["refused", "ValueError"]]
    ]
    assert streams
    assert diverging(streams) > 0, f"{rule}: all {len(streams)} chunked streams still replay"
