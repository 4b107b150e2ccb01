"""LLM.generate: the public API, its checks, its stats and its progress bar."""

from __future__ import annotations

import pytest

from refimpl.engine import LLM, SamplingParams


@pytest.fixture
def llm(tiny_dir):
    return LLM(
        tiny_dir,
        device="cpu",
        kvcache_block_size=4,
        num_kvcache_blocks=32,
        enable_prefix_caching=False,
    )


def test_outputs_in_prompt_order_strings_equal_their_token_ids(llm):
    prompts = ["KV cache", "Blocks of four tokens each", "x"]
    sp = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    outputs = llm.generate(prompts, sp, use_tqdm=False)
    assert [sorted(o) for o in outputs] == [["text", "token_ids"]] * 3
    assert all(len(o["token_ids"]) == 5 for o in outputs)
    assert [o["text"] for o in outputs] == [
        llm.tokenizer.decode(o["token_ids"]) for o in outputs
    ]
    as_ids = llm.generate([list(p.encode()) for p in reversed(prompts)], sp, use_tqdm=False)
    assert [o["token_ids"] for o in as_ids] == [o["token_ids"] for o in reversed(outputs)]


def test_stats_count_what_happened(llm):
    prompts = [list(range(1, 11)), list(range(20, 27))]  # 10 and 7 tokens
    params = [
        SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
    ]
    llm.generate(prompts, params, use_tqdm=False)
    s = llm.stats
    assert (s.prefill_tokens, s.cached_tokens) == (17, 0)
    assert s.decode_tokens == (5 - 1) + (3 - 1)  # the first token of each comes from prefill
    assert (s.prefill_steps, s.decode_steps, s.steps, s.preemptions) == (1, 4, 5, 0)
    # both prompts' blocks, plus one more block when the first grows to 13 tokens
    assert s.peak_blocks_in_use == 3 + 2 + 1
    assert s.prefill_time_s > 0 and s.decode_time_s > 0


def test_max_tokens_one_finishes_in_the_prefill_step(llm):
    out = llm.generate(
        [[5, 6, 7], [8]], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False
    )
    assert [len(o["token_ids"]) for o in out] == [1, 1]
    assert (llm.stats.steps, llm.stats.decode_tokens) == (1, 0)
    # finished sequences freed their blocks
    assert len(llm.scheduler.block_manager.free_block_ids) == 32


def test_prefix_cache_counts_served_tokens(tiny_dir):
    llm = LLM(tiny_dir, device="cpu", kvcache_block_size=4, num_kvcache_blocks=32)
    prompt = [list(range(1, 15))]  # 14 tokens: 3 full blocks, the last is never looked up
    sp = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    first = llm.generate(prompt, sp, use_tqdm=False)
    assert (llm.stats.prefill_tokens, llm.stats.cached_tokens) == (14, 0)
    second = llm.generate(prompt, sp, use_tqdm=False)
    assert (llm.stats.prefill_tokens, llm.stats.cached_tokens) == (2, 12)
    assert first == second


def test_seeded_sampling_is_reproducible(tiny_dir):
    sp = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)

    def sample(seed):
        return LLM(
            tiny_dir, device="cpu", kvcache_block_size=4, num_kvcache_blocks=32, seed=seed
        ).generate(["sampling"], sp, use_tqdm=False)[0]["token_ids"]

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_progress_bar_shows_throughput_only_when_asked(llm, capsys):
    sp = SamplingParams(temperature=0, max_tokens=3)
    llm.generate(["progress"], sp, use_tqdm=False)
    assert capsys.readouterr().err == ""
    llm.generate(["progress"], sp, use_tqdm=True)
    err = capsys.readouterr().err
    assert "Generating" in err and "Prefill" in err and "Decode" in err and "tok/s" in err


def test_bad_requests_are_rejected_before_anything_is_queued(llm):
    sp = SamplingParams(temperature=0, max_tokens=4)
    cases = [
        (["fine", ""], sp, "at least one token"),
        (["fine", [1, 2, 999]], sp, "outside the vocabulary"),
        (["fine", "y" * 200], sp, "can never run in a pool of 32 blocks"),
        (["fine", [1.5]], sp, "list of token ids"),
        (["a", "b"], [sp], "got 1 SamplingParams for 2 prompts"),
        ("just one string", sp, "not a single prompt"),
        (["fine"], {"temperature": 0}, "must be a SamplingParams"),
    ]
    for prompts, params, message in cases:
        with pytest.raises(ValueError, match=message):
            llm.generate(prompts, params, use_tqdm=False)
        assert not llm.scheduler.waiting and not llm.scheduler.running
        assert len(llm.scheduler.block_manager.free_block_ids) == 32


def test_bad_engine_arguments(tiny_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown LLM arguments \\['block_size'\\]"):
        LLM(tiny_dir, device="cpu", block_size=16)
    with pytest.raises(ValueError, match="local checkpoint directory"):
        LLM(tmp_path / "nowhere", device="cpu")
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        LLM(tiny_dir, device="cpu", kvcache_block_size=0)
    with pytest.raises(ValueError, match="dtype must be one of"):
        LLM(tiny_dir, device="cpu", num_kvcache_blocks=4, dtype="float8")
    long = LLM(tiny_dir, device="cpu", num_kvcache_blocks=64, max_model_len=20)
    with pytest.raises(ValueError, match="exceeds max_model_len=20"):
        long.generate([[1] * 15], SamplingParams(max_tokens=6), use_tqdm=False)


def test_bfloat16_runs_with_a_bfloat16_cache(tiny_dir):
    llm = LLM(
        tiny_dir, device="cpu", kvcache_block_size=4, num_kvcache_blocks=16, dtype="bfloat16"
    )
    out = llm.generate(
        ["bf16"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False
    )
    assert len(out[0]["token_ids"]) == 4
    import torch

    assert llm.model_runner.kv_cache.dtype == torch.bfloat16
    assert llm.model_runner.model.lm_head.weight.dtype == torch.bfloat16
