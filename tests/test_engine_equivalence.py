"""Differential test: greedy LLM.generate equals transformers' greedy generate, token for
token.

Three tiny Qwen3 shapes (GQA with 2 query heads per K/V head, plain multi-head attention with a
head_dim unrelated to hidden_size, one shared K/V head with tied embeddings and 3 layers), each
run through the engine in every mode that changes how K/V reach the cache: prefix caching on
and off, chunked prefill, preemption and recompute, block sizes 1, 3, 4 and 16, and
prefix-cache hits. None of these may change a single token. transformers runs one prompt at a
time, so padding plays no part. Everything is float32.
"""

from __future__ import annotations

import functools
import math

import pytest

from refimpl.engine import LLM, SamplingParams, make_tiny_model
from refimpl.engine.oracle import hf_greedy, load_hf_model

pytestmark = pytest.mark.slow  # greedy output against transformers on several tiny models

CONFIGS = {
    "gqa2": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    ),
    "mha_hd24": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=24,
    ),
    "mqa_tied": dict(
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=12,
        tie_word_embeddings=True,
    ),
}

# Mixed lengths (1 to 45 tokens), strings and token-id lists, different max_tokens.
PROMPTS = [
    "Hello",
    "Paged attention keeps K and V in fixed-size blocks.",
    [7],
    list(range(40, 63)),
    "The quick brown fox jumps over the lazy dog, twice.",
]
MAX_TOKENS = [9, 12, 8, 10, 7]

SYSTEM = "You are a tiny model. Answer in bytes. "  # 39 tokens shared by every prompt below
SHARED_PREFIX_PROMPTS = [SYSTEM + q for q in ("Why?", "What is a block table?", "Hi")]
SHARED_MAX_TOKENS = [8, 6, 10]


@functools.cache
def model_dir(name: str) -> str:
    import atexit
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix=f"refimpl-tiny-{name}-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    make_tiny_model(path, seed=1, **CONFIGS[name])
    return path


@functools.cache
def hf_model(name: str):
    from transformers import AutoTokenizer

    return load_hf_model(model_dir(name)), AutoTokenizer.from_pretrained(model_dir(name))


@functools.cache
def hf_greedy_cached(
    name: str, prompt: str | tuple[int, ...], max_new_tokens: int
) -> list[int]:
    model, tokenizer = hf_model(name)
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    return hf_greedy(model, ids, max_new_tokens)


def expected(name: str, prompts, max_tokens) -> list[list[int]]:
    return [
        hf_greedy_cached(name, p if isinstance(p, str) else tuple(p), n)
        for p, n in zip(prompts, max_tokens)
    ]


def run(name: str, prompts, max_tokens, **kwargs):
    llm = LLM(model_dir(name), device="cpu", dtype="float32", **kwargs)
    params = [SamplingParams(temperature=0, max_tokens=n) for n in max_tokens]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return llm, [o["token_ids"] for o in outputs]


MODES = {
    "prefix_on_block4": dict(
        kvcache_block_size=4, num_kvcache_blocks=128, enable_prefix_caching=True
    ),
    "prefix_off_block4": dict(
        kvcache_block_size=4, num_kvcache_blocks=128, enable_prefix_caching=False
    ),
    "block1": dict(kvcache_block_size=1, num_kvcache_blocks=512),
    "block3_chunked": dict(
        kvcache_block_size=3, num_kvcache_blocks=128, max_num_batched_tokens=5
    ),
    "block16_chunked": dict(
        kvcache_block_size=16, num_kvcache_blocks=32, max_num_batched_tokens=20
    ),
    "preempt_block4": dict(kvcache_block_size=4, num_kvcache_blocks=22),
    "preempt_block3_no_prefix": dict(
        kvcache_block_size=3, num_kvcache_blocks=27, enable_prefix_caching=False
    ),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_equals_transformers(name, mode):
    kwargs = MODES[mode]
    llm, got = run(name, PROMPTS, MAX_TOKENS, **kwargs)
    assert got == expected(name, PROMPTS, MAX_TOKENS)
    stats = llm.stats
    assert stats.decode_tokens + stats.prefill_steps > 0
    if "chunked" in mode:
        # every prompt token is computed once, in chunks of at most max_num_batched_tokens
        prompt_tokens = sum(
            len(llm.make_sequence(p, SamplingParams()).token_ids) for p in PROMPTS
        )
        assert stats.prefill_steps >= math.ceil(
            prompt_tokens / kwargs["max_num_batched_tokens"]
        )
    if mode.startswith("preempt"):
        assert stats.preemptions > 0
        assert stats.peak_blocks_in_use <= kwargs["num_kvcache_blocks"]
    else:
        assert stats.preemptions == 0


@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefix_cache_hits_change_nothing(name):
    want = expected(name, SHARED_PREFIX_PROMPTS, SHARED_MAX_TOKENS)
    # Chunked prefill makes later prompts start after the first one's blocks are registered.
    llm, first = run(
        name,
        SHARED_PREFIX_PROMPTS,
        SHARED_MAX_TOKENS,
        kvcache_block_size=4,
        num_kvcache_blocks=96,
        max_num_batched_tokens=48,
    )
    assert first == want
    assert llm.stats.cached_tokens > 0
    first_stats = llm.stats
    # A second identical call is served almost entirely from the cache.
    params = [SamplingParams(temperature=0, max_tokens=n) for n in SHARED_MAX_TOKENS]
    second = [
        o["token_ids"] for o in llm.generate(SHARED_PREFIX_PROMPTS, params, use_tqdm=False)
    ]
    assert second == want
    prompt_tokens = sum(len(SYSTEM) + len(q) for q in ("Why?", "What is a block table?", "Hi"))
    assert llm.stats.cached_tokens + llm.stats.prefill_tokens == prompt_tokens
    assert llm.stats.cached_tokens > first_stats.cached_tokens
    # Without the prefix cache the same prompts compute every token, with the same output.
    off, third = run(
        name,
        SHARED_PREFIX_PROMPTS,
        SHARED_MAX_TOKENS,
        kvcache_block_size=4,
        num_kvcache_blocks=96,
        max_num_batched_tokens=48,
        enable_prefix_caching=False,
    )
    assert third == want
    assert off.stats.cached_tokens == 0
    assert off.stats.prefill_tokens == prompt_tokens


def test_preemption_with_prefix_cache_recomputes_from_its_own_freed_blocks():
    """A preempted sequence's freed blocks stay hashed, so its recompute hits them."""
    name = "gqa2"
    llm, got = run(
        name,
        SHARED_PREFIX_PROMPTS,
        SHARED_MAX_TOKENS,
        kvcache_block_size=4,
        num_kvcache_blocks=18,
    )
    assert got == expected(name, SHARED_PREFIX_PROMPTS, SHARED_MAX_TOKENS)
    assert llm.stats.preemptions > 0
    assert llm.stats.cached_tokens > 0
