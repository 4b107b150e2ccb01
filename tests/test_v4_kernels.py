"""The V4 engine's addresses are Part II's: checked on real engine steps.

The model runner computes every slot the layers use once per step, with `hybrid.addressing`
and the DeepSeek V4 index kernels. For packed steps recorded from the engine (chunked prefill
of three requests, then decode), every address in the step's `AttentionMetadata` is recomputed
one position at a time with Part II's scalar rules (`slot_for_position`,
`compressed_slot_for_position`, `swa_window_positions`, `causal_compressed_entries`); the
indexer's real picks go through the top-k kernel and are checked the same way; the Triton
kernels build the same metadata as the torch twins; and an engine on the Triton backend
generates the same tokens as one on the torch backend. The engine keeps its cache on the CPU:
the top-k check runs the kernel on ``kernel_device`` (the CPU under Triton's interpreter, CUDA
where the kernels compile), the engine's own Triton backend only where the kernels take CPU
tensors (the interpreter).
"""

from __future__ import annotations

import pytest
import torch

from refimpl.hybrid.addressing import (
    causal_compressed_entries,
    compressed_slot_for_position,
    slot_for_position,
    swa_window_positions,
)
from refimpl.kernels.backend import v4_index_ops
from refimpl.kernels.triton_setup import HAS_TRITON
from refimpl.paged.sequence import SamplingParams
from refimpl.v4.model_runner import build_attention_metadata
from tests.v4_models import hf_model, model_dir, one_thread, prompts  # noqa: F401  (autouse fixture)

SP = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
IMPLS = ["torch"] + (["triton"] if HAS_TRITON else [])


def batch_prompts():
    return [prompts()["P2"], [7] * 30, prompts()["P1"][:45]]


def make_llm(**kwargs):
    from refimpl.v4.llm import V4LLM

    with torch.device("cpu"):  # the V4 engine runs on the CPU
        return V4LLM(
            model_dir("A"),
            hf_model=hf_model("A"),
            num_kvcache_blocks=160,
            max_num_batched_tokens=40,
            enable_prefix_caching=False,
            **kwargs,
        )


@pytest.fixture
def interpreter(kernel_device):
    """Skip unless the Triton kernels take CPU tensors here (the interpreter), as the V4
    engine's cache is on the CPU."""
    if kernel_device != "cpu":
        pytest.skip(
            "the V4 engine keeps its cache on the CPU; its Triton backend needs Triton's "
            "interpreter"
        )


@pytest.fixture(scope="module")
def recorded():
    """(engine, [(block_ids, num_computed, num_new, metadata) per step]) of one generate
    call."""
    llm = make_llm()
    steps = []
    prepare = llm.model_runner.prepare_inputs

    def spy(chunks):
        ids, meta = prepare(chunks)
        steps.append(
            (
                [c.block_ids for c in chunks],
                [c.first_position for c in chunks],
                [c.num_tokens for c in chunks],
                meta,
            )
        )
        return ids, meta

    llm.model_runner.prepare_inputs = spy
    with torch.device("cpu"):
        llm.generate(batch_prompts(), SP)
    assert len(steps) >= 4 and any(len(s[0]) > 1 for s in steps)
    return llm, steps


def rows(meta):
    """(row, request, position) of every packed token of a step."""
    return [
        (t, int(r), int(p))
        for t, (r, p) in enumerate(zip(meta.token_to_req_indices, meta.positions))
    ]


def block_size_of(llm, group: int) -> int:
    return llm.model_runner.kv_cache.config.kv_cache_groups[group].kv_cache_spec.block_size


def table(meta, group: int, req: int) -> list[int]:
    return meta.block_tables[group][req].tolist()


def test_written_rows_follow_part_two(recorded):
    llm, steps = recorded
    checked = 0
    for _, _, _, meta in steps:
        for t, r, p in rows(meta):
            for g, slots in meta.slot_mappings.items():
                assert int(slots[t]) == slot_for_position(
                    table(meta, g, r), p, block_size_of(llm, g)
                )
                checked += 1
            for (g, ratio), slots in meta.entry_slot_mappings.items():
                assert int(slots[t]) == compressed_slot_for_position(
                    table(meta, g, r), p, block_size_of(llm, g), ratio
                )
    assert checked > 300


