"""DeepSeek V4 attention on the paged hybrid cache: sliding window + compressor + indexer.

One call runs one decoder layer's attention for a packed batch of token chunks from several
requests. The layer computes no address itself: every slot it writes or reads comes from the
step's `AttentionMetadata`, which the model runner builds once per step with Part II's
addressing (`hybrid.addressing.slot_mapping`) and the DeepSeek V4 index kernels of chapter 11
(`compressed_slot_mapping`, `compute_swa_indices_and_lens`,
`compute_global_topk_indices_and_lens`):

1. the token's normalised, RoPE'd kv row goes into the sliding-window (`swa`) cache;
2. each token writes a compressor-state row `[kv | score + position_bias[p % r]]`;
3. a token that closes a window ((p + 1) % r == 0, the tokens `compressed_slot_mapping` gives a
   slot) reads the last 2r (ratio 4) or r (ratio 128) state rows back (a sliding window over
   the state cache) and writes compressed entry p // r = RoPE(norm(sum softmax(score) * kv));
4. ratio-4 layers run the Lightning Indexer (its own compressor at the indexer head dim, then a
   stable top-k over the entries the query may see); the top-k kernel turns its picks into
   slots;
5. attention over the window's kv rows plus the visible compressed entries, with a per-head
   sink logit, then the inverse rotation of the output's RoPE slice.

The weights are transformers' (`DeepseekV4Attention` and its compressor modules); only the
projections and norms are called. The cache logic is this module's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from refimpl.kernels.backend import V4IndexOps
from refimpl.v4.cache import CacheRef, LayerCaches, read_rows, write_rows
from refimpl.v4.topk import stable_topk


@dataclass
class AttentionMetadata:
    """One step's addresses, shared by every layer (vLLM builds the same per step and group).

    Rows are the packed tokens of the step (T of them). Keys: `group` is a cache group's index,
    `window` a sliding window in tokens, `ratio` a compress ratio.
    """

    positions: torch.Tensor  # (T,) position of every row in its request
    token_to_req_indices: torch.Tensor  # (T,) int32
    is_valid_token: torch.Tensor  # (T,) bool
    block_tables: dict[int, torch.Tensor]  # group -> [num_reqs, max_blocks] int32
    index_ops: V4IndexOps  # the index kernels of the chosen backend, for the indexer's picks
    # group -> (T,) row each token writes
    slot_mappings: dict[int, torch.Tensor] = field(default_factory=dict)
    windows: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict
    )
    # (group, window) -> slots (T, window) of each token's window, oldest first, -1 padded;
    # lengths (T,)
    entry_slot_mappings: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    # (group, ratio) -> (T,) slot of the entry a token writes; -1 for tokens that close no
    # window
    entry_slots: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    #   (group, ratio) -> (T, K) slots of every complete entry a token may read, -1 padded
    # "main"/"compress": (T, rope/2)
    rope: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    # layer -> (T, k) entries the indexer picked
    topk_indices: dict[int, torch.Tensor] = field(default_factory=dict)

    def writes(self, ref: CacheRef) -> torch.Tensor:
        """(T,) slot each row writes in `ref` (-1: none)."""
        if ref.ratio == 1:
            return self.slot_mappings[ref.group]
        return self.entry_slot_mappings[(ref.group, ref.ratio)]

    def window(self, ref: CacheRef) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots (T, window) and lengths (T,) of each row's sliding window over the per-token
        cache `ref`."""
        return self.windows[(ref.group, ref.window)]

    def complete_entries(self, ref: CacheRef) -> torch.Tensor:
        """(T, K) slots of every entry of the compressed cache `ref` each row may read."""
        return self.entry_slots[(ref.group, ref.ratio)]

    def read(self, ref: CacheRef, slots: torch.Tensor) -> torch.Tensor:
        """The rows of `ref` at `slots` (-1: zeros): every cache read of a layer goes through
        here."""
        return read_rows(ref, slots)


