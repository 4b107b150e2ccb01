"""Pure-torch twins of the Triton kernels, plus the argument checks both share.

Each twin has exactly the signature of its Triton kernel in ``refimpl.kernels`` and computes
the same numbers the plain way: gather the context out of the paged cache through the block
table, then run ordinary softmax attention in fp32. The tests compare each Triton kernel with
its twin, and so the functions of ``refimpl.kernels.torch_backend``, the faster versions the
engine's ``torch`` attention backend runs. (The DeepSeek V4 twins are in ``reference_v4``.)

Cache layout (as in nano-vllm and flash-attn's paged KV): ``k_cache`` and ``v_cache`` are
``[num_blocks, block_size, num_kv_heads, head_dim]``; token ``t`` of a sequence lives in
block ``block_table[t // block_size]`` at offset ``t % block_size``, i.e. in *slot*
``block_id * block_size + t % block_size``.

The ``check_*`` functions raise ``ValueError`` (saying what was wrong and what is allowed)
before anything is written, so a bad call never leaves a half-updated cache.
"""

from __future__ import annotations

import math
import operator

import torch

# slot_mapping, block_table, cache_seqlens, cu_seqlens
from refimpl.kernels.common import INDEX_DTYPES

#: Element types every kernel and twin accepts for q / key / value / caches.
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# --- checks


def _require_tensor(name: str, x: object, ndim: int, layout: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor {layout}, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(x.shape)}")
    return x


def _require_index(
    name: str, x: object, ndim: int, layout: str, device: torch.device
) -> torch.Tensor:
    x = _require_tensor(name, x, ndim, layout)
    if x.dtype not in INDEX_DTYPES:
        raise ValueError(f"{name} must be int32 or int64, got {x.dtype}")
    if x.device != device:
        raise ValueError(
            f"{name} is on {x.device} but the KV cache is on {device}; put them on one device"
        )
    return x


def check_kv_cache(k_cache: object, v_cache: object) -> tuple[int, int, int, int]:
    """Check the paged cache pair; return ``(num_blocks, block_size, num_kv_heads,
    head_dim)``."""
    layout = "[num_blocks, block_size, num_kv_heads, head_dim]"
    k_cache = _require_tensor("k_cache", k_cache, 4, layout)
    v_cache = _require_tensor("v_cache", v_cache, 4, layout)
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must have the "
            "same shape"
        )
    if k_cache.dtype not in SUPPORTED_DTYPES or v_cache.dtype != k_cache.dtype:
        raise ValueError(
            f"k_cache/v_cache dtypes {k_cache.dtype}/{v_cache.dtype} not supported: "
            "both must be one of float32, float16, bfloat16"
        )
    if k_cache.device != v_cache.device:
        raise ValueError(f"k_cache is on {k_cache.device} but v_cache on {v_cache.device}")
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    if block_size < 1 or num_kv_heads < 1 or head_dim < 1:
        raise ValueError(
            "block_size, num_kv_heads and head_dim must be >= 1, got cache shape "
            f"{tuple(k_cache.shape)}"
        )
    return num_blocks, block_size, num_kv_heads, head_dim


