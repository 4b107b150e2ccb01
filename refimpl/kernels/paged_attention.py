"""Triton paged attention: decode (one query per sequence) and varlen causal prefill.

Both kernels walk a sequence's context in tiles of ``BLOCK_N`` token positions. For every
position ``t`` they look up ``block_table[seq, t // block_size]`` and read row
``t % block_size`` of that block, so pages can sit anywhere in the cache and the block size
can be any positive number (it need not divide or equal the tile). Softmax is computed
online (running max ``m``, running sum ``l``, rescaled accumulator), so no program ever holds
a whole row of scores: this is the FlashAttention recurrence over pages.

Shapes the kernels declare: any positive block size, any head_dim from 1 to 256 (tiles are
padded to the next power of two and masked), num_heads a multiple of num_kv_heads (GQA:
query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)``). Dtypes float32,
float16, bfloat16; scores and the accumulator are always float32.
"""

from __future__ import annotations

import math

import torch

from refimpl.kernels import reference
from refimpl.kernels.common import check_triton_device, next_power_of_2
from refimpl.kernels.store_kvcache import check_head_dim
from refimpl.kernels.triton_setup import HAS_TRITON, INTERPRET, tl, triton

LOG2_E = 1.4426950408889634  # exp(x) == exp2(x * log2(e)); exp2 is the cheaper instruction

