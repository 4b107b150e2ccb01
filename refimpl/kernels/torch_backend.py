"""The engine's "torch" attention backend: the twins' three operations, written for speed on a
CPU.

`refimpl.kernels.reference` holds the readable twins (gather every token of every context,
mask, einsum); they stay the yardstick. These functions have the same signatures and compute
the same numbers (tests compare them with the twins, on caches whose unused slots hold NaN),
but move whole blocks instead of single rows and let `scaled_dot_product_attention` do the
softmax:

* `store_kvcache` writes all rows with one `index_copy_` into the flattened cache.
* `paged_decode_attention` gathers, per sequence, only the rows its context uses. Blocks at the
  start of every block table in the batch (a shared system prompt held once in the prefix
  cache) are gathered once and attended by all queries in one matrix product: prefix caching
  saves their memory reads as well as their prefill.
* `paged_prefill_attention` gathers each sequence's context once and runs causal attention with
  the
  queries aligned to the end of the context (cached prefix + this step's tokens): a small step
  as one padded batch, a large one sequence by sequence.

Each takes `check=True`, which runs the twins' argument checks. The engine passes `check=False`
on every layer but the first of a step: all layers get the same step metadata, so checking it
once is enough (`AttentionOps.check_once_per_step`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from refimpl.kernels import reference


def store_kvcache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    check: bool = True,
) -> None:
    """Write token ``i``'s K/V rows into slot ``slot_mapping[i]`` (-1: skip), like the twin."""
    if check:
        reference.check_store_kvcache_args(key, value, k_cache, v_cache, slot_mapping)
    slots, keep = _store_plan(slot_mapping, reuse=not check)
    if keep is not None:
        key, value = key[keep], value[keep]
    if k_cache.is_contiguous() and v_cache.is_contiguous():
        num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
        k_cache.view(num_blocks * block_size, num_kv_heads, head_dim).index_copy_(
            0, slots, key
        )
        v_cache.view(num_blocks * block_size, num_kv_heads, head_dim).index_copy_(
            0, slots, value
        )
    else:  # a strided view (e.g. into one larger slab): index (block, offset) as the twin does
        block_size = k_cache.shape[1]
        k_cache[slots // block_size, slots % block_size] = key
        v_cache[slots // block_size, slots % block_size] = value


# The slots of the latest checked call, reused by unchecked calls with the very same
# slot_mapping (the engine's later layers of one step).
_last_slots: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None


def _store_plan(
    slot_mapping: torch.Tensor, reuse: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(int64 slots to write, the mask of rows to keep or None when no slot is -1)."""
    global _last_slots
    if reuse and _last_slots is not None and _last_slots[0] is slot_mapping:
        return _last_slots[1], _last_slots[2]
    slots = slot_mapping.to(torch.int64)
    keep = None
    if slots.numel() and bool((slots < 0).any()):
        keep = slots >= 0
        slots = slots[keep]
    _last_slots = (slot_mapping, slots, keep)
    return slots, keep


def gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """``cache[block_ids]``: whole blocks, ``[*block_ids.shape, block_size, num_kv_heads,
    head_dim]``.

    On a contiguous cache each block is one row of a 2-D view, and `index_select` copies rows
    several times faster than advanced indexing does.
    """
    if not cache.is_contiguous():
        return cache[block_ids]
    rows = cache.view(cache.shape[0], -1).index_select(0, block_ids.reshape(-1))
    return rows.view(*block_ids.shape, *cache.shape[1:])


def gather_slots(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``cache`` rows by slot (``block_id * block_size + offset``): ``[*slots.shape,
    num_kv_heads, head_dim]``.

    Row by row, so a context that fills a fraction of a large block copies only that fraction.
    """
    num_blocks, block_size = cache.shape[0], cache.shape[1]
    if not cache.is_contiguous():
        return cache[slots // block_size, slots % block_size]
    rows = cache.view(num_blocks * block_size, -1).index_select(0, slots.reshape(-1))
    return rows.view(*slots.shape, *cache.shape[2:])


def _shared_prefix_blocks(block_table: torch.Tensor, min_len: int, block_size: int) -> int:
    """How many leading block-table columns hold the same full block for every sequence."""
    batch = block_table.shape[0]
    full = min(min_len // block_size, block_table.shape[1])
    if batch < 2 or full == 0:
        return 0
    same = (block_table[:, :full] == block_table[:1, :full]).all(dim=0)
    if bool(same.all()):
        return full
    return int(same.to(torch.int8).argmin())  # the first column where some sequence differs


@dataclass
class _DecodePlan:
    """What a decode step's metadata says, the same for every layer: which blocks and slots to
    gather, and which gathered rows are context."""

    shared_ids: torch.Tensor  # [shared] block ids at the start of every block table
    # [batch, own_len] each sequence's slots after them; a row past its context reads the slot
    # of its first token instead, a real (finite) row that the bias then gives weight exactly
    # 0, so stale or unwritten slots (even NaN) are never read.
    own_slots: torch.Tensor
    bias: torch.Tensor  # [batch, 1, 1, own_len]: 0 for context rows, -inf for the others


def _plan_decode(
    block_table: torch.Tensor, cache_seqlens: torch.Tensor, block_size: int
) -> _DecodePlan:
    seqlens = cache_seqlens.to(torch.int64)
    min_len, max_len = (int(x) for x in torch.aminmax(seqlens))
    shared = _shared_prefix_blocks(block_table, min_len, block_size)
    positions = torch.arange(shared * block_size, max_len, device=block_table.device)
    valid = positions[None, :] < seqlens[:, None]
    block_ids = block_table.to(torch.int64)
    slots = block_ids[:, positions // block_size] * block_size + positions % block_size
    first_slots = block_ids[:, :1] * block_size
    return _DecodePlan(
        shared_ids=block_ids[0, :shared],
        own_slots=torch.where(valid, slots, first_slots),
        bias=torch.zeros(valid.shape, device=valid.device).masked_fill_(~valid, float("-inf"))[
            :, None, None, :
        ],
    )


# The plan of the latest checked call, reused by unchecked calls with the very same metadata
# tensors (the engine's later layers of one step). Holding the tensors keeps their identity
# meaningful.
_last_plan: tuple[torch.Tensor, torch.Tensor, int, _DecodePlan] | None = None


def _decode_plan(
    block_table: torch.Tensor, cache_seqlens: torch.Tensor, block_size: int, reuse: bool
) -> _DecodePlan:
    global _last_plan
    last = _last_plan
    if (
        reuse
        and last is not None
        and last[0] is block_table
        and last[1] is cache_seqlens
        and last[2] == block_size
    ):
        return last[3]
    plan = _plan_decode(block_table, cache_seqlens, block_size)
    _last_plan = (block_table, cache_seqlens, block_size, plan)
    return plan


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    softmax_scale: float | None = None,
    num_splits: int = 0,
    *,
    check: bool = True,
) -> torch.Tensor:
    """One query token per sequence over its paged context (GQA aware), like the twin (which
    also ignores ``num_splits``).

    With `check=False` the metadata must be what an earlier call checked (the engine's first
    layer of the step): when the `block_table` and `cache_seqlens` tensors are those very
    objects, the index tensors derived from them are reused too.
    """
    if check:
        reference.check_decode_args(
            q, k_cache, v_cache, cache_seqlens, block_table, num_splits
        )
    batch, num_heads, head_dim = q.shape
    scale = reference.resolve_softmax_scale(softmax_scale, head_dim)
    if batch == 0:
        return torch.empty_like(q)
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    plan = _decode_plan(block_table, cache_seqlens, block_size, reuse=not check)
    # The query heads of one KV head are the "query rows" of that head: [batch, kv_heads,
    # group, dim].
    queries = q.float().reshape(batch, num_kv_heads, group, head_dim)

    # Each sequence's own rows after the shared blocks, up to the longest context.
    # [batch, kv_heads, own_len, dim]
    keys = gather_slots(k_cache, plan.own_slots).float().permute(0, 2, 1, 3)
    values = gather_slots(v_cache, plan.own_slots).float().permute(0, 2, 1, 3)

    shared = plan.shared_ids.shape[0]
    if shared == 0:
        out = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=plan.bias, scale=scale
        )
        return out.reshape(batch, num_heads, head_dim).to(q.dtype)

    # Shared blocks: gathered once, every query of the batch against them in one product.
    shared_len = shared * block_size
    shared_keys = (
        gather_blocks(k_cache, plan.shared_ids)
        .view(shared_len, num_kv_heads, head_dim)
        .float()
        .permute(1, 2, 0)
    )
    shared_values = (
        gather_blocks(v_cache, plan.shared_ids)
        .view(shared_len, num_kv_heads, head_dim)
        .float()
        .transpose(0, 1)
    )
    # [kv_heads, batch*group, dim]
    rows = queries.transpose(0, 1).reshape(num_kv_heads, batch * group, head_dim)
    shared_scores = torch.matmul(rows, shared_keys)  # [kv_heads, batch*group, shared_len]
    shared_scores = shared_scores.view(num_kv_heads, batch, group, shared_len).transpose(0, 1)
    # [batch, kv_heads, group, own_len]
    own_scores = torch.matmul(queries, keys.transpose(-1, -2))
    scores = torch.cat((shared_scores, own_scores), dim=-1).mul_(scale)
    scores[..., shared_len:] += plan.bias
    probs = scores.softmax(dim=-1)
    shared_probs = (
        probs[..., :shared_len]
        .transpose(0, 1)
        .reshape(num_kv_heads, batch * group, shared_len)
    )
    out = (
        torch.matmul(shared_probs, shared_values)
        .view(num_kv_heads, batch, group, head_dim)
        .transpose(0, 1)
    )
    out = out + torch.matmul(probs[..., shared_len:], values)
    return out.reshape(batch, num_heads, head_dim).to(q.dtype)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    block_table: torch.Tensor,
    softmax_scale: float | None = None,
    *,
    check: bool = True,
) -> torch.Tensor:
    """Causal attention of packed variable-length queries over their paged contexts, like the
    twin."""
    if check:
        q_lens, k_lens = reference.check_prefill_args(
            q,
            k_cache,
            v_cache,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            block_table,
        )
    else:
        starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        q_lens = [b - a for a, b in zip(starts_q, starts_q[1:])]
        k_lens = [b - a for a, b in zip(starts_k, starts_k[1:])]
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    scale = reference.resolve_softmax_scale(softmax_scale, head_dim)
    block_ids = block_table.to(torch.int64)
    batch = len(q_lens)
    max_q, max_k = max(q_lens, default=0), max(k_lens, default=0)
    if batch > 1 and 0 < batch * max_q * max_k <= BATCHED_PREFILL_MAX_SCORES:
        return _prefill_padded(
            q, k_cache, v_cache, cu_seqlens_q, q_lens, k_lens, max_q, max_k, block_ids, scale
        )
    out = torch.empty_like(q)
    start = 0
    for b, (q_len, k_len) in enumerate(zip(q_lens, k_lens)):
        if q_len == 0:
            continue
        # The sequence's first k_len slots: its whole context, nothing past it.
        positions = torch.arange(k_len, device=q.device)
        slots = block_ids[b, positions // block_size] * block_size + positions % block_size
        keys = gather_slots(k_cache, slots).float().transpose(0, 1)  # [kv_heads, k_len, dim]
        values = gather_slots(v_cache, slots).float().transpose(0, 1)
        queries = q[start : start + q_len].float().transpose(0, 1)  # [heads, q_len, dim]
        if q_len == k_len:  # the whole prompt is new: plain causal attention
            seq_out = F.scaled_dot_product_attention(
                queries, keys, values, is_causal=True, scale=scale, enable_gqa=group > 1
            )
        else:  # query j sits at position k_len - q_len + j and sees every key up to it
            query_pos = torch.arange(k_len - q_len, k_len, device=q.device)
            allowed = torch.arange(k_len, device=q.device)[None, :] <= query_pos[:, None]
            seq_out = F.scaled_dot_product_attention(
                queries, keys, values, attn_mask=allowed, scale=scale, enable_gqa=group > 1
            )
        out[start : start + q_len] = seq_out.transpose(0, 1).to(q.dtype)
        start += q_len
    return out


#: Above this many query-key pairs (batch x longest query x longest context) a prefill runs one
#: sequence at a time instead of as one padded batch.
BATCHED_PREFILL_MAX_SCORES = 1 << 22


def _prefill_padded(
    q, k_cache, v_cache, cu_seqlens_q, q_lens, k_lens, max_q, max_k, block_ids, scale
):
    """The whole prefill as one padded batch: `[batch, max_q]` queries against `[batch, max_k]`
    keys.

    Padding keys read each sequence's first slot (a real row) and padding queries read row 0;
    the mask gives padding keys weight 0 and every padding query one key, and padding rows are
    dropped.
    """
    device = q.device
    block_size = k_cache.shape[1]
    group = q.shape[1] // k_cache.shape[2]
    q_len_t = torch.tensor(q_lens, device=device)
    k_len_t = torch.tensor(k_lens, device=device)
    key_pos = torch.arange(max_k, device=device)
    key_valid = key_pos[None, :] < k_len_t[:, None]  # [batch, max_k]
    slots = block_ids[:, key_pos // block_size] * block_size + key_pos % block_size
    slots = torch.where(key_valid, slots, block_ids[:, :1].clamp(min=0) * block_size)
    # [batch, kv_heads, max_k, dim]
    keys = gather_slots(k_cache, slots).float().transpose(1, 2)
    values = gather_slots(v_cache, slots).float().transpose(1, 2)
    query_pos = torch.arange(max_q, device=device)
    query_valid = query_pos[None, :] < q_len_t[:, None]  # [batch, max_q]
    rows = torch.where(
        query_valid, cu_seqlens_q[:-1].to(torch.int64)[:, None] + query_pos[None, :], 0
    )
    queries = q.float()[rows].transpose(1, 2)  # [batch, heads, max_q, dim]
    # Query i of a sequence sits at position k_len - q_len + i and sees every key up to it.
    # [batch, max_q, 1]
    last_key = (k_len_t - q_len_t)[:, None, None] + query_pos[None, :, None]
    allowed = (key_pos[None, None, :] <= last_key) & (key_valid[:, None, :] | (key_pos == 0))
    out = F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=allowed[:, None], scale=scale, enable_gqa=group > 1
    )
    return out.transpose(1, 2)[query_valid].to(q.dtype)