def rope_tables(
    rotary, x: torch.Tensor, positions: torch.Tensor
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """cos/sin (T, rope/2) of the model's two rotary embeddings ("main", "compress") at
    `positions`."""
    return {
        kind: tuple(t[0] for t in rotary(x, position_ids=positions[None], layer_type=kind))
        for kind in ("main", "compress")
    }


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


def right_aligned(slots: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """Shift each row's first `lens` slots to the end of the row, -1 in front.

    The window kernel puts a short window (a token near the start) first; the compressor wants
    the newest state row last, so a missing previous window sits at the front.
    """
    width = slots.shape[1]
    col = torch.arange(width, device=slots.device)[None, :] - (width - lens.long())[:, None]
    return torch.where(col >= 0, slots.gather(1, col.clamp(min=0)), torch.full_like(slots, -1))


def compress_windows(
    rows: torch.Tensor, ratio: int, dim: int, have_previous: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
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


def run_compressor(
    module,
    x: torch.Tensor,
    meta: AttentionMetadata,
    state: CacheRef,
    entries: CacheRef,
    ratio: int,
    rotary,
) -> None:
    """Write every token's state row, then every closing token's compressed entry.

    `module` is transformers' compressor (or indexer) holding kv_proj, gate_proj,
    position_bias and kv_norm; `rotary` makes the "compress" RoPE for the entry positions.
    """
    positions = meta.positions
    kv = module.kv_proj(x)
    score = module.gate_proj(x) + module.position_bias[positions % ratio]
    write_rows(state, meta.writes(state), torch.cat([kv, score], dim=-1))
    entry_slots = meta.writes(entries)  # -1 except for the tokens that close a window
    closing = (entry_slots >= 0).nonzero().squeeze(1)
    if not len(closing):
        return
    window, lens = meta.window(state)  # the last 2r (or r) state rows up to each token
    window, lens = window[closing], lens[closing]
    state_rows = meta.read(state, right_aligned(window, lens))
    dim = module.kv_norm.weight.shape[0]
    kv_w, score_w = compress_windows(state_rows, ratio, dim, lens == window.shape[1])
    pooled = (kv_w * score_w.softmax(dim=1, dtype=torch.float32)).sum(dim=1)
    pooled = module.kv_norm(pooled)
    entry_ids = positions[closing] // ratio
    cos, sin = rotary(pooled, position_ids=(entry_ids * ratio)[None], layer_type="compress")
    pooled = apply_rope(pooled, cos[0], sin[0])
    write_rows(entries, entry_slots[closing], pooled)


def indexer_topk(
    indexer,
    x: torch.Tensor,
    q_residual: torch.Tensor,
    meta: AttentionMetadata,
    caches: LayerCaches,
    rotary,
) -> torch.Tensor:
    """(T, k) numbers of the compressed entries each query attends to (-1 = none).

    Scores = sum over indexer heads of w_h · ReLU(q_h · k_s) / sqrt(head_dim), only over
    entries s < (p + 1) // 4 (windows closed by the query's own token or earlier); the stable
    top-k keeps the index_topk best, ties to the lowest s.
    """
    run_compressor(indexer, x, meta, caches.idx_state, caches.idx, 4, rotary)
    # column s = entry s, -1 where not yet complete
    key_slots = meta.complete_entries(caches.idx)
    t_all, num_entries = key_slots.shape
    if num_entries == 0:
        return torch.full((t_all, 0), -1, dtype=torch.long, device=x.device)
    cos, sin = meta.rope["compress"]
    q = apply_rope(indexer.q_b_proj(q_residual).view(t_all, -1, indexer.head_dim), cos, sin)
    # (T, heads)
    weights = indexer.scorer.weights_proj(x).float() * indexer.scorer.weights_scaling
    keys = meta.read(caches.idx, key_slots)  # (T, entries, dim)
    scores = torch.matmul(q.float(), keys.float().transpose(1, 2))  # (T, heads, entries)
    scores = torch.relu(scores) * indexer.scorer.softmax_scale
    scores = (scores * weights.unsqueeze(-1)).sum(dim=1)  # (T, entries)
    scores = scores.masked_fill(key_slots < 0, float("-inf"))
    top = stable_topk(scores, min(indexer.index_topk, num_entries))
    return torch.where(key_slots.gather(1, top) < 0, torch.full_like(top, -1), top)


def paged_attention(
    attn, x: torch.Tensor, meta: AttentionMetadata, caches: LayerCaches, layer: int
) -> torch.Tensor:
    """One decoder layer's attention for the packed rows `x` (T, hidden); returns (T,
    hidden)."""
    t_all = x.shape[0]
    cos, sin = meta.rope[attn.rope_layer_type]
    q_residual = attn.q_a_norm(attn.q_a_proj(x))
    q = attn.q_b_proj(q_residual).view(t_all, -1, attn.head_dim)
    q = apply_rope(attn.q_b_norm(q), cos, sin)  # (T, heads, dim)
    kv = apply_rope(attn.kv_norm(attn.kv_proj(x)), cos, sin)  # (T, dim): key = value
    write_rows(caches.swa, meta.writes(caches.swa), kv)

    window_slots, _ = meta.window(caches.swa)  # (T, window): positions p - window + 1 .. p
    keys = meta.read(caches.swa, window_slots)
    seen = window_slots >= 0
    if caches.ratio:
        comp = attn.compressor
        run_compressor(
            comp, x, meta, caches.attn_state, caches.attn, caches.ratio, comp.rotary_emb
        )
        if caches.ratio == 4:  # CSA: the entries the indexer picked
            picks = indexer_topk(
                comp.indexer, x, q_residual, meta, caches, comp.indexer.rotary_emb
            )
            meta.topk_indices[layer] = picks
            entry_slots, _ = meta.index_ops.compute_global_topk_indices_and_lens(
                picks,
                meta.token_to_req_indices,
                meta.block_tables[caches.attn.group],
                caches.attn.entries_per_block,
                meta.is_valid_token,
            )
        else:  # HCA: every closed window
            entry_slots = meta.complete_entries(caches.attn)
        keys = torch.cat([keys, meta.read(caches.attn, entry_slots)], dim=1)
        seen = torch.cat([seen, entry_slots >= 0], dim=1)
    logits = torch.matmul(q, keys.transpose(1, 2)) * attn.scaling  # (T, heads, keys)
    logits = logits.masked_fill(~seen[:, None, :], float("-inf"))
    sinks = attn.sinks.reshape(1, -1, 1).expand(t_all, -1, 1)
    logits = torch.cat([logits, sinks], dim=-1)
    logits = logits - logits.max(dim=-1, keepdim=True).values
    probs = torch.softmax(logits, dim=-1)[..., :-1]
    out = torch.matmul(probs, keys)  # (T, heads, dim)
    out = apply_rope(out, cos, -sin)  # undo the rotation the values carried
    grouped = out.reshape(1, t_all, attn.config.o_groups, -1)
    return attn.o_b_proj(attn.o_a_proj(grouped).flatten(2))[0]
