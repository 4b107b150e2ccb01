"""refimpl.viz.engine: the step picture and its text twin show the model runner's real
tensors."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from refimpl.engine import LLM, SamplingParams, get_context, reset_context
from refimpl.viz.engine import byte_label, draw_step_inputs, step_inputs_text


def test_prefill_with_cached_prefix_then_decode(tiny_dir):
    llm = LLM(tiny_dir, device="cpu", kvcache_block_size=4, num_kvcache_blocks=10)
    sp = SamplingParams(temperature=0, max_tokens=2)
    # caches blocks 0 and 1
    llm.generate([[10, 11, 12, 13, 14, 15, 16, 17, 18]], sp, use_tqdm=False)
    b = llm.add_request([10, 11, 12, 13, 14, 15, 16, 17, 40, 41], sp)
    c = llm.add_request([65, 66, 67], sp)
    names = {b.seq_id: "B", c.seq_id: "C"}
    seqs, is_prefill = llm.scheduler.schedule()
    llm.model_runner.prepare_prefill(seqs)
    ctx = get_context()
    text = step_inputs_text(seqs, ctx, names, label=byte_label)
    fig = draw_step_inputs(seqs, ctx, 10, names, label=byte_label)
    reset_context()
    assert isinstance(fig, Figure)
    # B hits blocks 0, 1 (8 tokens); A freed 2, 1, 0 to the queue's tail, so new blocks 3, 4
    # come from its head
    assert text.splitlines()[:8] == [
        "prefill step: 2 sequences, 5 tokens computed",
        "cu_seqlens_q = [0, 2, 5]   max_seqlen_q = 3",
        "cu_seqlens_k = [0, 10, 13]   max_seqlen_k = 10",
        "slot_mapping = [12, 13, 16, 17, 18]",
        "block_tables = [[0, 1, 3], [4, -1, -1]]",
        "seq      cached  computes positions",
        "B             8  8..9",
        "C             0  0..2",
    ]
    assert text.splitlines()[-1] == "C      C          2      4       2    18"
    tokens = llm.model_runner.run(seqs, is_prefill)
    llm.scheduler.postprocess(seqs, tokens, is_prefill)
    seqs, is_prefill = llm.scheduler.schedule()
    llm.model_runner.prepare_decode(seqs)
    text = step_inputs_text(seqs, get_context(), names)
    assert isinstance(draw_step_inputs(seqs, get_context(), 10, names), Figure)
    reset_context()
    assert not is_prefill
    assert "context_lens = [11, 4]" in text and "slot_mapping = [14, 19]" in text


def test_empty_context_is_a_clear_error(tiny_dir):
    from refimpl.engine import Context

    with pytest.raises(ValueError, match="prepare_prefill or prepare_decode"):
        step_inputs_text([], Context())
