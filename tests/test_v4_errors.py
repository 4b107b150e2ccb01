"""Bad input to the V4 engine: a clear ValueError before anything changes."""

from __future__ import annotations

import pytest

from refimpl.paged.sequence import SamplingParams
from tests.v4_models import hf_model, model_dir, prompts


def make_llm(**kwargs):
    from refimpl.v4.llm import V4LLM

    return V4LLM(model_dir("A"), hf_model=hf_model("A"), **kwargs)


def snapshot(llm):
    return (len(llm.scheduler.waiting), len(llm.scheduler.running), llm.scheduler.kv_cache_manager.usage, llm._next_id)


@pytest.mark.parametrize("prompts_, params, match", [
    ([[]], SamplingParams(max_tokens=2), "empty prompt"),
    ([[1, 2], list(range(100)) * 21], SamplingParams(max_tokens=2), "max_model_len"),
    ([[1, 2]], SamplingParams(max_tokens=2048), "max_model_len"),
    ([[1, 999]], SamplingParams(max_tokens=2), "vocabulary"),
    ([1, 2, 3], SamplingParams(max_tokens=2), "single prompt"),
    ([[1, 2]], [SamplingParams(), SamplingParams()], "SamplingParams"),
    ([[1, "x"]], SamplingParams(max_tokens=2), "token ids"),
])
def test_bad_prompts_change_nothing(prompts_, params, match):
    llm = make_llm(num_kvcache_blocks=64)
    before = snapshot(llm)
    with pytest.raises(ValueError, match=match):
        llm.generate(prompts_, params)
    assert snapshot(llm) == before


def test_pool_too_small_for_one_request():
    llm = make_llm(num_kvcache_blocks=12)
    before = snapshot(llm)
    with pytest.raises(ValueError, match="needs .* blocks; the pool has only 11"):
        llm.generate([[5, 6], prompts()["P1"]], SamplingParams(max_tokens=2))
    assert snapshot(llm) == before
    out = llm.generate([[5, 6]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    assert len(out[0]["token_ids"]) == 2  # still usable afterwards


@pytest.mark.parametrize("kwargs", [dict(num_kvcache_blocks=1), dict(max_num_batched_tokens=0),
                                    dict(max_num_seqs=0), dict(max_model_len=10**6), dict(kvcache_block_size=100)])
def test_bad_engine_arguments(kwargs):
    with pytest.raises(ValueError):
        make_llm(**kwargs)