if HAS_TRITON:

    @triton.jit
    def _paged_decode_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, cache_seqlens_ptr, block_table_ptr,
        q_stride_b, q_stride_h, q_stride_d,
        kc_stride_b, kc_stride_s, kc_stride_h, kc_stride_d,
        vc_stride_b, vc_stride_s, vc_stride_h, vc_stride_d,
        out_stride_b, out_stride_h, out_stride_d,
        bt_stride_b, bt_stride_n,
        scale_log2, block_size, head_dim, group_size,
        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        # One program per (sequence, query head): a [head_dim] query against the whole context.
        seq = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        kv_head = head // group_size
        seqlen = tl.load(cache_seqlens_ptr + seq)
        dims = tl.arange(0, BLOCK_D)
        dim_mask = dims < head_dim
        q = tl.load(q_ptr + seq * q_stride_b + head * q_stride_h + dims * q_stride_d, mask=dim_mask, other=0.0)
        q = q.to(tl.float32)

        m_i = tl.full([], float("-inf"), tl.float32)  # running max of the scores (log2 units)
        l_i = tl.full([], 0.0, tl.float32)  # running sum of exp2(score - m_i)
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)  # running sum of exp2(score - m_i) * v
        for start in range(0, seqlen, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            pos_mask = pos < seqlen
            block_ids = tl.load(block_table_ptr + seq * bt_stride_b + (pos // block_size) * bt_stride_n,
                                mask=pos_mask, other=0).to(tl.int64)
            rows = pos % block_size
            tile_mask = pos_mask[:, None] & dim_mask[None, :]
            k_off = block_ids[:, None] * kc_stride_b + rows[:, None] * kc_stride_s + kv_head * kc_stride_h
            k = tl.load(k_cache_ptr + k_off + dims[None, :] * kc_stride_d, mask=tile_mask, other=0.0)
            scores = tl.sum(k.to(tl.float32) * q[None, :], axis=1) * scale_log2  # [BLOCK_N]
            scores = tl.where(pos_mask, scores, float("-inf"))
            # Position 0 is in the first tile and always valid, so m_new is finite from then on.
            m_new = tl.maximum(m_i, tl.max(scores, axis=0))
            alpha = tl.exp2(m_i - m_new)  # rescales what was summed under the old max
            p = tl.exp2(scores - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            v_off = block_ids[:, None] * vc_stride_b + rows[:, None] * vc_stride_s + kv_head * vc_stride_h
            v = tl.load(v_cache_ptr + v_off + dims[None, :] * vc_stride_d, mask=tile_mask, other=0.0)
            acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
            m_i = m_new
        out = acc / l_i
        tl.store(out_ptr + seq * out_stride_b + head * out_stride_h + dims * out_stride_d,
                 out.to(out_ptr.dtype.element_ty), mask=dim_mask)

    @triton.jit
    def _paged_prefill_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr, block_table_ptr,
        q_stride_t, q_stride_h, q_stride_d,
        kc_stride_b, kc_stride_s, kc_stride_h, kc_stride_d,
        vc_stride_b, vc_stride_s, vc_stride_h, vc_stride_d,
        out_stride_t, out_stride_h, out_stride_d,
        bt_stride_b, bt_stride_n,
        scale_log2, block_size, head_dim, group_size,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_IN_FP32: tl.constexpr,
    ):
        # One program per (sequence, query head, tile of BLOCK_M queries).
        seq = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        q_tile = tl.program_id(2)
        kv_head = head // group_size
        q_start = tl.load(cu_seqlens_q_ptr + seq).to(tl.int64)
        q_len = tl.load(cu_seqlens_q_ptr + seq + 1).to(tl.int64) - q_start
        k_len = tl.load(cu_seqlens_k_ptr + seq + 1).to(tl.int64) - tl.load(cu_seqlens_k_ptr + seq).to(tl.int64)
        if q_tile * BLOCK_M >= q_len:  # the grid is sized for the longest sequence
            return
        rows = q_tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < q_len
        q_pos = k_len - q_len + rows  # queries are the last q_len positions of the context
        dims = tl.arange(0, BLOCK_D)
        dim_mask = dims < head_dim
        q_off = (q_start + rows)[:, None] * q_stride_t + head * q_stride_h + dims[None, :] * q_stride_d
        q = tl.load(q_ptr + q_off, mask=row_mask[:, None] & dim_mask[None, :], other=0.0)
        if DOT_IN_FP32:  # the interpreter's bf16 dot is wrong, and fp32 inputs should not drop to tf32
            q = q.to(tl.float32)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        # Causal: no query of this tile looks past the position of its last query.
        hi = tl.minimum(k_len, k_len - q_len + (q_tile + 1) * BLOCK_M)
        for start in range(0, hi, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            pos_mask = pos < k_len
            block_ids = tl.load(block_table_ptr + seq * bt_stride_b + (pos // block_size) * bt_stride_n,
                                mask=pos_mask, other=0).to(tl.int64)
            key_rows = pos % block_size
            tile_mask = pos_mask[:, None] & dim_mask[None, :]
            k_off = block_ids[:, None] * kc_stride_b + key_rows[:, None] * kc_stride_s + kv_head * kc_stride_h
            k = tl.load(k_cache_ptr + k_off + dims[None, :] * kc_stride_d, mask=tile_mask, other=0.0)
            v_off = block_ids[:, None] * vc_stride_b + key_rows[:, None] * vc_stride_s + kv_head * vc_stride_h
            v = tl.load(v_cache_ptr + v_off + dims[None, :] * vc_stride_d, mask=tile_mask, other=0.0)
            if DOT_IN_FP32:
                scores = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                scores = tl.dot(q, tl.trans(k))
            scores = scores * scale_log2
            visible = pos_mask[None, :] & (pos[None, :] <= q_pos[:, None])
            scores = tl.where(visible, scores, float("-inf"))
            # Key 0 is visible to every row (q_pos >= 0) and sits in the first tile: m_new stays finite.
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if DOT_IN_FP32:
                pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        out = acc / l_i[:, None]
        out_off = (q_start + rows)[:, None] * out_stride_t + head * out_stride_h + dims[None, :] * out_stride_d
        tl.store(out_ptr + out_off, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & dim_mask[None, :])


def decode_tiles(head_dim: int, interpret: bool = INTERPRET) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_D) for decode: head_dim padded to a power of two, keys read 32 or 64 at a time."""
    block_d = next_power_of_2(head_dim)
    return (32 if (interpret or block_d > 128) else 64), block_d


def prefill_tiles(head_dim: int, dtype: torch.dtype, interpret: bool = INTERPRET) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_D) for prefill; ``tl.dot`` wants every side >= 16.

    Sizes keep shared memory under ~100 KB on sm_80+ (checked by compiling for sm_80):
    fp32 tiles are twice as large in bytes, and head_dim 256 doubles them again.
    """
    block_d = max(16, next_power_of_2(head_dim))
    if interpret:
        return 16, 16, block_d  # tests use tiny shapes; small tiles waste the least work
    if dtype == torch.float32:
        return (32, 32, block_d) if block_d <= 128 else (16, 16, block_d)
    return (64, 32, block_d) if block_d <= 128 else (32, 32, block_d)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    softmax_scale: float | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over its paged context. Same contract as the torch twin."""
    check_triton_device(q)
    reference.check_decode_args(q, k_cache, v_cache, cache_seqlens, block_table)
    check_head_dim(q.shape[2])
    scale = reference.resolve_softmax_scale(softmax_scale, q.shape[2])
    return launch_paged_decode(q, k_cache, v_cache, cache_seqlens, block_table, scale)


def launch_paged_decode(q, k_cache, v_cache, cache_seqlens, block_table, scale: float) -> torch.Tensor:
    """Launch the decode kernel without any checks (benchmarks time this)."""
    batch, num_heads, head_dim = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    block_n, block_d = decode_tiles(head_dim)
    _paged_decode_kernel[(batch, num_heads)](
        q, k_cache, v_cache, out, cache_seqlens.contiguous(), block_table,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(), *block_table.stride(),
        scale * LOG2_E, k_cache.shape[1], head_dim, num_heads // k_cache.shape[2],
        BLOCK_N=block_n, BLOCK_D=block_d,
    )
    return out


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
    """Varlen causal attention over contexts read through the block table. Same contract as the torch twin."""
    check_triton_device(q)
    q_lens, _ = reference.check_prefill_args(
        q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table
    )
    num_heads, head_dim = q.shape[1], q.shape[2]
    check_head_dim(head_dim)
    scale = reference.resolve_softmax_scale(softmax_scale, head_dim)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    longest = max(q_lens, default=0)
    if longest == 0:
        return out
    block_m, block_n, block_d = prefill_tiles(head_dim, q.dtype)
    grid = (len(q_lens), num_heads, math.ceil(longest / block_m))
    _paged_prefill_kernel[grid](
        q, k_cache, v_cache, out, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), block_table,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(), *block_table.stride(),
        scale * LOG2_E, k_cache.shape[1], head_dim, num_heads // k_cache.shape[2],
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        DOT_IN_FP32=INTERPRET or q.dtype == torch.float32,
    )
    return out
