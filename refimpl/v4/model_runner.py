"""ModelRunner: execute one `SchedulerOutput` of `refimpl.sched.Scheduler`: turn the step's
scheduled requests into tensors and addresses, run the model, sample.

As vLLM's V1 model runner does, it keeps its own state per request (`CachedRequestState`:
token ids, block table per group) and updates it from each output (`update_states`): a new
request brings its prompt and whole block table, a running one only its newly allocated block
ids, a resumed one (after preemption) a fresh block table and all its token ids, and a
finished request is forgotten when its id comes back in the next step's `finished_req_ids`.

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import torch

from refimpl.engine.sampler import Sampler
from refimpl.hybrid.addressing import (
    BatchInputs,
    build_batch,
    short_context_topk_indices,
    slot_mapping,
)
from refimpl.kernels.backend import V4IndexOps, v4_index_ops
from refimpl.sched.output import ModelRunnerOutput, SchedulerOutput
from refimpl.v4.attention import AttentionMetadata
from refimpl.v4.cache import CacheRef, V4KVCache, build_kv_cache
from refimpl.v4.model import forward_step


@dataclass
class CachedRequestState:
    """What the runner keeps of a request between steps (vLLM's `CachedRequestState`)."""

    req_id: str
    num_prompt_tokens: int
    token_ids: list[int]  # prompt, then every sampled token
    block_ids: tuple[list[int], ...]  # block table per cache group
    temperature: float


@dataclass
class ScheduledChunk:
    """One request's share of a step: `num_tokens` tokens from position `first_position` on."""

    state: CachedRequestState
    num_tokens: int
    # tokens of the request already in the cache (computed or a prefix hit)
    first_position: int
    # whether the chunk reaches the request's last token, so the step samples its next one
    samples: bool
    num_cached_tokens: int = 0  # prefix-cache hit adopted when this step admitted the request

    @property
    def block_ids(self) -> tuple[list[int], ...]:
        """The request's block table per cache group at this step (a copy)."""
        return tuple(list(table) for table in self.state.block_ids)

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt tokens among the chunk's tokens (the rest are generated ones, recomputed
        after a preemption or decoded)."""
        end = min(self.state.num_prompt_tokens, self.first_position + self.num_tokens)
        return max(0, end - self.first_position)


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
        self.requests: dict[str, CachedRequestState] = {}
        # the latest step's addresses, for inspection
        self.last_metadata: AttentionMetadata | None = None

    def update_states(
        self, scheduler_output: SchedulerOutput, temperatures: Mapping[str, float]
    ) -> list[ScheduledChunk]:
        """Bring the per-request state up to date with one step's output (vLLM's
        `_update_states`) and return the step's chunks, in the scheduler's order.
        `temperatures` gives the sampling temperature of each new request."""
        for rid in scheduler_output.finished_req_ids:
            self.requests.pop(rid, None)
        first: dict[str, int] = {}
        cached_tokens: dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            self.requests[new.req_id] = CachedRequestState(
                new.req_id,
                len(new.prompt_token_ids),
                list(new.prompt_token_ids),
                tuple(list(g) for g in new.block_ids),
                float(temperatures[new.req_id]),
            )
            first[new.req_id] = cached_tokens[new.req_id] = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            state = self.requests[rid]
            if rid in cached.all_token_ids:  # did not run last step: take the scheduler's copy
                state.token_ids = list(cached.all_token_ids[rid])
            new_ids = cached.new_block_ids[i]
            if rid in cached.resumed_req_ids:  # back from preemption: a fresh block table
                state.block_ids = tuple(list(g) for g in new_ids)
                cached_tokens[rid] = cached.num_computed_tokens[i]
            elif new_ids is not None:
                for table, ids in zip(state.block_ids, new_ids, strict=True):
                    table.extend(ids)
            first[rid] = cached.num_computed_tokens[i]
        chunks = []
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            state = self.requests[rid]
            samples = first[rid] + n == len(state.token_ids)
            chunks.append(
                ScheduledChunk(state, n, first[rid], samples, cached_tokens.get(rid, 0))
            )
        return chunks

    def prepare_inputs(
        self, chunks: list[ScheduledChunk]
    ) -> tuple[torch.Tensor, AttentionMetadata]:
        """Packed input ids and the step's `AttentionMetadata`."""
        ids: list[int] = []
        for c in chunks:
            ids.extend(c.state.token_ids[c.first_position : c.first_position + c.num_tokens])
        meta = build_attention_metadata(
            self.kv_cache,
            [c.block_ids for c in chunks],
            [c.first_position for c in chunks],
            [c.num_tokens for c in chunks],
            self.index_ops,
        )
        return torch.tensor(ids, dtype=torch.long, device=self.device), meta

    @torch.no_grad()
    def execute_model(
        self, scheduler_output: SchedulerOutput, temperatures: Mapping[str, float]
    ) -> tuple[ModelRunnerOutput, list[ScheduledChunk], torch.Tensor]:
        """Run one step: the sampled tokens per request (`ModelRunnerOutput`, an empty list for
        a prefill chunk short of the prompt's end), the step's chunks, and the logits behind
        the sampled tokens (one row each, in chunk order)."""
        chunks = self.update_states(scheduler_output, temperatures)
        req_ids = [c.state.req_id for c in chunks]
        sampled: list[list[int]] = [[] for _ in chunks]
        vocab = self.hf_model.config.vocab_size
        logits = torch.empty((0, vocab), device=self.device)
        sampling = [i for i, c in enumerate(chunks) if c.samples]
        if chunks:
            input_ids, meta = self.prepare_inputs(chunks)
            hidden = forward_step(self.hf_model, input_ids, meta, self.kv_cache.layers)
            self.last_metadata = meta
            if sampling:
                sizes = torch.tensor([c.num_tokens for c in chunks], device=hidden.device)
                ends = torch.cumsum(sizes, 0) - 1
                logits = self.hf_model.lm_head(hidden[ends[sampling]])
                temps = torch.tensor(
                    [chunks[i].state.temperature for i in sampling],
                    dtype=torch.float32,
                    device=logits.device,
                )
                for i, token in zip(sampling, self.sampler(logits, temps).tolist()):
                    sampled[i] = [token]
                    chunks[i].state.token_ids.append(token)
        output = ModelRunnerOutput(req_ids, {rid: i for i, rid in enumerate(req_ids)}, sampled)
        return output, chunks, logits

    def close(self) -> None:
        """Drop the cache slab (its memory goes back once nothing else holds a view)."""
        self.kv_cache = None
        self.last_metadata = None
        self.requests = {}