def check_store_kvcache_args(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Validate a ``store_kvcache`` call: shapes, dtypes, devices, and every slot in range and
    unique."""
    num_blocks, block_size, num_kv_heads, head_dim = check_kv_cache(k_cache, v_cache)
    layout = "[num_tokens, num_kv_heads, head_dim]"
    key = _require_tensor("key", key, 3, layout)
    value = _require_tensor("value", value, 3, layout)
    expected = (key.shape[0], num_kv_heads, head_dim)
    for name, x in (("key", key), ("value", value)):
        if tuple(x.shape) != expected:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)}, expected {expected} to match the cache "
                "heads/head_dim"
            )
        if x.dtype != k_cache.dtype:
            raise ValueError(
                f"{name} dtype {x.dtype} differs from the cache dtype {k_cache.dtype}; cast "
                "it first"
            )
        if x.device != k_cache.device:
            raise ValueError(f"{name} is on {x.device} but the cache is on {k_cache.device}")
    slot_mapping = _require_index(
        "slot_mapping", slot_mapping, 1, "[num_tokens]", k_cache.device
    )
    if slot_mapping.shape[0] != key.shape[0]:
        raise ValueError(
            f"slot_mapping has {slot_mapping.shape[0]} entries but there are {key.shape[0]} "
            "tokens"
        )
    if slot_mapping.numel() == 0:
        return
    num_slots = num_blocks * block_size
    bad = (slot_mapping < -1) | (slot_mapping >= num_slots)
    if bool(bad.any()):
        first = int(slot_mapping[bad][0])
        raise ValueError(
            f"slot_mapping holds {first}; slots must be -1 (skip) or in [0, {num_slots})"
        )
    used = slot_mapping[slot_mapping >= 0]
    if used.numel() != torch.unique(used).numel():
        raise ValueError(
            "slot_mapping writes the same slot twice; each slot may receive at most one token "
            "per call"
        )


def _check_block_table(
    block_table, batch: int, seqlens: torch.Tensor, num_blocks: int, block_size: int, device
) -> None:
    block_table = _require_index(
        "block_table", block_table, 2, "[batch, max_blocks_per_seq]", device
    )
    if block_table.shape[0] != batch:
        raise ValueError(
            f"block_table has {block_table.shape[0]} rows but the batch has {batch} sequences"
        )
    capacity = block_table.shape[1] * block_size
    if batch and int(seqlens.max()) > capacity:
        raise ValueError(
            f"a context of {int(seqlens.max())} tokens does not fit in {block_table.shape[1]} "
            f"blocks of {block_size}; "
            "widen block_table"
        )
    if batch == 0 or block_table.shape[1] == 0:
        return
    blocks_needed = (seqlens.to(torch.int64) + block_size - 1) // block_size
    in_use = (
        torch.arange(block_table.shape[1], device=device)[None, :] < blocks_needed[:, None]
    )
    bad = in_use & ((block_table < 0) | (block_table >= num_blocks))
    if bool(bad.any()):
        row, col = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"block_table[{row}, {col}] = {int(block_table[row, col])} is needed by the "
            "context but is not a "
            f"block id in [0, {num_blocks})"
        )


def _check_query(q, k_cache, num_kv_heads: int, head_dim: int, layout: str) -> int:
    q = _require_tensor("q", q, 3, layout)
    if q.shape[2] != head_dim:
        raise ValueError(f"q head_dim {q.shape[2]} differs from the cache head_dim {head_dim}")
    if q.shape[1] < 1 or q.shape[1] % num_kv_heads:
        raise ValueError(
            f"num_heads {q.shape[1]} must be a positive multiple of num_kv_heads "
            f"{num_kv_heads} (GQA groups)"
        )
    if q.dtype != k_cache.dtype:
        raise ValueError(
            f"q dtype {q.dtype} differs from the cache dtype {k_cache.dtype}; use one dtype"
        )
    if q.device != k_cache.device:
        raise ValueError(f"q is on {q.device} but the cache is on {k_cache.device}")
    return q.shape[1] // num_kv_heads


def check_num_splits(num_splits: object) -> None:
    """``num_splits`` as flash-attn takes it: 0 (choose automatically), 1 (no split) or more
    chunks."""
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(
            f"num_splits must be an int >= 0 (0: chosen automatically), got {num_splits!r}"
        )


def check_decode_args(
    q, k_cache, v_cache, cache_seqlens, block_table, num_splits: int = 0
) -> None:
    """Validate a ``paged_decode_attention`` call (every context holds 1 or more tokens)."""
    check_num_splits(num_splits)
    num_blocks, block_size, num_kv_heads, head_dim = check_kv_cache(k_cache, v_cache)
    _check_query(q, k_cache, num_kv_heads, head_dim, "[batch, num_heads, head_dim]")
    batch = q.shape[0]
    cache_seqlens = _require_index(
        "cache_seqlens", cache_seqlens, 1, "[batch]", k_cache.device
    )
    if cache_seqlens.shape[0] != batch:
        raise ValueError(
            f"cache_seqlens has {cache_seqlens.shape[0]} entries but q has {batch} sequences"
        )
    if batch and int(cache_seqlens.min()) < 1:
        raise ValueError(
            "every cache_seqlens entry must be >= 1 (the newest token is already stored), "
            f"got {int(cache_seqlens.min())}"
        )
    _check_block_table(
        block_table, batch, cache_seqlens, num_blocks, block_size, k_cache.device
    )


def check_prefill_args(
    q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table
) -> tuple[list[int], list[int]]:
    """Validate a ``paged_prefill_attention`` call; return the per-sequence query and key
    lengths."""
    num_blocks, block_size, num_kv_heads, head_dim = check_kv_cache(k_cache, v_cache)
    _check_query(q, k_cache, num_kv_heads, head_dim, "[total_q_tokens, num_heads, head_dim]")
    cu_q = _require_index("cu_seqlens_q", cu_seqlens_q, 1, "[batch + 1]", k_cache.device)
    cu_k = _require_index("cu_seqlens_k", cu_seqlens_k, 1, "[batch + 1]", k_cache.device)
    if cu_q.shape[0] < 1 or cu_k.shape != cu_q.shape:
        raise ValueError(
            f"cu_seqlens_q {tuple(cu_q.shape)} and cu_seqlens_k {tuple(cu_k.shape)} must both "
            "be [batch + 1]"
        )
    starts_q, starts_k = cu_q.tolist(), cu_k.tolist()
    if starts_q[0] != 0 or starts_k[0] != 0:
        raise ValueError("cu_seqlens_q and cu_seqlens_k must start at 0")
    q_lens = [b - a for a, b in zip(starts_q, starts_q[1:])]
    k_lens = [b - a for a, b in zip(starts_k, starts_k[1:])]
    if any(n < 0 for n in q_lens + k_lens):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be non-decreasing")
    if starts_q[-1] != q.shape[0]:
        raise ValueError(
            f"cu_seqlens_q ends at {starts_q[-1]} but q holds {q.shape[0]} tokens"
        )
    for i, (nq, nk) in enumerate(zip(q_lens, k_lens)):
        if nq > nk:
            raise ValueError(
                f"sequence {i} has {nq} queries but only {nk} keys; the context "
                "(cu_seqlens_k) includes the queries"
            )
    for name, given, actual in (
        ("max_seqlen_q", max_seqlen_q, q_lens),
        ("max_seqlen_k", max_seqlen_k, k_lens),
    ):
        try:
            # int, numpy int, 0-d int tensor
            value = None if isinstance(given, bool) else operator.index(given)
        except TypeError:
            value = None
        if value is None or value < max(actual, default=0):
            raise ValueError(
                f"{name} must be an int >= the longest sequence ({max(actual, default=0)}), "
                f"got {given!r}"
            )
    seqlens = torch.tensor(k_lens, dtype=torch.int64, device=k_cache.device)
    _check_block_table(
        block_table, len(k_lens), seqlens, num_blocks, block_size, k_cache.device
    )
    return q_lens, k_lens


def resolve_softmax_scale(softmax_scale: float | None, head_dim: int) -> float:
    """``softmax_scale`` checked, or ``1 / sqrt(head_dim)`` (flash-attn's default) when it is
    None."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if (
        isinstance(softmax_scale, bool)
        or not isinstance(softmax_scale, (int, float))
        or not math.isfinite(softmax_scale)
    ):
        raise ValueError(
            f"softmax_scale must be a finite number or None, got {softmax_scale!r}"
        )
    return float(softmax_scale)


# --- twins


def store_kvcache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write token ``i``'s K/V rows into slot ``slot_mapping[i]`` of the paged cache (-1:
    skip)."""
    check_store_kvcache_args(key, value, k_cache, v_cache, slot_mapping)
    block_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].to(torch.int64)
    block_ids, offsets = slots // block_size, slots % block_size
    # Advanced indexing on (block, offset) works for any cache strides (e.g. views into one
    # slab).
    k_cache[block_ids, offsets] = key[keep]
    v_cache[block_ids, offsets] = value[keep]


def gather_kv(
    cache: torch.Tensor, block_table: torch.Tensor, seqlens: torch.Tensor, max_len: int
) -> torch.Tensor:
    """Read each sequence's first ``seqlens[b]`` tokens out of the paged cache.

    Returns ``[batch, max_len, num_kv_heads, head_dim]`` with zeros at positions at or past a
    sequence's length, so stale or uninitialised cache rows (even NaN) cannot leak into the
    result once the caller masks those positions out of the softmax.
    """
    block_size = cache.shape[1]
    positions = torch.arange(max_len, device=cache.device)
    block_ids = block_table.to(torch.int64)[:, positions // block_size]  # [batch, max_len]
    valid = positions[None, :] < seqlens.to(torch.int64)[:, None]
    block_ids = torch.where(valid, block_ids, torch.zeros_like(block_ids))  # padding may be -1
    rows = cache[block_ids, positions % block_size]
    return torch.where(
        valid[:, :, None, None], rows, torch.zeros((), dtype=cache.dtype, device=cache.device)
    )


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    softmax_scale: float | None = None,
    num_splits: int = 0,
) -> torch.Tensor:
    """Attention of one query token per sequence over its whole paged context (GQA aware).

    Query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)``, as flash-attn does.
    ``num_splits`` (how many chunks the Triton kernel cuts each context into) is checked and
    otherwise ignored: splitting changes how the softmax is summed, never its value.
    """
    check_decode_args(q, k_cache, v_cache, cache_seqlens, block_table, num_splits)
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    scale = resolve_softmax_scale(softmax_scale, head_dim)
    if batch == 0:
        return torch.empty_like(q)
    max_len = int(cache_seqlens.max())
    keys = gather_kv(k_cache, block_table, cache_seqlens, max_len).float()  # [B, L, Hkv, D]
    values = gather_kv(v_cache, block_table, cache_seqlens, max_len).float()
    # [B, Hkv, G, D]
    queries = q.float().reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = torch.einsum("bkgd,blkd->bkgl", queries, keys) * scale
    valid = (
        torch.arange(max_len, device=q.device)[None, :]
        < cache_seqlens.to(torch.int64)[:, None]
    )
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    out = torch.einsum("bkgl,blkd->bkgd", scores.softmax(dim=-1), values)
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
) -> torch.Tensor:
    """Causal attention for packed variable-length queries over contexts read from the paged
    cache.

    A sequence with ``q_len`` queries and ``k_len`` context tokens (cached prefix plus this
    step's tokens, all already stored) puts query ``j`` at position ``k_len - q_len + j``; it
    sees every key at that position or before.
    """
    q_lens, k_lens = check_prefill_args(
        q,
        k_cache,
        v_cache,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        block_table,
    )
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    scale = resolve_softmax_scale(softmax_scale, head_dim)
    out = torch.empty_like(q)
    start = 0
    for b, (q_len, k_len) in enumerate(zip(q_lens, k_lens)):
        if q_len == 0:
            continue
        seqlen = torch.tensor([k_len], device=q.device)
        # [L, Hkv, D]
        keys = gather_kv(k_cache, block_table[b : b + 1], seqlen, k_len)[0].float()
        values = gather_kv(v_cache, block_table[b : b + 1], seqlen, k_len)[0].float()
        queries = (
            q[start : start + q_len].float().reshape(q_len, num_kv_heads, group, head_dim)
        )
        scores = torch.einsum("qkgd,lkd->kgql", queries, keys) * scale
        query_pos = torch.arange(k_len - q_len, k_len, device=q.device)
        # [q_len, k_len]
        allowed = torch.arange(k_len, device=q.device)[None, :] <= query_pos[:, None]
        scores = scores.masked_fill(~allowed, float("-inf"))
        seq_out = torch.einsum("kgql,lkd->qkgd", scores.softmax(dim=-1), values)
        out[start : start + q_len] = seq_out.reshape(q_len, num_heads, head_dim).to(q.dtype)
        start += q_len
    return out
