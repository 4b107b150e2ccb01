"""DeepSeek V4 attention on the paged hybrid cache: sliding window + compressor + indexer.

One call runs one decoder layer's attention for a packed batch of token chunks from several
requests. Every value the layer keeps between steps goes into a cache view through a slot
mapping (see `refimpl.v4.paged`) and every value it reads back comes out of one:

1. the token's normalised, RoPE'd kv row goes into the sliding-window (`swa`) cache;
2. each token writes a compressor-state row `[kv | score + position_bias[p % r]]`;
3. a token that closes a window ((p + 1) % r == 0) reads the last 2r (ratio 4) or r (ratio 128)
   state rows back and writes compressed entry p // r = RoPE(norm(sum softmax(score) * kv));
4. ratio-4 layers run the Lightning Indexer (its own compressor at the indexer head dim,
   then a stable top-k over the entries the query may see);
5. attention over the window's kv rows plus the visible compressed entries, with a per-head
   sink logit, then the inverse rotation of the output's RoPE slice.

The weights are transformers' (`DeepseekV4Attention` and its compressor modules); only the
projections and norms are called, token by token. The cache logic is this module's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from refimpl.v4.paged import CacheRef, read_rows, slots, write_rows
from refimpl.v4.specs import state_window
from refimpl.v4.topk import stable_topk


@dataclass
class SeqChunk:
    """The tokens of one request in this step: rows start..start+num_tokens of the batch."""

    start: int
    num_tokens: int
    first_position: int  # tokens of this request already in the cache
    block_tables: tuple[list[int], ...]  # one block table per cache group

    @property
    def end_position(self) -> int:
        return self.first_position + self.num_tokens


@dataclass
class StepContext:
    """What every layer needs to address the cache for one packed step."""

    positions: torch.Tensor  # (T,) position of every row
    chunks: list[SeqChunk]
    rope: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # "main"/"compress": (T, rope/2)
    topk_indices: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # layer -> per chunk (t, k)


@dataclass(frozen=True)
class LayerCaches:
    """The cache views of one decoder layer (None where the layer has no such cache)."""

    ratio: int  # 0 = sliding only, 4 = CSA, 128 = HCA
    swa: CacheRef
    attn: CacheRef | None = None
    attn_state: CacheRef | None = None
    idx: CacheRef | None = None
    idx_state: CacheRef | None = None


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """Interleaved RoPE's partner: (x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the trailing rope slice of x (..., T, [heads,] dim); cos/sin are (T, rope/2)."""
    cos = cos.repeat_interleave(2, dim=-1)
    sin = sin.repeat_interleave(2, dim=-1)
    if x.dim() == 3:  # (T, heads, dim): broadcast over heads
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rope_dim = cos.shape[-1]
    nope, rope = x[..., :-rope_dim], x[..., -rope_dim:]
    rotated = (rope.float() * cos) + (rotate_pairs(rope).float() * sin)
    return torch.cat([nope, rotated.to(x.dtype)], dim=-1)


