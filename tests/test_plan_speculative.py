"""`--speculative-config` plans as vLLM 0.32 plans it.

The expected side is vLLM's own code, recorded in tests/data/vllm_serve_defaults_oracle.json
(`speculative`) by `tools/crosscheck/vllm_serve_defaults.py record speculative`: its engine
config, the target model and the drafter (an EAGLE / EAGLE-3 head or a draft model, built as
its proposer builds it) on the meta device, the specs its model runner reports for both, and
its planner and capacity functions, on its CPU platform.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from refimpl.__main__ import main
from refimpl.models import EngineArgs, plan_model
from refimpl.models.speculative import SpeculativeConfig, resolve_speculative_config
from tools.crosscheck.models_compare import comparable, spec_record

DATA = Path(__file__).parent / "data"
CONFIGS = DATA / "configs"
CASES = json.loads((DATA / "vllm_serve_defaults_oracle.json").read_text())["speculative"]


def engine_args(case: dict) -> EngineArgs:
    spec = {**case["speculative_config"]}
    spec["model"] = str(CONFIGS / spec["model"])
    return EngineArgs(
        str(CONFIGS / case["config"]),
        attention_backend="cpu_attn",
        cpu_isa=case["cpu_isa"],
        max_model_len=case["max_model_len"],
        kv_cache_memory_bytes=case["memory"],
        speculative_config=spec,
    )


def case_id(case: dict) -> str:
    spec = case["speculative_config"]
    return f"{case['config']}-{case['method']}-n{spec['num_speculative_tokens']}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_drafter_layers_and_plan_are_vllms(case):
    """The drafter's cache layers (names, specs, a Mamba state per speculative token) and
    the plan made with them: blocks, groups, tokens and concurrency, or vLLM's refusal."""
    args = engine_args(case)
    config = args.create_engine_config()
    assert config.speculative.method == case["method"]
    assert config.use_eagle == case["use_eagle"]
    assert config.speculative.num_lookahead_tokens == case["num_lookahead_tokens"]
    assert (
        config.speculative.num_prefill_lookahead_tokens == case["num_prefill_lookahead_tokens"]
    )
    ours = {name: spec_record(spec) for name, spec in config.model.specs.items()}
    assert list(ours) == [name for name, _ in case["specs"]]
    for name, want in case["specs"]:
        assert comparable(ours[name]) == comparable(want), name
        if want["type"] == "MambaSpec":
            spec = config.model.specs[name]
            assert spec.num_speculative_blocks == want["num_speculative_blocks"], name
    want = case["plan"]
    if "refused" in want:
        with pytest.raises(ValueError, match="KV cache"):
            plan_model(config)
        return
    plan = plan_model(config)
    assert plan.num_blocks == want["num_blocks"]
    assert plan.num_tokens == want["kv_cache_size_tokens"]
    assert plan.max_concurrency == pytest.approx(want["max_concurrency"], rel=1e-12)
    assert plan.kv.max_in_flight_tokens == want["max_in_flight_tokens"]
    assert [list(g.layer_names) for g in plan.groups] == [g["layers"] for g in want["groups"]]
    assert [g.block_size for g in plan.groups] == [g["block_size"] for g in want["groups"]]


def test_cli_takes_a_draft_model_config_path(capsys):
    case = next(c for c in CASES if c["method"] == "eagle3")
    spec = {**case["speculative_config"], "model": str(CONFIGS / "drafts/tiny-llama-eagle3")}
    argv = ["plan", "--config", str(CONFIGS / case["config"]), "--backend", "cpu_attn"]
    argv += ["--max-model-len", str(case["max_model_len"])]
    argv += ["--kv-cache-memory-bytes", str(case["memory"])]
    argv += ["--speculative-config", json.dumps(spec), "--json"]
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["num_blocks"] == case["plan"]["num_blocks"]
    assert got["num_cache_layers"] == len(case["specs"])


def test_multi_module_mtp_keeps_the_chain_below_each_window():
    """vLLM's `num_prefill_lookahead_tokens`: a chain of MTP modules re-prefills
    num_speculative_tokens tokens, so sliding windows keep n - 1 more; one MTP layer reused
    (or EAGLE) reads one token ahead and keeps none; a draft model reads none."""
    assert SpeculativeConfig("mtp", 3, None, num_mtp_layers=3).extra_retained_tokens == 2
    assert SpeculativeConfig("mtp", 3, None, num_mtp_layers=1).extra_retained_tokens == 0
    assert (
        SpeculativeConfig("mtp", 2, None, num_mtp_layers=4).num_prefill_lookahead_tokens == 2
    )
    assert SpeculativeConfig("eagle", 5).num_prefill_lookahead_tokens == 1
    assert SpeculativeConfig("draft_model", 5).num_prefill_lookahead_tokens == 0


def test_extra_retained_tokens_reach_the_sliding_window_reservation():
    """The retained tokens are planned: a window group reserves cdiv(window - 1 + extra +
    in flight, block) + 1 blocks per request."""
    from refimpl.hybrid.kv_cache_utils import plan_kv_cache
    from refimpl.models import get_kv_cache_spec

    model = get_kv_cache_spec(CONFIGS / "tiny-gemma2", backend="cpu_attn", max_model_len=4096)
    kwargs = dict(
        max_model_len=4096,
        max_num_batched_tokens=128,
        kv_cache_memory_bytes=1 << 30,
        async_scheduling=False,
    )
    plain = plan_kv_cache(model.specs, **kwargs)
    chained = plan_kv_cache(model.specs, num_prefill_lookahead_tokens=200, **kwargs)
    # window 256, 128 tokens in flight, 128-token blocks: cdiv(383, 128) + 1 = 4 blocks;
    # with 199 retained tokens cdiv(582, 128) + 1 = 6
    assert 4 in plain.blocks_per_request and 6 in chained.blocks_per_request
    assert chained.max_concurrency < plain.max_concurrency


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"method": "ngram", "num_speculative_tokens": 2}, "method 'ngram' is not planned"),
        ({"method": "eagle", "num_speculative_tokens": 2}, "needs model"),
        (
            {"method": "eagle", "model": str(CONFIGS / "drafts/tiny-llama-eagle")},
            "no num_specul",
        ),
        ({"method": "mtp", "num_speculative_tokens": 0}, "whole number >= 1"),
        ({"method": "mtp"}, "has no MTP layers"),
        (
            {
                "method": "eagle",
                "model": str(CONFIGS / "tiny-gemma2"),
                "num_speculative_tokens": 1,
            },
            "model_type 'gemma2' is not planned",
        ),
    ],
)
def test_unplanned_speculative_settings_are_refused_by_name(spec, message):
    from refimpl.models import resolve_config

    with pytest.raises(ValueError, match=message):
        resolve_speculative_config(spec, resolve_config(CONFIGS / "tiny-llama"))
