"""ModelRunner: exact step inputs (slot mapping, cu_seqlens, block tables), KV cache sizing,
logits."""

from __future__ import annotations

import pytest
import torch

from refimpl.engine import LLM, SamplingParams, get_context, reset_context
from refimpl.errors import InvariantError
from refimpl.paged.sequence import Sequence


@pytest.fixture(scope="module")
def runner(tiny_dir):
    return LLM(
        tiny_dir, device="cpu", kvcache_block_size=4, num_kvcache_blocks=16
    ).model_runner


def seq_with(token_ids, block_table, num_cached_tokens, num_scheduled_tokens):
    seq = Sequence(token_ids, block_size=4)
    seq.block_table = list(block_table)
    seq.num_cached_tokens = num_cached_tokens
    seq.num_scheduled_tokens = num_scheduled_tokens
    return seq


def test_prepare_prefill_two_fresh_prompts(runner):
    a = seq_with(range(100, 110), [0, 1, 2], 0, 10)  # 10 tokens in blocks 0, 1, 2
    b = seq_with(range(200, 206), [7, 3], 0, 6)  # 6 tokens in blocks 7, 3
    input_ids, positions = runner.prepare_prefill([a, b])
    ctx = get_context()
    try:
        assert input_ids.tolist() == list(range(100, 110)) + list(range(200, 206))
        assert positions.tolist() == list(range(10)) + list(range(6))
        assert ctx.is_prefill
        assert ctx.cu_seqlens_q.tolist() == [0, 10, 16]
        assert ctx.cu_seqlens_k.tolist() == [0, 10, 16]
        assert (ctx.max_seqlen_q, ctx.max_seqlen_k) == (10, 10)
        # slot = block_id * 4 + offset: a fills 0..9, b fills block 7 (28..31) then block 3
        # (12, 13)
        assert ctx.slot_mapping.tolist() == list(range(10)) + [28, 29, 30, 31, 12, 13]
        assert ctx.block_tables.tolist() == [[0, 1, 2], [7, 3, -1]]
        assert (
            ctx.slot_mapping.dtype
            == ctx.block_tables.dtype
            == ctx.cu_seqlens_q.dtype
            == torch.int32
        )
    finally:
        reset_context()


def test_prepare_prefill_with_cached_prefix_and_a_chunk(runner):
    # c: 8 tokens served from the prefix cache (blocks 0, 1), computes its last 3 tokens.
    c = seq_with(range(100, 111), [0, 1, 5], 8, 3)
    # d: a chunked prompt of 9 tokens whose first chunk (5 tokens) is done; this chunk is 2
    # tokens.
    d = seq_with(range(300, 309), [6, 9, 4], 5, 2)
    input_ids, positions = runner.prepare_prefill([c, d])
    ctx = get_context()
    try:
        assert input_ids.tolist() == [108, 109, 110, 305, 306]
        assert positions.tolist() == [8, 9, 10, 5, 6]
        assert ctx.cu_seqlens_q.tolist() == [0, 3, 5]
        assert ctx.cu_seqlens_k.tolist() == [0, 11, 18]  # whole contexts: 11 and 7 tokens
        assert (ctx.max_seqlen_q, ctx.max_seqlen_k) == (3, 11)
        assert ctx.slot_mapping.tolist() == [20, 21, 22, 37, 38]
        assert ctx.block_tables.tolist() == [[0, 1, 5], [6, 9, 4]]
    finally:
        reset_context()


def test_step_addresses_are_checked_once_by_the_runner(runner):
    """The runner checks slots and block tables on its lists and marks the context checked, so
    the attention layers skip their tensor checks; a broken table is an InvariantError before
    any tensor."""
    ok = seq_with(range(100, 106), [0, 1], 0, 6)
    runner.prepare_prefill([ok])
    try:
        assert get_context().checked
    finally:
        reset_context()
    # block 16 of 16; too short; slot twice
    for table, num_cached in (([0, 16], 0), ([3], 0), ([2, 2], 4)):
        bad = seq_with(range(100, 106), table, num_cached, 6 - num_cached)
        other = seq_with(range(300, 306), [2, 2], 4, 2)
        with pytest.raises(InvariantError):
            runner.prepare_prefill([bad, other] if num_cached else [bad])
    reset_context()