def test_windows_follow_part_two(recorded):
    llm, steps = recorded
    kinds = {key for _, _, _, meta in steps for key in meta.windows}
    # the sliding window (16) and the two compressor-state windows (8, 128)
    assert len({w for _, w in kinds}) == 3
    for _, _, _, meta in steps:
        for (g, window), (slots, lens) in meta.windows.items():
            for t, r, p in rows(meta):
                want = [
                    slot_for_position(table(meta, g, r), q, block_size_of(llm, g))
                    for q in swa_window_positions(p, window)
                ]
                # a window never reaches a block the allocator already freed
                assert -1 not in want
                assert slots[t].tolist() == want + [-1] * (window - len(want)) and int(
                    lens[t]
                ) == len(want)


def test_compressed_entries_each_token_may_read_follow_part_two(recorded):
    llm, steps = recorded
    for _, _, _, meta in steps:
        for (g, ratio), slots in meta.entry_slots.items():
            per_block = block_size_of(llm, g) // ratio
            for t, r, p in rows(meta):
                want = [
                    slot_for_position(table(meta, g, r), e, per_block)
                    for e in range(causal_compressed_entries(p, ratio))
                ]
                assert slots[t].tolist() == want + [-1] * (slots.shape[1] - len(want))


@pytest.mark.parametrize("kernel", IMPLS)
def test_indexer_picks_become_part_two_slots(recorded, kernel_device, kernel):
    llm, steps = recorded
    attn = llm.model_runner.kv_cache.layers[1].attn  # layer 1 is CSA
    ops = v4_index_ops(kernel, kernel_device)
    checked = 0
    for _, _, _, meta in steps:
        picks = meta.topk_indices[1]
        args = (picks, meta.token_to_req_indices, meta.block_tables[attn.group])
        got, lens = ops.compute_global_topk_indices_and_lens(
            *(a.to(kernel_device) for a in args),
            attn.entries_per_block,
            meta.is_valid_token.to(kernel_device),
        )
        got, lens = got.cpu(), lens.cpu()
        for t, r, p in rows(meta):
            chosen = [int(e) for e in picks[t] if e >= 0]
            # only complete entries
            assert all(e < causal_compressed_entries(p, 4) for e in chosen)
            want = [
                slot_for_position(table(meta, attn.group, r), e, attn.entries_per_block)
                for e in chosen
            ]
            assert got[t, : lens[t]].tolist() == want
            checked += len(chosen)
    assert checked > 50


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
def test_triton_kernels_build_the_same_metadata(recorded, interpreter):
    llm, steps = recorded
    ops = v4_index_ops("triton", "cpu")
    for block_ids, computed, new, meta in steps:
        with torch.device("cpu"):
            again = build_attention_metadata(
                llm.model_runner.kv_cache, block_ids, computed, new, ops
            )
        for name in ("slot_mappings", "entry_slot_mappings", "entry_slots"):
            mine, theirs = getattr(again, name), getattr(meta, name)
            assert mine.keys() == theirs.keys() and all(
                torch.equal(mine[k].long(), theirs[k].long()) for k in mine
            )
        assert again.windows.keys() == meta.windows.keys()
        for key, (slots, lens) in again.windows.items():
            assert torch.equal(slots, meta.windows[key][0]) and torch.equal(
                lens, meta.windows[key][1]
            )


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
def test_engine_on_the_triton_backend_generates_the_same_tokens(interpreter):
    torch_engine, triton_engine = (
        make_llm(index_kernel_backend="torch"),
        make_llm(index_kernel_backend="triton"),
    )
    assert (torch_engine.index_kernel_backend, triton_engine.index_kernel_backend) == (
        "torch",
        "triton",
    )
    with torch.device("cpu"):
        assert triton_engine.generate(batch_prompts(), SP) == torch_engine.generate(
            batch_prompts(), SP
        )


def test_flash_attn_has_no_v4_index_kernels():
    with pytest.raises(ValueError, match="flash-attn has no DeepSeek V4 index kernels"):
        make_llm(index_kernel_backend="flash-attn")
