"""`--decode-context-parallel-size` plans as vLLM 0.32 plans it.

The expected side is vLLM's own code, recorded in tests/data/vllm_serve_defaults_oracle.json
by `tools/crosscheck/vllm_serve_defaults.py record dcp_config dcp_plan`: which TP / DCP sizes
its config checks accept, and its planner and capacity functions on its own specs under an
engine config with DCP (`dcp_plan`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from refimpl.hybrid.kv_cache_interface import AttentionSpec
from refimpl.hybrid.kv_cache_utils import plan_kv_cache
from refimpl.models import EngineArgs, get_kv_cache_spec, plan_model
from refimpl.models.context_parallel import shard_over_decode_context
from tools.crosscheck.models_compare import comparable, spec_record

DATA = Path(__file__).parent / "data"
CONFIGS = DATA / "configs"
ORACLE = json.loads((DATA / "vllm_serve_defaults_oracle.json").read_text())


def case_id(case: dict) -> str:
    return f"{case['config']}-tp{case['tensor_parallel_size']}-dcp{case['dcp']}"


#: vLLM's reason (a phrase of its message) -> refimpl's one-line reason for the same rule
REASONS = {
    "must be divisible by dcp_size": "must be divisible by --decode-context-parallel-size",
    "to be greater than the model's total number of KV heads": "greater than the model's",
    "exceeds the maximum supported value": "exceeds the most",
    "query heads per KV head": "query heads per KV head",
}


@pytest.mark.parametrize("case", ORACLE["dcp_config"], ids=case_id)
def test_dcp_sizes_are_accepted_or_refused_as_vllm_does(case):
    """The same settings pass, and each refusal gives the rule vLLM refuses them by."""
    args = EngineArgs(
        str(CONFIGS / case["config"]),
        tensor_parallel_size=case["tensor_parallel_size"],
        decode_context_parallel_size=case["dcp"],
        max_model_len=2048,
        kv_cache_memory_bytes=1 << 30,
    )
    if "refused" in case:
        (reason,) = [ours for theirs, ours in REASONS.items() if theirs in case["refused"]]
        with pytest.raises(ValueError, match=reason):
            args.create_engine_config()
    else:
        assert args.create_engine_config().model.specs


@pytest.mark.parametrize("case", ORACLE["dcp_plan"], ids=case_id)
def test_dcp_plan_is_vllms(case):
    """Each rank keeps its spec and one token in dcp: blocks, tokens (dcp times as many),
    concurrency and block-table rows equal vLLM's, or both refuse."""
    model = get_kv_cache_spec(
        CONFIGS / case["config"],
        backend="cpu_attn",
        cpu_isa="avx512_bf16",
        tensor_parallel_size=case["tensor_parallel_size"],
        max_model_len=case["max_model_len"],
    )
    ours = {name: spec_record(spec) for name, spec in model.specs.items()}
    assert list(ours) == [name for name, _ in case["specs"]]
    for name, want in case["specs"]:
        assert comparable(ours[name]) == comparable(want), name
    specs = {
        name: replace(spec, dcp_world_size=case["dcp"])
        if isinstance(spec, AttentionSpec)
        else spec
        for name, spec in model.specs.items()
    }

    def plan():
        return plan_kv_cache(
            specs,
            max_model_len=case["max_model_len"],
            max_num_batched_tokens=case.get("max_num_batched_tokens", 2048),
            async_scheduling=False,
            kv_cache_memory_bytes=case["memory"],
            kv_cache_layout="LBHNC",
        )

    if "refused" in case:
        with pytest.raises(ValueError):
            plan()
        return
    got = plan()
    assert got.kv_cache_config.num_blocks == case["num_blocks"]
    assert got.num_tokens == case["kv_cache_size_tokens"]
    assert got.max_concurrency == pytest.approx(case["max_concurrency"], rel=1e-12)
    assert list(got.blocks_per_request) == case["blocks_per_request"]


def test_dcp_multiplies_the_tokens_a_budget_holds(capsys):
    """DeepSeek-V2-Lite on FlashAttention MLA at TP 2: DCP 2 holds twice the tokens in the
    same blocks, and the plan says why."""
    kwargs = dict(kv_cache_memory_bytes=20 << 30, max_model_len=32768, tensor_parallel_size=2)
    base = plan_model(EngineArgs(str(CONFIGS / "deepseek-v2-lite"), **kwargs))
    dcp = plan_model(
        EngineArgs(str(CONFIGS / "deepseek-v2-lite"), decode_context_parallel_size=2, **kwargs)
    )
    assert dcp.num_blocks == base.num_blocks
    assert dcp.num_tokens == 2 * base.num_tokens
    assert any("one token in 2" in note for note in dcp.config.model.notes)


def test_dcp_needs_a_backend_with_dcp_kernels_and_no_windows():
    model = get_kv_cache_spec(CONFIGS / "tiny-llama", backend="cpu_attn")
    with pytest.raises(ValueError, match="CPU_ATTN attention backend has no decode context"):
        shard_over_decode_context(model.specs, 2, model.backend.name)
    gemma = get_kv_cache_spec(CONFIGS / "tiny-gemma2", tensor_parallel_size=4)
    with pytest.raises(ValueError, match="does not support sliding-window layers"):
        shard_over_decode_context(gemma.specs, 2, gemma.backend.name)
    assert shard_over_decode_context(model.specs, 1, model.backend.name) is model.specs