def test_prepare_decode(runner):
    # 11 tokens: the newest sits at position 10
    e = seq_with(range(100, 111), [0, 1, 5], 10, 1)
    f = seq_with(range(50, 55), [2, 8], 4, 1)  # 5 tokens: the newest opens block 8
    e.is_prefill = f.is_prefill = False
    input_ids, positions = runner.prepare_decode([e, f])
    ctx = get_context()
    try:
        assert input_ids.tolist() == [110, 54]
        assert positions.tolist() == [10, 4]
        assert not ctx.is_prefill
        assert ctx.slot_mapping.tolist() == [5 * 4 + 2, 8 * 4 + 0]
        assert ctx.context_lens.tolist() == [11, 5]
        assert ctx.block_tables.tolist() == [[0, 1, 5], [2, 8, -1]]
    finally:
        reset_context()


def test_kv_cache_sized_from_blocks_or_budget(tiny_dir, runner):
    # 2 layers x K,V x 4 slots x 2 kv heads x head_dim 16 x 4 bytes
    assert runner.block_bytes == 2 * 2 * 4 * 2 * 16 * 4 == 2048
    assert tuple(runner.kv_cache.shape) == (2, 2, 16, 4, 2, 16)
    layers = runner.model.attention_layers()
    assert layers[1].k_cache.data_ptr() == runner.kv_cache[0, 1].data_ptr()
    assert layers[1].v_cache.data_ptr() == runner.kv_cache[1, 1].data_ptr()
    llm = LLM(tiny_dir, device="cpu", kvcache_block_size=4, kv_cache_memory_bytes=10_000)
    assert llm.model_runner.num_kvcache_blocks == 4 == llm.scheduler.block_manager.num_blocks
    with pytest.raises(ValueError, match="holds no block"):
        LLM(tiny_dir, device="cpu", kvcache_block_size=4, kv_cache_memory_bytes=1000)


def test_attention_backend_choice(tiny_dir):
    # the automatic choice on a CPU is torch (Triton's interpreter is never picked by itself)
    assert (
        LLM(
            tiny_dir, device="cpu", kvcache_block_size=4, num_kvcache_blocks=4
        ).attention_backend
        == "torch"
    )
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        LLM(tiny_dir, device="cpu", attention_backend="cuda-magic")
    with pytest.raises(RuntimeError, match="flash-attn runs only on CUDA"):
        LLM(
            tiny_dir,
            device="cpu",
            kvcache_block_size=256,
            num_kvcache_blocks=4,
            attention_backend="flash-attn",
        )
    # flash-attn pages only multiples of 256 tokens: a smaller block size is refused on any
    # machine.
    with pytest.raises(ValueError, match="multiple of 256"):
        LLM(
            tiny_dir,
            device="cpu",
            kvcache_block_size=16,
            num_kvcache_blocks=4,
            attention_backend="flash-attn",
        )


def test_prefill_and_decode_logits_match_transformers(tiny_dir):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    llm = LLM(tiny_dir, device="cpu", kvcache_block_size=4, num_kvcache_blocks=16)
    runner, scheduler = llm.model_runner, llm.scheduler
    ids = list(b"paged attention")
    seq = Sequence(ids, SamplingParams(temperature=0, max_tokens=3), block_size=4)
    scheduler.add(seq)
    for step in range(3):
        seqs, is_prefill = scheduler.schedule()
        assert is_prefill == (step == 0)
        inputs = runner.prepare_prefill(seqs) if is_prefill else runner.prepare_decode(seqs)
        try:
            logits = runner.run_model(*inputs, is_prefill)
        finally:
            reset_context()
        with torch.no_grad():
            want = hf(torch.tensor([seq.token_ids])).logits[0, -1]
        torch.testing.assert_close(logits[0], want, atol=2e-5, rtol=1e-5)
        scheduler.postprocess(seqs, [int(logits[0].argmax())], is_prefill)
    assert seq.is_finished