def compress_windows(rows: torch.Tensor, ratio: int, dim: int, have_previous: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split state rows read back by closing tokens into (kv, score), each (n, window, dim).

    Ratio 128: rows are (n, 128, 2·dim) = [kv | score]. Ratio 4: rows are (n, 8, 4·dim) =
    [kv_a | kv_b | score_a | score_b]; the previous window's first series (a) and this window's
    second series (b) make one overlapping window of 8. Without a previous window (entry 0)
    its half weighs nothing: kv 0, score -inf.
    """
    if ratio != 4:
        return rows[..., :dim].contiguous(), rows[..., dim:].contiguous()
    kv = torch.cat([rows[:, :ratio, :dim], rows[:, ratio:, dim : 2 * dim]], dim=1)
    score = torch.cat([rows[:, :ratio, 2 * dim : 3 * dim], rows[:, ratio:, 3 * dim :]], dim=1)
    missing = ~have_previous
    kv[missing, :ratio] = 0.0
    score[missing, :ratio] = float("-inf")
    return kv, score


def run_compressor(module, x: torch.Tensor, ctx: StepContext, state: CacheRef, entries: CacheRef,
                   ratio: int, rotary) -> None:
    """Write every token's state row, then every closing token's compressed entry.

    `module` is transformers' compressor (or indexer) holding kv_proj, gate_proj,
    position_bias and kv_norm; `rotary` makes the "compress" RoPE for the entry positions.
    """
    positions = ctx.positions
    kv = module.kv_proj(x)
    score = module.gate_proj(x) + module.position_bias[positions % ratio]
    rows = torch.cat([kv, score], dim=-1)
    dim = module.kv_norm.weight.shape[0]
    window = state_window(ratio)
    closing_slots, closing_pos = [], []
    for chunk in ctx.chunks:
        pos = positions[chunk.start : chunk.start + chunk.num_tokens]
        write_rows(state, slots(state, chunk.block_tables[state.group], pos), rows[chunk.start : chunk.start + chunk.num_tokens])
        closing = pos[(pos + 1) % ratio == 0]
        if len(closing):
            offsets = torch.arange(-window + 1, 1)
            read_pos = (closing[:, None] + offsets[None, :]).clamp(min=0)
            closing_slots.append((chunk, read_pos))
            closing_pos.append(closing)
    if not closing_pos:
        return
    for (chunk, read_pos), closing in zip(closing_slots, closing_pos):
        table = chunk.block_tables[state.group]
        state_rows = read_rows(state, slots(state, table, read_pos.flatten())).view(*read_pos.shape, -1)
        kv_w, score_w = compress_windows(state_rows, ratio, dim, closing >= window - 1)
        pooled = (kv_w * score_w.softmax(dim=1, dtype=torch.float32)).sum(dim=1)
        pooled = module.kv_norm(pooled)
        entry_ids = closing // ratio
        cos, sin = rotary(pooled, position_ids=(entry_ids * ratio)[None], layer_type="compress")
        pooled = apply_rope(pooled, cos[0], sin[0])
        write_rows(entries, slots(entries, chunk.block_tables[entries.group], entry_ids), pooled)


def indexer_topk(indexer, x: torch.Tensor, q_residual: torch.Tensor, ctx: StepContext, caches: LayerCaches,
                 rotary) -> list[torch.Tensor]:
    """Per chunk, (t, k) indices of the compressed entries each query attends to (-1 = none).

    Scores = sum over indexer heads of w_h · ReLU(q_h · k_s) / sqrt(head_dim), only over entries
    s < (p + 1) // 4 (windows closed by the query's own token or earlier); the stable top-k keeps
    the index_topk best, ties to the lowest s.
    """
    run_compressor(indexer, x, ctx, caches.idx_state, caches.idx, 4, rotary)
    t_all = x.shape[0]
    cos, sin = ctx.rope["compress"]
    q = indexer.q_b_proj(q_residual).view(t_all, -1, indexer.head_dim)
    q = apply_rope(q, cos, sin)
    weights = indexer.scorer.weights_proj(x).float() * indexer.scorer.weights_scaling  # (T, heads)
    picks = []
    for chunk in ctx.chunks:
        rows = slice(chunk.start, chunk.start + chunk.num_tokens)
        num_entries = chunk.end_position // 4
        pos = ctx.positions[rows]
        if num_entries == 0:
            picks.append(torch.full((chunk.num_tokens, 0), -1, dtype=torch.long))
            continue
        keys = read_rows(caches.idx, slots(caches.idx, chunk.block_tables[caches.idx.group], torch.arange(num_entries)))
        scores = torch.matmul(q[rows].float(), keys.float().T)  # (t, heads, entries)
        scores = torch.relu(scores) * indexer.scorer.softmax_scale
        scores = (scores * weights[rows].unsqueeze(-1)).sum(dim=1)  # (t, entries)
        visible = (pos + 1) // 4
        scores = scores.masked_fill(torch.arange(num_entries)[None, :] >= visible[:, None], float("-inf"))
        top = stable_topk(scores, min(indexer.index_topk, num_entries))
        picks.append(torch.where(top >= visible[:, None], torch.full_like(top, -1), top))
    return picks


def paged_attention(attn, x: torch.Tensor, ctx: StepContext, caches: LayerCaches, layer: int) -> torch.Tensor:
    """One decoder layer's attention for the packed rows `x` (T, hidden); returns (T, hidden)."""
    t_all = x.shape[0]
    cos, sin = ctx.rope[attn.rope_layer_type]
    q_residual = attn.q_a_norm(attn.q_a_proj(x))
    q = attn.q_b_proj(q_residual).view(t_all, -1, attn.head_dim)
    q = apply_rope(attn.q_b_norm(q), cos, sin)  # (T, heads, dim)
    kv = apply_rope(attn.kv_norm(attn.kv_proj(x)), cos, sin)  # (T, dim): key = value
    for chunk in ctx.chunks:
        pos = ctx.positions[chunk.start : chunk.start + chunk.num_tokens]
        write_rows(caches.swa, slots(caches.swa, chunk.block_tables[caches.swa.group], pos), kv[chunk.start : chunk.start + chunk.num_tokens])

    picks = None
    if caches.ratio:
        comp = attn.compressor
        run_compressor(comp, x, ctx, caches.attn_state, caches.attn, caches.ratio, comp.rotary_emb)
        if caches.ratio == 4:
            picks = indexer_topk(comp.indexer, x, q_residual, ctx, caches, comp.indexer.rotary_emb)
            ctx.topk_indices[layer] = picks

    window = attn.sliding_window
    out = torch.empty_like(q)
    for i, chunk in enumerate(ctx.chunks):
        rows = slice(chunk.start, chunk.start + chunk.num_tokens)
        pos = ctx.positions[rows]
        key_pos = torch.arange(max(0, chunk.first_position - window + 1), chunk.end_position)
        keys = read_rows(caches.swa, slots(caches.swa, chunk.block_tables[caches.swa.group], key_pos))
        allowed = (key_pos[None, :] <= pos[:, None]) & (key_pos[None, :] > pos[:, None] - window)
        if caches.ratio:
            if picks is None:  # HCA: every closed window
                entry_ids = torch.arange(chunk.end_position // caches.ratio)
                seen = entry_ids[None, :] < ((pos + 1) // caches.ratio)[:, None]
            else:  # CSA: only the entries the indexer picked for some query of the chunk
                chosen = picks[i]
                entry_ids = torch.unique(chosen[chosen >= 0])
                seen = (chosen[:, :, None] == entry_ids[None, None, :]).any(dim=1)
            entries = read_rows(caches.attn, slots(caches.attn, chunk.block_tables[caches.attn.group], entry_ids))
            keys = torch.cat([keys, entries], dim=0)
            allowed = torch.cat([allowed, seen], dim=1)
        logits = torch.matmul(q[rows].transpose(0, 1), keys.T) * attn.scaling  # (heads, t, keys)
        logits = logits.masked_fill(~allowed[None], float("-inf"))
        sinks = attn.sinks.reshape(-1, 1, 1).expand(-1, chunk.num_tokens, 1)
        logits = torch.cat([logits, sinks], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        probs = torch.softmax(logits, dim=-1)[..., :-1]
        out[rows] = torch.matmul(probs, keys).transpose(0, 1)
    out = apply_rope(out, cos, -sin)  # undo the rotation the values carried
    grouped = out.reshape(1, t_all, attn.config.o_groups, -1)
    return attn.o_b_proj(attn.o_a_proj(grouped).flatten(2))[0]
