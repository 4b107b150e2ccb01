"""The engine's addressing agrees with Part II's DeepSeek V4 index kernels on real engine steps.

For packed steps recorded from the V4 engine (chunked prefill of three requests, then decode),
the slots the paged layer reads for the sliding window, the slots of the indexer's top-k picks,
and the slots the closing tokens write compressed entries to are recomputed with
`compute_swa_indices_and_lens`, `compute_global_topk_indices_and_lens` (Triton and their torch
twins) and `compressed_slot_mapping`. The engine runs on the CPU; the index kernels and twins run on
``kernel_device`` (the CPU under Triton's interpreter, CUDA where the kernels compile).
"""

from __future__ import annotations

import pytest
import torch

from refimpl.kernels import reference_v4 as ref
from refimpl.kernels.triton_setup import HAS_TRITON
from refimpl.paged.sequence import SamplingParams
from refimpl.v4.paged import slots
from tests.v4_models import hf_model, model_dir, prompts

IMPLS = ["torch"] + (["triton"] if HAS_TRITON else [])


def impl(name):
    if name == "triton":
        from refimpl.kernels import deepseek_v4 as tri

        return tri
    return ref


@pytest.fixture(scope="module")
def recorded():
    from refimpl.v4.llm import V4LLM

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.device("cpu"):  # the V4 engine runs on the CPU
        llm = V4LLM(model_dir("A"), hf_model=hf_model("A"), num_kvcache_blocks=160, max_num_batched_tokens=40,
                    enable_prefix_caching=False)
        llm.record_steps = True
        llm.generate([prompts()["P2"], [7] * 30, prompts()["P1"][:45]],
                     SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    torch.set_num_threads(before)
    return llm, llm.last_contexts


def batch_tensors(ctx, group, device):
    """(query_start_loc, seq_lens, token_to_req_indices, is_valid_token, block_table) of a step, on `device`."""
    with torch.device(device):
        qsl = torch.tensor([0] + [c.start + c.num_tokens for c in ctx.chunks], dtype=torch.int32)
        seq = torch.tensor([c.end_position for c in ctx.chunks], dtype=torch.int32)
        t2r = torch.cat([torch.full((c.num_tokens,), i, dtype=torch.int32) for i, c in enumerate(ctx.chunks)])
        width = max(len(c.block_tables[group]) for c in ctx.chunks)
        bt = torch.tensor([c.block_tables[group] + [0] * (width - len(c.block_tables[group])) for c in ctx.chunks],
                          dtype=torch.int32)
        return qsl, seq, t2r, torch.ones(len(t2r), dtype=torch.bool), bt


@pytest.mark.parametrize("kernel", IMPLS)
def test_sliding_window_slots(recorded, kernel_device, kernel):
    # the engine's side (its slots) on the CPU; the kernels and twins on kernel_device
    with torch.device("cpu"):
        llm, contexts = recorded
        swa = llm.kv_cache.layers[1].swa
        window = llm.hf_model.config.sliding_window
        assert len(contexts) >= 4 and any(len(ctx.chunks) > 1 for ctx in contexts)
        for ctx in contexts:
            qsl, seq, t2r, valid, bt = batch_tensors(ctx, swa.group, kernel_device)
            got, lens = impl(kernel).compute_swa_indices_and_lens(qsl, seq, t2r, valid, bt, swa.block_size, window)
            got, lens = got.cpu(), lens.cpu()
            for chunk in ctx.chunks:
                for i in range(chunk.num_tokens):
                    p = chunk.first_position + i
                    mine = slots(swa, chunk.block_tables[swa.group], torch.arange(max(0, p - window + 1), p + 1))
                    row = chunk.start + i
                    assert got[row, : lens[row]].tolist() == mine.tolist()


@pytest.mark.parametrize("kernel", IMPLS)
def test_topk_and_compressed_entry_slots(recorded, kernel_device, kernel):
    # the engine's side (its slots) on the CPU; the kernels and twins on kernel_device
    with torch.device("cpu"):
        llm, contexts = recorded
        caches = llm.kv_cache.layers[1]
        attn = caches.attn
        checked = 0
        for ctx in contexts:
            qsl, seq, t2r, valid, bt = batch_tensors(ctx, attn.group, kernel_device)
            picks = ctx.topk_indices[1]
            k = max(p.shape[1] for p in picks)
            topk = torch.full((len(t2r), max(k, 1)), -1, dtype=torch.int32, device=kernel_device)
            for chunk, p in zip(ctx.chunks, picks):
                topk[chunk.start : chunk.start + chunk.num_tokens, : p.shape[1]] = p.to(torch.int32)
            got, lens = impl(kernel).compute_global_topk_indices_and_lens(topk, t2r, bt, attn.entries_per_block, valid)
            got, lens = got.cpu(), lens.cpu()
            for chunk, p in zip(ctx.chunks, picks):
                for i in range(chunk.num_tokens):
                    chosen = p[i][p[i] >= 0]
                    mine = slots(attn, chunk.block_tables[attn.group], chosen)
                    assert got[chunk.start + i, : lens[chunk.start + i]].tolist() == mine.tolist()
                    checked += len(chosen)
            written = ref.compressed_slot_mapping(qsl, seq, bt, attn.entries_per_block, 4).cpu()
            for chunk in ctx.chunks:
                pos = ctx.positions[chunk.start : chunk.start + chunk.num_tokens]
                closing = (pos + 1) % 4 == 0
                mine = torch.full_like(pos, -1)
                mine[closing] = slots(attn, chunk.block_tables[attn.group], pos[closing] // 4)
                assert written[chunk.start : chunk.start + chunk.num_tokens].tolist() == mine.tolist()
        assert checked > 50
