"""ModelRunner: turn a step's scheduled chunks into tensors and addresses, run the model,
sample.

It owns the cache (the slab Part II planned, see `refimpl.v4.cache`). For each step
`build_attention_metadata` packs the chunks with Part II's `build_batch` (one block table per
cache group) and computes every address once, for all layers:

- the row each token writes in a per-token cache: Part II's `slot_mapping`;
- the entry a window-closing token writes in a compressed cache: `compressed_slot_mapping`;
- the slots of each token's sliding window, over the window cache and over the compressor
  state cache: `compute_swa_indices_and_lens`;
- the slots of every compressed entry a token may read (ratio-128 attention, the indexer's
  keys): entries 0 .. n - 1 (`short_context_topk_indices`) through
  `compute_global_topk_indices_and_lens`.

The three kernels come from the backend named by `index_kernel_backend`
(`kernels.backend.v4_index_ops`): the torch twins on a CPU by default, the Triton kernels when
asked for (Triton's interpreter on a CPU). Only these index kernels switch: the attention
itself is always the torch code of `refimpl.v4.attention`, which uses the addresses as they
are. The cache, the addresses and the sampler live on the model's device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

import torch

from refimpl.engine.sampler import Sampler
from refimpl.hybrid.addressing import (
    BatchInputs,
    build_batch,
    short_context_topk_indices,
    slot_mapping,
)
from refimpl.kernels.backend import V4IndexOps, v4_index_ops
from refimpl.v4.attention import AttentionMetadata
from refimpl.v4.cache import CacheRef, V4KVCache, build_kv_cache
from refimpl.v4.model import forward_step
from refimpl.v4.scheduler import ScheduledChunk


def complete_entry_slots(batch: BatchInputs, ref: CacheRef, ops: V4IndexOps) -> torch.Tensor:
    """(T, K) slots of every entry of compressed cache `ref` that each token may read, -1
    padded: entries 0 .. (p + 1) // ratio - 1 as "top-k" indices, turned into slots by the
    top-k kernel."""
    visible = (batch.positions + 1) // ref.ratio
    width = int(visible.max()) if visible.numel() else 0
    local = short_context_topk_indices(batch.positions, ref.ratio, width).to(
        batch.positions.device
    )
    slots, _ = ops.compute_global_topk_indices_and_lens(
        local,
        batch.token_to_req_indices,
        batch.block_table,
        ref.entries_per_block,
        batch.is_valid_token,
    )
    return slots


def on_device(batch: BatchInputs, device: torch.device) -> BatchInputs:
    """The batch's tensors on `device` (Part II builds them on the CPU)."""
    return BatchInputs(**{f.name: getattr(batch, f.name).to(device) for f in fields(batch)})


def build_attention_metadata(
    kv_cache: V4KVCache,
    block_ids: Sequence[tuple[list[int], ...]],
    num_computed_tokens: Sequence[int],
    num_new_tokens: Sequence[int],
    ops: V4IndexOps,
) -> AttentionMetadata:
    """Every address one step needs: request r computes `num_new_tokens[r]` tokens after
    `num_computed_tokens[r]`, with block table `block_ids[r][g]` in group g."""
    num_groups = len(kv_cache.config.kv_cache_groups)
    batches = [
        on_device(
            build_batch([ids[g] for ids in block_ids], num_computed_tokens, num_new_tokens),
            kv_cache.device,
        )
        for g in range(num_groups)
    ]
    first = batches[0]
    meta = AttentionMetadata(
        first.positions,
        first.token_to_req_indices,
        first.is_valid_token,
        {g: b.block_table for g, b in enumerate(batches)},
        ops,
    )
    for ref in kv_cache.refs():
        b = batches[ref.group]
        # window or compressor state: one row per token, read back over a window
        if ref.ratio == 1:
            if ref.group not in meta.slot_mappings:
                meta.slot_mappings[ref.group] = slot_mapping(b, ref.block_size)
            if (ref.group, ref.window) not in meta.windows:
                meta.windows[(ref.group, ref.window)] = ops.compute_swa_indices_and_lens(
                    b.query_start_loc,
                    b.seq_lens,
                    b.token_to_req_indices,
                    b.is_valid_token,
                    b.block_table,
                    ref.block_size,
                    ref.window,
                )
        # compressed: one entry per `ratio` tokens
        elif (ref.group, ref.ratio) not in meta.entry_slot_mappings:
            meta.entry_slot_mappings[(ref.group, ref.ratio)] = ops.compressed_slot_mapping(
                b.query_start_loc, b.seq_lens, b.block_table, ref.entries_per_block, ref.ratio
            )
            meta.entry_slots[(ref.group, ref.ratio)] = complete_entry_slots(b, ref, ops)
    return meta


class ModelRunner:
    """The tiny V4's cache, its step inputs and its sampler (Part I's `ModelRunner` for Part
    III)."""

    def __init__(
        self,
        hf_model,
        num_kvcache_blocks: int,
        kvcache_block_size: int = 256,
        index_kernel_backend: str | None = None,
        seed: int = 0,
    ) -> None:
        self.hf_model = hf_model
        self.device = next(hf_model.parameters()).device
        self.index_ops = v4_index_ops(index_kernel_backend, self.device)
        self.index_kernel_backend = self.index_ops.name
        self.kv_cache: V4KVCache | None = build_kv_cache(
            hf_model.config, num_kvcache_blocks, kvcache_block_size, self.device
        )
        self.sampler = Sampler(seed, self.device)
        # the latest step's addresses, for inspection
        self.last_metadata: AttentionMetadata | None = None

    def prepare_inputs(
        self, chunks: list[ScheduledChunk]
    ) -> tuple[torch.Tensor, AttentionMetadata]:
        """Packed input ids and the step's `AttentionMetadata`."""
        ids: list[int] = []
        for c in chunks:
            ids.extend(
                c.req.request.all_token_ids[c.first_position : c.first_position + c.num_tokens]
            )
        meta = build_attention_metadata(
            self.kv_cache,
            [c.block_ids for c in chunks],
            [c.first_position for c in chunks],
            [c.num_tokens for c in chunks],
            self.index_ops,
        )
        return torch.tensor(ids, dtype=torch.long, device=self.device), meta

    @torch.no_grad()
    def run(self, chunks: list[ScheduledChunk]) -> tuple[list[int], torch.Tensor]:
        """Run one step; return the sampled token of every chunk that `samples` (in chunk
        order) and the logits (one row per sampled token) behind them."""
        input_ids, meta = self.prepare_inputs(chunks)
        hidden = forward_step(self.hf_model, input_ids, meta, self.kv_cache.layers)
        self.last_metadata = meta
        sizes = torch.tensor([c.num_tokens for c in chunks], device=hidden.device)
        ends = torch.cumsum(sizes, 0) - 1
        sampling = [i for i, c in enumerate(chunks) if c.samples]
        if not sampling:
            return [], hidden.new_empty((0, self.hf_model.config.vocab_size))
        logits = self.hf_model.lm_head(hidden[ends[sampling]])
        temperatures = torch.tensor(
            [chunks[i].req.sampling_params.temperature for i in sampling],
            dtype=torch.float32,
            device=logits.device,
        )
        return self.sampler(logits, temperatures).tolist(), logits

    def close(self) -> None:
        """Drop the cache slab (its memory goes back once nothing else holds a view)."""
        self.kv_cache = None
        self.last_metadata = None
