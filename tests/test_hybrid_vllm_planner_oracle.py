"""Replay vLLM 0.32's recorded general-planner answers (tests/data/vllm_planner_oracle.json,
written from an installed vLLM by `tools.crosscheck.general_vllm.record_general`) through
refimpl: no vLLM needed here.

Each case is a layer mix (full attention, sliding window, chunked local, MLA, Mamba states),
a layout, a budget, a max length and a batch size, and in some cases layers that read another
layer's cache (cross-layer KV sharing); vLLM built its own spec classes from it, aligned a
Mamba hybrid's block size with its platform step, planned with `get_kv_cache_configs`,
reported `get_kv_cache_capacity` and added the sharing layers to their targets' groups with
its model runner's `add_kv_sharing_layers_to_kv_cache_groups`. refimpl must give every group,
page, block size, block count, tensor, token and concurrency figure and every group's layer
list, or the same refusal with the same figures (vLLM's message: max length, GiB needed and
available, the longest length that fits; or which fixed message). Then each rule is undone in
turn, and the replay must notice.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.crosscheck import general_planner  # noqa: E402
from tools.crosscheck.general_planner import plan_refimpl  # noqa: E402

ORACLE = json.loads((ROOT / "tests" / "data" / "vllm_planner_oracle.json").read_text())
CASES = [(e["name"], e["case"], e["plan"]) for e in ORACLE["named"]] + [
    (f"seed-{e['seed']}", e["case"], e["plan"]) for e in ORACLE["fuzzed"]
]
NAMED = {e["name"]: e["plan"] for e in ORACLE["named"]}


def test_the_recording_covers_every_kind_layout_and_outcome():
    assert ORACLE["vllm_version"].startswith("0.32")
    kinds = {x["kind"] for _, case, _ in CASES for x in case["layers"]}
    assert kinds == {"full", "sliding", "chunked", "mla", "mamba"}
    assert {case["layout"] for _, case, _ in CASES} == set(general_planner.LAYOUTS)
    plans = [plan for _, _, plan in CASES]
    assert any(p.get("error") == "not enough memory" for p in plans)
    assert any("refused" in p.get("error", "") for p in plans)
    ok = [p for p in plans if "groups" in p]
    assert len([p for p in (e["plan"] for e in ORACLE["fuzzed"]) if "groups" in p]) >= 300
    refusals = {p["error"] for p in plans if "error" in p}
    assert {
        "refused: one group, several window sizes",
        "refused: local layers cannot be promoted to one type",
    } <= refusals
    assert not [r for r in refusals if ":" in r.removeprefix("refused:")]  # all by name
    memory = [p for p in plans if p.get("error") == "not enough memory"]
    assert any(p["estimated_max_len"] > 0 for p in memory)
    shared = [(case, p) for _, case, p in CASES if case.get("kv_sharing") and "groups" in p]
    assert len(shared) >= 40
    # a sharing layer costs nothing and is listed with its target's group
    for case, p in shared:
        assert sum(len(g[0]) for g in p["groups"]) + len(case["kv_sharing"]) == sum(
            len(names) for names in p["layer_names"]
        )
    assert any(len({g[2] for g in p["groups"]}) > 1 for p in ok)  # several block sizes
    assert any(g[1].startswith("UniformType") for p in ok for g in p["groups"])
    group_kinds = " ".join(g[1] for p in ok for g in p["groups"])
    for kind in ("Full", "SlidingWindow", "ChunkedLocal", "MLA", "Mamba"):
        assert f"{kind}AttentionSpec" in group_kinds or f"{kind}Spec" in group_kinds


@pytest.mark.parametrize("label, case, plan", CASES, ids=[c[0] for c in CASES])
def test_refimpl_plans_as_vllm(label, case, plan):
    assert plan_refimpl(case) == plan


def test_the_issue_examples_as_vllm_planned_them():
    ten_fourteen = NAMED["10 full + 14 sliding"]
    assert [len(g[0]) for g in ten_fourteen["groups"]] == [10, 14]
    assert ten_fourteen["num_blocks"] == 11_702
    heads = NAMED["8 full + 4 sliding KV heads"]
    assert [g[2] for g in heads["groups"]] == [16, 32]
    assert [g[2] for g in NAMED["8 full + 4 sliding KV heads, BLHNC"]["groups"]] == [16, 16]
    mamba = NAMED["mamba2 hybrid, 400-token blocks"]
    assert {g[2] for g in mamba["groups"] if g[1] == "FullAttentionSpec"} == {400}


def _first_failure() -> tuple | None:
    for label, case, plan in CASES:
        if plan_refimpl(case) != plan:
            return label, case, plan
    return None


@pytest.mark.parametrize("rule", general_planner.RULES)
def test_undoing_each_rule_breaks_the_replay(rule):
    with general_planner.undo_rule(rule):
        failure = _first_failure()
    assert failure is not None, f"undoing the {rule} changes no recorded case"
    _, case, plan = failure
    assert plan_refimpl(case) == plan  # and the rule is back afterwards
