"""What prefix-cache retention costs the V4 engine, as vLLM answers it.

`V4LLM` takes vLLM's engine argument `prefix_cache_retention_interval` (default 0, as in vLLM
0.32's `CacheConfig` / `EngineArgs`) and hands it to its `KVCacheManager`. The case
(tools/crosscheck/engine_case.py): A = 512 shared tokens + 300 of its own, then B = the 512
shared tokens alone, then C = the shared tokens + 12. vLLM's answers were recorded by
`python -m tools.crosscheck record` from the scheduler calls V4's scheduler makes, played on
vLLM 0.32's own `KVCacheManager`; here they are replayed through refimpl, and the real tiny
engine must hit the prefix cache exactly as often as vLLM did.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.v4_models import hf_model, model_dir, one_thread  # noqa: E402, F401  (autouse)
from tools.crosscheck.allocator import _jsonable  # noqa: E402
from tools.crosscheck.engine_case import (  # noqa: E402
    ENGINE_GROUPS,
    MAX_NUM_BATCHED_TOKENS,
    NUM_KVCACHE_BLOCKS,
    RETENTIONS,
    engine_prompts,
)
from tools.crosscheck.refimpl_side import RefimplAllocator  # noqa: E402
from tools.crosscheck.streams import Harness  # noqa: E402

ORACLE = json.loads((ROOT / "tests" / "data" / "vllm_oracle.json").read_text())
ENGINE = {entry["retention"]: entry for entry in ORACLE["engine"]}


def vllm_hits(setting: str) -> list[int]:
    """Hit tokens of A, B and C in vLLM's recorded answers."""
    return [obs[0][2] for obs in ENGINE[setting]["observations"] if obs[0][0] == "hit"]


def test_vllm_recorded_what_retention_costs():
    """Dense (None): B hits 256 of its 512 tokens (its last token always runs again), C hits
    the whole 512-token prefix. Retention 0 keeps window blocks only where A can be resumed
    (its own prompt end), so B hits nothing and pins the junction at 256, which C then hits.
    An interval of 512 keeps every 512-token checkpoint: C hits 512, B (at most 511) hits
    nothing."""
    assert set(ENGINE) == set(RETENTIONS)
    assert {s: vllm_hits(s) for s in RETENTIONS} == {
        "none": [0, 256, 512],
        "0": [0, 0, 256],
        "2x": [0, 0, 512],
    }


@pytest.mark.parametrize("setting", sorted(RETENTIONS))
def test_the_allocator_replays_vllm_on_the_engine_case(setting):
    """Every table, the free queue, ref counts and hashed blocks after each call, as vLLM."""
    entry = ENGINE[setting]
    harness = Harness(RefimplAllocator(ENGINE_GROUPS, setting), ENGINE_GROUPS.max_model_len)
    for i, (op, expected) in enumerate(zip(entry["ops"], entry["observations"])):
        assert _jsonable((harness.play(tuple(op)), harness.observe())) == expected, i


def test_v4llm_defaults_to_vllms_retention():
    from refimpl.v4.llm import V4LLM

    default = inspect.signature(V4LLM).parameters["prefix_cache_retention_interval"].default
    assert default == 0


def test_v4llm_refuses_a_retention_vllm_refuses():
    from refimpl.v4.llm import V4LLM

    with pytest.raises(ValueError, match="multiple of the scheduler block size 256"):
        V4LLM(model_dir("A"), hf_model=hf_model("A"), prefix_cache_retention_interval=100)


@pytest.mark.slow  # the tiny V4 engine end to end (812-, 512- and 524-token prompts)
@pytest.mark.parametrize("setting", sorted(RETENTIONS))
def test_v4llm_hits_the_prefix_cache_as_vllm_does(setting):
    from refimpl.hybrid.single_type_kv_cache_manager import SlidingWindowManager
    from refimpl.paged.sequence import SamplingParams
    from refimpl.v4.llm import V4LLM

    llm = V4LLM(
        model_dir("A"),
        hf_model=hf_model("A"),
        num_kvcache_blocks=NUM_KVCACHE_BLOCKS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        prefix_cache_retention_interval=RETENTIONS[setting],
    )
    managers = llm.scheduler.kv_cache_manager.coordinator.single_type_managers
    # the recorded case is this engine's: same groups, pool and length limit
    assert (
        tuple(
            ("swa", m.block_size, m.sliding_window)
            if isinstance(m, SlidingWindowManager)
            else ("full", m.block_size)
            for m in managers
        )
        == ENGINE_GROUPS.groups
    )
    assert llm.max_model_len == ENGINE_GROUPS.max_model_len
    assert llm.model_runner.kv_cache.config.num_blocks == ENGINE_GROUPS.num_blocks
    hits = []
    one_token = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    with llm:
        for prompt in engine_prompts().values():
            llm.generate([prompt], one_token)
            hits.append(llm.stats.cached_tokens)
            assert llm.stats.preemptions == 0
    assert hits == vllm_hits(setting)


@pytest.mark.slow  # the running example end to end, as chapter 13's appendix runs it
def test_the_running_example_hits_the_prefix_cache_as_vllm_does(tmp_path):
    """Chapter 13 runs this case on Part II's running example (groups SWA-a, SWA-b, MLA, C128
    state, C4 state: the two state groups in the other order than config A's) and says vLLM
    answers with the same hits at each setting."""
    from refimpl.course.hybrid_toy import make_tiny_toy
    from refimpl.paged.sequence import SamplingParams
    from refimpl.v4.llm import V4LLM

    path = make_tiny_toy(tmp_path, seed=0)
    one_token = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    hf = None
    for setting, retention in sorted(RETENTIONS.items()):
        llm = V4LLM(
            path,
            hf_model=hf,
            num_kvcache_blocks=NUM_KVCACHE_BLOCKS,
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
            prefix_cache_retention_interval=retention,
        )
        hf = llm.hf_model
        hits = []
        with llm:
            for prompt in engine_prompts().values():
                llm.generate([prompt], one_token)
                hits.append(llm.stats.cached_tokens)
                assert llm.stats.preemptions == 0
        assert hits == vllm_hits(setting), setting
