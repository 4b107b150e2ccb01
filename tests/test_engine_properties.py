"""Property test: random engine settings and request mixes never change a greedy token.

Hypothesis draws the block size, pool size (from just enough for the largest request to
plenty), token budget per step (forcing chunked prefill), max_num_seqs, prefix caching on or
off, and a batch of requests from a pool with shared prefixes and duplicates. The engine is
stepped by hand and the block manager's invariants are checked after every step; at the end
every output must equal transformers' greedy output for that prompt.
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl.engine import LLM, SamplingParams, make_tiny_model
from refimpl.engine.oracle import hf_greedy, load_hf_model
from refimpl.paged import check_invariants

pytestmark = pytest.mark.slow  # random engine settings end to end

SYSTEM = list(b"System: be brief. ")  # 18 tokens
POOL = [
    SYSTEM + list(b"Hi"),
    # a duplicate: may share blocks with its twin in the same or a later step
    SYSTEM + list(b"Hi"),
    SYSTEM + list(b"What is paging?"),
    SYSTEM[:9] + list(b"other"),
    list(b"abc"),
    [42],
    list(range(60, 92)),
]
MAX_TOKENS = [5, 5, 4, 6, 7, 3, 4]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    with torch.device("cpu"):  # the checkpoint and the transformers oracle live on the CPU
        path = make_tiny_model(
            tmp_path_factory.mktemp("tiny"),
            seed=5,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=8,
            hidden_size=32,
            intermediate_size=64,
        )
        hf = load_hf_model(path)
        expected = [hf_greedy(hf, p, n) for p, n in zip(POOL, MAX_TOKENS)]
    return path, expected


@functools.cache
def _blocks_needed(index: int, block_size: int) -> int:
    return -(-(len(POOL[index]) + MAX_TOKENS[index] - 1) // block_size)


@settings(max_examples=30)
@given(data=st.data())
def test_random_settings_never_change_greedy_output(setup, data):
    path, expected = setup
    picks = data.draw(
        st.lists(st.integers(0, len(POOL) - 1), min_size=1, max_size=5), label="requests"
    )
    block_size = data.draw(st.integers(1, 9), label="block_size")
    smallest_pool = max(_blocks_needed(i, block_size) for i in picks)
    pool = data.draw(
        st.integers(
            smallest_pool, smallest_pool + sum(_blocks_needed(i, block_size) for i in picks)
        ),
        label="num_kvcache_blocks",
    )
    llm = LLM(
        path,
        device="cpu",
        kvcache_block_size=block_size,
        num_kvcache_blocks=pool,
        max_num_batched_tokens=data.draw(st.integers(4, 64), label="max_num_batched_tokens"),
        max_num_seqs=data.draw(st.integers(1, 4), label="max_num_seqs"),
        enable_prefix_caching=data.draw(st.booleans(), label="enable_prefix_caching"),
    )
    seqs = [
        llm.add_request(POOL[i], SamplingParams(temperature=0, max_tokens=MAX_TOKENS[i]))
        for i in picks
    ]
    scheduler = llm.scheduler
    while not llm.is_finished():
        llm.step()
        holders = [
            s for s in list(scheduler.running) + list(scheduler.waiting) if s.block_table
        ]
        check_invariants(scheduler.block_manager, holders)
    assert [s.completion_token_ids for s in seqs] == [expected[i] for i in picks]
    assert len(scheduler.block_manager.free_block_ids) == pool
