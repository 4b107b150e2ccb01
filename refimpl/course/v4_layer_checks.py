"""Layer-level checks against transformers: same inputs, then compare the cache rows.

`capture_layer_inputs` runs transformers' model once over a prompt (with its own cache) and
keeps what each attention layer received. `run_layer_paged` feeds one layer's input through
this package's paged attention in any chunking, on a fresh slab, with the same addresses the
engine's model runner builds. `transformers_rows` and `paged_rows` put both caches in one
comparable form: the sliding-window rows transformers keeps, every compressed entry, and the
compressor rows of the unfinished window.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from refimpl.kernels.backend import V4IndexOps, v4_index_ops
from refimpl.v4.attention import paged_attention, rope_tables
from refimpl.v4.cache import V4KVCache, build_kv_cache, read_rows, row_slots
from refimpl.v4.model_runner import build_attention_metadata
from refimpl.v4.oracle import oracle_prefill


@torch.no_grad()
def capture_layer_inputs(hf_model, prompt_ids: Sequence[int]):
    """(inputs, cache, outputs): per layer the (S, hidden) attention input and (S, hidden)
    output, plus transformers' DynamicCache after one cached forward over the prompt."""
    inputs, outputs, hooks = {}, {}, []
    for i, layer in enumerate(hf_model.model.layers):

        def pre(module, args, kwargs, i=i):
            hidden = args[0] if args else kwargs["hidden_states"]
            inputs[i] = hidden[0].clone()

        def post(module, args, kwargs, out, i=i):
            outputs[i] = out[0][0].clone()

        hooks.append(layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True))
        hooks.append(layer.self_attn.register_forward_hook(post, with_kwargs=True))
    try:
        _, cache = oracle_prefill(hf_model, list(prompt_ids))
    finally:
        for h in hooks:
            h.remove()
    return inputs, cache, outputs


def identity_tables(kv: V4KVCache, num_tokens: int) -> tuple[list[int], ...]:
    """Block tables for one request alone in the pool: consecutive block ids, group after
    group.

    All groups draw from one pool and block b of every group is the same stretch of the slab,
    so two groups must never be handed the same block id (that is the allocator's job).
    """
    tables, next_id = [], 1
    for group in kv.config.kv_cache_groups:
        count = 1 + num_tokens // group.kv_cache_spec.block_size
        tables.append(list(range(next_id, next_id + count)))
        next_id += count
    return tuple(tables)


def kv_device(hf_model) -> torch.device:
    """Where the model's weights are, so its cache goes there too (as the engine does)."""
    return next(hf_model.parameters()).device


@torch.no_grad()
def run_layer_paged(
    hf_model,
    layer: int,
    x: torch.Tensor,
    chunk_sizes: Sequence[int],
    kv: V4KVCache | None = None,
    ops: V4IndexOps | None = None,
) -> tuple[torch.Tensor, V4KVCache]:
    """Run layer `layer`'s paged attention over x (S, hidden) in the given chunks on a fresh
    slab.

    Addresses come from `build_attention_metadata` (index kernels of `ops`, default the torch
    twins) and rotary tables from the model's own rotary module, as in the engine.
    """
    num_tokens = x.shape[0]
    if sum(chunk_sizes) != num_tokens:
        raise ValueError(
            f"chunk sizes {list(chunk_sizes)} do not add up to {num_tokens} tokens"
        )
    if kv is None:
        num_blocks = 2 + sum(
            1 + num_tokens // g.kv_cache_spec.block_size
            for g in build_kv_cache(hf_model.config, 2).config.kv_cache_groups
        )
        kv = build_kv_cache(hf_model.config, num_blocks, device=kv_device(hf_model))
    ops = ops or v4_index_ops(None, kv.device)
    tables = identity_tables(kv, num_tokens)
    attn = hf_model.model.layers[layer].self_attn
    outs, start = [], 0
    for n in chunk_sizes:
        meta = build_attention_metadata(kv, [tables], [start], [n], ops)
        meta.rope = rope_tables(hf_model.model.rotary_emb, x, meta.positions)
        outs.append(paged_attention(attn, x[start : start + n], meta, kv.layers[layer], layer))
        start += n
    return torch.cat(outs), kv


def transformers_rows(
    cache, layer: int, ratio: int, num_tokens: int, position_bias: dict
) -> dict[str, torch.Tensor]:
    """transformers' cache fields for one layer, in the form `paged_rows` returns."""
    lay = cache.layers[layer]
    rows = {"swa": lay.keys[0, 0]}
    if ratio:
        names = ["compressor"] + (["indexer"] if ratio == 4 else [])
        for name in names:
            rows[f"{name}.entries"] = lay.compressed_kv[name][0]
            left = lay.buffer_kv[name][0]
            first = num_tokens - left.shape[0]
            bias = position_bias[name][torch.arange(first, num_tokens) % ratio]
            rows[f"{name}.buffer"] = torch.cat([left, lay.buffer_gate[name][0] + bias], dim=-1)
            if ratio == 4 and lay.overlap_kv[name] is not None:
                rows[f"{name}.overlap"] = torch.cat(
                    [lay.overlap_kv[name][0], lay.overlap_gate[name][0]], dim=-1
                )
    return rows


def paged_rows(
    kv: V4KVCache, layer: int, ratio: int, num_tokens: int, window: int, head_dims: dict
) -> dict[str, torch.Tensor]:
    """This package's cache rows for one request laid out by `identity_tables`."""
    tables = identity_tables(kv, num_tokens)
    caches = kv.layers[layer]

    def rows_at(ref, index):
        return read_rows(ref, row_slots(ref, tables[ref.group], index))

    out = {"swa": rows_at(caches.swa, range(max(0, num_tokens - window + 1), num_tokens))}
    if ratio:
        pairs = [("compressor", caches.attn, caches.attn_state)]
        if ratio == 4:
            pairs.append(("indexer", caches.idx, caches.idx_state))
        for name, entries, state in pairs:
            n = num_tokens // ratio
            out[f"{name}.entries"] = rows_at(entries, range(n))
            out[f"{name}.buffer"] = rows_at(state, range(n * ratio, num_tokens))
            if ratio == 4 and n:
                d = head_dims[name]
                last = rows_at(state, range((n - 1) * ratio, n * ratio))
                out[f"{name}.overlap"] = torch.cat(
                    [last[:, :d], last[:, 2 * d : 3 * d]], dim=-1
                )
    return out
