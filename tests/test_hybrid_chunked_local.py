"""Llama 4's chunked local attention in the hybrid cache: `ChunkedLocalAttentionManager`.

vLLM 0.32 agreement is checked by the two oracles (tests/test_hybrid_vllm_oracle.py: the
chunked group sets; tests/test_sched_vllm_oracle.py: the llama4 settings); these tests pin the
rules on small hand-made cases (vLLM's own docstring examples) and run the Llama 4 Scout
config end to end.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from refimpl.__main__ import main
from refimpl.hybrid import ChunkedLocalAttentionSpec, FullAttentionSpec, KVCacheGroupSpec
from refimpl.hybrid.block_pool import BlockPool
from refimpl.hybrid.kv_cache_manager import KVCacheManager
from refimpl.hybrid.single_type_kv_cache_manager import (
    ChunkedLocalAttentionManager,
    make_manager,
)

ROOT = Path(__file__).resolve().parents[1]
SCOUT = ROOT / "benchmarks" / "configs" / "llama-4-scout-17b-16e-instruct"
COMMON = dict(num_kv_heads=1, head_size=8, dtype="float16")


def chunked(block_size: int = 4, chunk: int = 8) -> ChunkedLocalAttentionSpec:
    return ChunkedLocalAttentionSpec(
        block_size=block_size, attention_chunk_size=chunk, **COMMON
    )


def test_make_manager_gives_chunked_groups_their_manager():
    manager = make_manager(chunked(), BlockPool(8), 0)
    assert type(manager) is ChunkedLocalAttentionManager
    assert manager.attention_chunk_size == 8


@pytest.mark.parametrize(("computed", "skipped"), [(13, 8), (8, 8), (7, 0), (0, 0), (17, 16)])
def test_skipped_tokens_are_the_whole_chunks_before_the_next_token(computed, skipped):
    """vLLM's examples (chunk 8): the next token reads back to the start of its chunk."""
    manager = make_manager(chunked(), BlockPool(8), 0)
    assert manager.get_num_skipped_tokens(computed) == skipped


def test_admission_cap_is_one_chunk_plus_the_tokens_in_flight():
    manager = make_manager(chunked(4, 8), BlockPool(8), 0, max_in_flight_tokens=6)
    assert manager.max_admission_blocks_per_request() == 4  # cdiv(8 + 6, 4)
    assert make_manager(chunked(), BlockPool(8), 0).max_admission_blocks_per_request() is None


def cached_manager(num_tokens: int) -> tuple[KVCacheManager, list[int]]:
    """A full + chunked (chunk 8, blocks of 4) manager that computed and cached a prompt of
    `num_tokens` tokens, then freed it."""
    m = KVCacheManager(
        [
            KVCacheGroupSpec(("full",), FullAttentionSpec(block_size=4, **COMMON)),
            KVCacheGroupSpec(("local",), chunked()),
        ],
        num_blocks=40,
        max_model_len=64,
    )
    prompt = list(range(1, num_tokens + 1))
    first = m.make_request("a", prompt)
    assert m.allocate_slots(first, num_tokens) is not None
    first.num_computed_tokens = num_tokens
    m.free(first)
    return m, prompt


@pytest.mark.parametrize(
    ("max_length", "chunked_hit", "hit"),
    [
        # vLLM's docstring: to 15 tokens, blocks 0-1 (chunk 0) are skipped, block 2 is looked
        # up; to 16, the next token starts a chunk and everything before it is skipped
        (15, ["null", "null", "hit"], 12),
        (16, ["null"] * 4, 16),
        (7, ["hit"], 4),
    ],
)
def test_a_hit_needs_only_the_blocks_of_its_last_chunk(max_length, chunked_hit, hit):
    m, prompt = cached_manager(20)
    second = m.make_request("b", prompt[:max_length] + [99])
    blocks, hit_length, junction = m.get_computed_blocks(second)
    assert hit_length == hit and junction == 0
    local = ["null" if b.is_null else "hit" for b in blocks.blocks[1]]
    assert local == chunked_hit
    assert len(blocks.blocks[0]) == hit // 4  # full attention: every block of the hit


def test_blocks_of_finished_chunks_become_null_as_the_request_moves_on():
    m, _ = cached_manager(4)
    req = m.make_request("c", list(range(50, 70)))
    assert m.allocate_slots(req, 12) is not None
    req.num_computed_tokens = 12
    assert m.allocate_slots(req, 6) is not None  # tokens 12-17: chunk 0 (tokens 0-7) is done
    full, local = m.get_block_ids("c")
    assert len(full) == 5 and 0 not in full
    assert local[:2] == [0, 0] and 0 not in local[2:]  # block 0 is the null block


def test_eagle_and_a_coarser_scheduler_block_are_refused_at_lookup_as_in_vllm():
    pool = BlockPool(8)
    spec = chunked()
    with pytest.raises(ValueError, match="eagle"):
        ChunkedLocalAttentionManager.find_longest_cache_hit(
            [], 8, [0], pool, spec, drop_eagle_block=True
        )
    with pytest.raises(ValueError, match="alignment_tokens 8"):
        ChunkedLocalAttentionManager.find_longest_cache_hit(
            [], 8, [0], pool, spec, alignment_tokens=8
        )


def test_llama4_scout_plans_three_chunked_groups_and_one_full():
    """vLLM reads each layer's kind from `no_rope_layers`; the published config leaves it
    empty and transformers makes every fourth layer NoPE (full attention)."""
    from refimpl.models import EngineArgs, plan_model

    plan = plan_model(EngineArgs(SCOUT, tensor_parallel_size=4, max_model_len=131072))
    groups = plan.kv.kv_cache_config.kv_cache_groups
    kinds = [type(g.kv_cache_spec).__name__ for g in groups]
    assert kinds == ["ChunkedLocalAttentionSpec"] * 3 + ["FullAttentionSpec"]
    assert [len(g.layer_names) for g in groups] == [12, 12, 12, 12]
    assert groups[3].layer_names[0].endswith("layers.3.self_attn.attn")
    assert groups[0].kv_cache_spec.attention_chunk_size == 8192


def test_simulate_runs_llama4_scout_on_the_mooncake_slice(capsys):
    """On the plan with chunked groups (the pool is that plan's), every request finishes."""
    from refimpl.models import EngineArgs, plan_model

    plan = plan_model(EngineArgs(SCOUT, tensor_parallel_size=4, max_model_len=131072))
    assert any(g.kind == "ChunkedLocalAttentionSpec" for g in plan.groups)
    trace = ROOT / "refimpl" / "sched" / "data" / "mooncake_conversation_slice.jsonl"
    argv = ["simulate", "--config", str(SCOUT), "-tp", "4", "--max-model-len", "131072"]
    code = main([*argv, "--trace", str(trace), "--limit", "30", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert report["num_requests"] == 30 and report["block_size"] == 16
    assert report["num_blocks"] == plan.num_blocks
    assert 0 < report["hit_tokens"] <= report["upper_bound_tokens"]
