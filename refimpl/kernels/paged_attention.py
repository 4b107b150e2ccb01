"""Triton paged attention: decode (one query per sequence) and varlen causal prefill.

Why three versions of paged attention exist: these kernels are what a GPU runs (and what
chapter 07 reads line by line); `reference.py` holds their readable torch twins, the yardstick
every test compares with; `torch_backend.py` holds the same contract written for speed on a
CPU, so the engine runs at laptop speed without a GPU. All three share the argument checks in
`reference.py` and are held equal by the tests.

Both kernels walk a sequence's context in tiles of ``BLOCK_N`` token positions. For every
position ``t`` they look up ``block_table[seq, t // block_size]`` and read row
``t % block_size`` of that block, so pages can sit anywhere in the cache and the block size
can be any positive number (it need not divide or equal the tile). Softmax is computed
online (running max ``m``, running sum ``l``, rescaled accumulator), so no program ever holds
a whole row of scores: this is the FlashAttention recurrence over pages.

Decode runs one program per (sequence, KV head): the query heads of that GQA group share every
K/V row it reads. When those programs are too few to keep a GPU busy (a small batch, few KV
heads), each context is also cut into chunks walked by separate programs (split-KV, as in
flash-decoding and flash-attn's ``num_splits``); each chunk leaves its ``(m, l, acc)``, and a
second, small kernel merges them with the same rescaling the online softmax applies to a tile.

Shapes the kernels declare: any positive block size, any head_dim from 1 to 256 (tiles are
padded to the next power of two and masked), num_heads a multiple of num_kv_heads (GQA:
query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)``). Dtypes float32,
float16, bfloat16; scores and the accumulator are always float32.
"""

from __future__ import annotations

import functools
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
        q_ptr,
        k_cache_ptr,
        v_cache_ptr,
        out_ptr,
        part_m_ptr,
        part_l_ptr,
        part_acc_ptr,
        cache_seqlens_ptr,
        block_table_ptr,
        q_stride_b,
        q_stride_h,
        q_stride_d,
        kc_stride_b,
        kc_stride_s,
        kc_stride_h,
        kc_stride_d,
        vc_stride_b,
        vc_stride_s,
        vc_stride_h,
        vc_stride_d,
        out_stride_b,
        out_stride_h,
        out_stride_d,
        bt_stride_b,
        bt_stride_n,
        pm_stride_b,
        pm_stride_h,
        pm_stride_s,
        pa_stride_b,
        pa_stride_h,
        pa_stride_s,
        pa_stride_d,
        scale_log2,
        block_size,
        head_dim,
        group_size,
        head_tiles,
        tokens_per_split,
        BLOCK_G: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
        SPLIT: tl.constexpr,
        DOT_IN_FP32: tl.constexpr,
    ):
        # One program per (sequence, KV head, split): the query heads of one GQA group (up to
        # BLOCK_G of them) against one chunk of the context, so each K/V row is read once per
        # group.
        seq = tl.program_id(0).to(tl.int64)
        kv_head = tl.program_id(1) // head_tiles
        split = tl.program_id(2)
        seqlen = tl.load(cache_seqlens_ptr + seq)
        start = split * tokens_per_split
        if start >= seqlen:  # a shorter sequence of the batch: this chunk is past its end
            return
        stop = tl.minimum(start + tokens_per_split, seqlen)
        group_rows = (tl.program_id(1) % head_tiles) * BLOCK_G + tl.arange(0, BLOCK_G)
        row_mask = group_rows < group_size
        heads = kv_head * group_size + group_rows  # query heads that read this KV head
        dims = tl.arange(0, BLOCK_D)
        dim_mask = dims < head_dim
        q_mask = row_mask[:, None] & dim_mask[None, :]
        q = tl.load(
            q_ptr
            + seq * q_stride_b
            + heads[:, None] * q_stride_h
            + dims[None, :] * q_stride_d,
            mask=q_mask,
            other=0.0,
        )
        # the interpreter's bf16 dot is wrong: K and V are cast in the loop too
        if DOT_IN_FP32:
            q = q.to(tl.float32)

        # running max of the scores (log2 units)
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], dtype=tl.float32)  # running sum of exp2(score - m_i)
        # running sum of exp2(score - m_i) * v
        acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
        for tile in range(start, stop, BLOCK_N):
            pos = tile + tl.arange(0, BLOCK_N)
            pos_mask = pos < stop
            block_ids = tl.load(
                block_table_ptr + seq * bt_stride_b + (pos // block_size) * bt_stride_n,
                mask=pos_mask,
                other=0,
            ).to(tl.int64)
            rows = pos % block_size
            tile_mask = pos_mask[:, None] & dim_mask[None, :]
            k_off = (
                block_ids[:, None] * kc_stride_b
                + rows[:, None] * kc_stride_s
                + kv_head * kc_stride_h
            )
            k = tl.load(
                k_cache_ptr + k_off + dims[None, :] * kc_stride_d, mask=tile_mask, other=0.0
            )
            v_off = (
                block_ids[:, None] * vc_stride_b
                + rows[:, None] * vc_stride_s
                + kv_head * vc_stride_h
            )
            v = tl.load(
                v_cache_ptr + v_off + dims[None, :] * vc_stride_d, mask=tile_mask, other=0.0
            )
            if DOT_IN_FP32:
                k, v = k.to(tl.float32), v.to(tl.float32)
            # [BLOCK_G, BLOCK_N]; ieee: fp32 stays fp32
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
            scores = tl.where(pos_mask[None, :], scores * scale_log2, float("-inf"))
            # The chunk's first position is in its first tile and valid: m_new is finite from
            # then on.
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            alpha = tl.exp2(m_i - m_new)  # rescales what was summed under the old max
            p = tl.exp2(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            m_i = m_new
        if SPLIT:  # leave this chunk's (m, l, acc) for the merge kernel
            part = seq * pm_stride_b + heads * pm_stride_h + split * pm_stride_s
            tl.store(part_m_ptr + part, m_i, mask=row_mask)
            tl.store(part_l_ptr + part, l_i, mask=row_mask)
            part_acc = seq * pa_stride_b + heads[:, None] * pa_stride_h + split * pa_stride_s
            tl.store(part_acc_ptr + part_acc + dims[None, :] * pa_stride_d, acc, mask=q_mask)
        else:  # the whole context was this chunk: the answer is acc / l
            out = acc / l_i[:, None]
            tl.store(
                out_ptr
                + seq * out_stride_b
                + heads[:, None] * out_stride_h
                + dims[None, :] * out_stride_d,
                out.to(out_ptr.dtype.element_ty),
                mask=q_mask,
            )

    @triton.jit
    def _merge_decode_splits_kernel(
        out_ptr,
        part_m_ptr,
        part_l_ptr,
        part_acc_ptr,
        cache_seqlens_ptr,
        out_stride_b,
        out_stride_h,
        out_stride_d,
        pm_stride_b,
        pm_stride_h,
        pm_stride_s,
        pa_stride_b,
        pa_stride_h,
        pa_stride_s,
        pa_stride_d,
        head_dim,
        tokens_per_split,
        BLOCK_S: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # One program per (sequence, query head): the online-softmax step, applied to whole
        # chunks.
        seq = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        seqlen = tl.load(cache_seqlens_ptr + seq)
        splits = tl.arange(0, BLOCK_S)
        # chunks that hold part of this context
        split_mask = splits < tl.cdiv(seqlen, tokens_per_split)
        part = seq * pm_stride_b + head * pm_stride_h + splits * pm_stride_s
        m = tl.load(part_m_ptr + part, mask=split_mask, other=float("-inf"))
        l = tl.load(part_l_ptr + part, mask=split_mask, other=0.0)
        m_max = tl.max(m, axis=0)  # chunk 0 always holds position 0: finite
        weight = tl.exp2(m - m_max)  # each chunk's rescale factor (0 for the masked ones)
        dims = tl.arange(0, BLOCK_D)
        dim_mask = dims < head_dim
        part_acc = (
            seq * pa_stride_b
            + head * pa_stride_h
            + splits[:, None] * pa_stride_s
            + dims[None, :] * pa_stride_d
        )
        acc = tl.load(
            part_acc_ptr + part_acc, mask=split_mask[:, None] & dim_mask[None, :], other=0.0
        )
        out = tl.sum(acc * weight[:, None], axis=0) / tl.sum(l * weight, axis=0)
        tl.store(
            out_ptr + seq * out_stride_b + head * out_stride_h + dims * out_stride_d,
            out.to(out_ptr.dtype.element_ty),
            mask=dim_mask,
        )

    @triton.jit
    def _paged_prefill_kernel(
        q_ptr,
        k_cache_ptr,
        v_cache_ptr,
        out_ptr,
        cu_seqlens_q_ptr,
        cu_seqlens_k_ptr,
        block_table_ptr,
        q_stride_t,
        q_stride_h,
        q_stride_d,
        kc_stride_b,
        kc_stride_s,
        kc_stride_h,
        kc_stride_d,
        vc_stride_b,
        vc_stride_s,
        vc_stride_h,
        vc_stride_d,
        out_stride_t,
        out_stride_h,
        out_stride_d,
        bt_stride_b,
        bt_stride_n,
        scale_log2,
        block_size,
        head_dim,
        group_size,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
        DOT_IN_FP32: tl.constexpr,
    ):
        # One program per (sequence, query head, tile of BLOCK_M queries).
        seq = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        q_tile = tl.program_id(2)
        kv_head = head // group_size
        q_start = tl.load(cu_seqlens_q_ptr + seq).to(tl.int64)
        q_len = tl.load(cu_seqlens_q_ptr + seq + 1).to(tl.int64) - q_start
        k_len = tl.load(cu_seqlens_k_ptr + seq + 1).to(tl.int64) - tl.load(
            cu_seqlens_k_ptr + seq
        ).to(tl.int64)
        if q_tile * BLOCK_M >= q_len:  # the grid is sized for the longest sequence
            return
        rows = q_tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < q_len
        q_pos = k_len - q_len + rows  # queries are the last q_len positions of the context
        dims = tl.arange(0, BLOCK_D)
        dim_mask = dims < head_dim
        q_off = (
            (q_start + rows)[:, None] * q_stride_t
            + head * q_stride_h
            + dims[None, :] * q_stride_d
        )
        q = tl.load(q_ptr + q_off, mask=row_mask[:, None] & dim_mask[None, :], other=0.0)
        # the interpreter's bf16 dot is wrong, and fp32 inputs should not drop to tf32
        if DOT_IN_FP32:
            q = q.to(tl.float32)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        # Causal: no query of this tile looks past the position of its last query.
        hi = tl.minimum(k_len, k_len - q_len + (q_tile + 1) * BLOCK_M)
        for start in range(0, hi, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            pos_mask = pos < k_len
            block_ids = tl.load(
                block_table_ptr + seq * bt_stride_b + (pos // block_size) * bt_stride_n,
                mask=pos_mask,
                other=0,
            ).to(tl.int64)
            key_rows = pos % block_size
            tile_mask = pos_mask[:, None] & dim_mask[None, :]
            k_off = (
                block_ids[:, None] * kc_stride_b
                + key_rows[:, None] * kc_stride_s
                + kv_head * kc_stride_h
            )
            k = tl.load(
                k_cache_ptr + k_off + dims[None, :] * kc_stride_d, mask=tile_mask, other=0.0
            )
            v_off = (
                block_ids[:, None] * vc_stride_b
                + key_rows[:, None] * vc_stride_s
                + kv_head * vc_stride_h
            )
            v = tl.load(
                v_cache_ptr + v_off + dims[None, :] * vc_stride_d, mask=tile_mask, other=0.0
            )
            if DOT_IN_FP32:
                scores = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                scores = tl.dot(q, tl.trans(k))
            scores = scores * scale_log2
            visible = pos_mask[None, :] & (pos[None, :] <= q_pos[:, None])
            scores = tl.where(visible, scores, float("-inf"))
            # Key 0 is visible to every row (q_pos >= 0) and sits in the first tile: m_new
            # stays finite.
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
        out_off = (
            (q_start + rows)[:, None] * out_stride_t
            + head * out_stride_h
            + dims[None, :] * out_stride_d
        )
        tl.store(
            out_ptr + out_off,
            out.to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None] & dim_mask[None, :],
        )


#: Bytes of the q, K and V tiles one decode program feeds to ``tl.dot`` (checked by compiling
# for sm_80).
DECODE_TILE_BYTES = 48 * 1024


def decode_tiles(
    head_dim: int, group_size: int, dtype: torch.dtype, interpret: bool = INTERPRET
) -> tuple[int, int, int]:
    """(BLOCK_G, BLOCK_N, BLOCK_D) for decode: query heads of a group per program, keys per
    tile, head_dim padded.

    ``tl.dot`` wants every side >= 16, so a GQA group is padded to 16 rows (decode reads
    memory, so the idle rows cost arithmetic, not time). Wide rows (fp32, head_dim 256) get
    fewer keys per tile and fewer heads per program, so the tiles fit in shared memory; a group
    larger than BLOCK_G takes several programs.
    """
    block_d = max(16, next_power_of_2(head_dim))
    if interpret:
        return 16, 16, block_d  # tests use tiny shapes; small tiles waste the least work
    row_bytes = block_d * (4 if dtype == torch.float32 else 2)
    block_n = 64
    while block_n > 16 and (16 + 2 * block_n) * row_bytes > DECODE_TILE_BYTES:
        block_n //= 2
    block_g = min(max(16, next_power_of_2(group_size)), 64)
    while block_g > 16 and (block_g + 2 * block_n) * row_bytes > DECODE_TILE_BYTES:
        block_g //= 2
    return block_g, block_n, block_d


def prefill_tiles(
    head_dim: int, dtype: torch.dtype, interpret: bool = INTERPRET
) -> tuple[int, int, int]:
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


# --- split-KV (flash-decoding): how many chunks per context

#: Aim for this many decode programs per SM, so that enough loads are in flight to keep memory
# busy.
#: A first guess for sm_80/sm_90, to be checked with `benchmarks/kernels_gpu.py` (it sweeps
# num_splits).
PROGRAMS_PER_SM = 4
#: Never cut a context into chunks shorter than this: every chunk's partial result is written
# and read again.
MIN_TOKENS_PER_SPLIT = 256
#: At most this many chunks per context: the merge kernel holds all of a head's partial results
# in one tile.
MAX_SPLITS = 64


def num_kv_splits(num_programs: int, max_seqlen: int, num_sms: int) -> int:
    """How many chunks to cut each context into, for `num_programs` (sequence, KV head)
    programs on `num_sms` SMs.

    One chunk when the programs already fill the GPU; otherwise enough chunks to give every SM
    ``PROGRAMS_PER_SM`` programs, but none shorter than ``MIN_TOKENS_PER_SPLIT`` tokens.
    """
    target = PROGRAMS_PER_SM * num_sms
    if num_programs < 1 or num_programs >= target:
        return 1
    wanted = -(-target // num_programs)
    return max(1, min(wanted, max_seqlen // MIN_TOKENS_PER_SPLIT, MAX_SPLITS))


@functools.cache
def streaming_multiprocessors(device: torch.device) -> int:
    """The SM count of a CUDA device (asked once per device); 0 elsewhere: no GPU to fill (the
    interpreter runs one program after another, so splitting would only add work)."""
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).multi_processor_count


def split_plan(
    q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor, num_splits: int = 0
) -> tuple[int, int]:
    """(chunks, tokens per chunk) a decode launch uses; ``num_splits`` 0 asks `num_kv_splits`.

    Chunks are sized from the block table's capacity, an upper bound of every context that
    needs no device-to-host copy; a chunk that lies past a shorter sequence's end returns at
    once.
    """
    reference.check_num_splits(num_splits)
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    capacity = max(1, block_table.shape[1] * k_cache.shape[1])
    if num_splits == 0:
        block_g = decode_tiles(head_dim, num_heads // num_kv_heads, q.dtype)[0]
        programs = batch * num_kv_heads * -(-(num_heads // num_kv_heads) // block_g)
        num_splits = num_kv_splits(programs, capacity, streaming_multiprocessors(q.device))
    tokens_per_split = -(-capacity // num_splits)
    # only chunks that can hold a token
    return -(-capacity // tokens_per_split), tokens_per_split


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    softmax_scale: float | None = None,
    num_splits: int = 0,
) -> torch.Tensor:
    """Attention of one query token per sequence over its paged context. Same contract as the
    torch twin.

    ``num_splits`` as in flash-attn's ``flash_attn_with_kvcache``: 0 picks the number of
    context chunks automatically (``num_kv_splits``), 1 never splits, n > 1 cuts each context
    into n chunks.
    """
    check_triton_device(q)
    reference.check_decode_args(q, k_cache, v_cache, cache_seqlens, block_table, num_splits)
    check_head_dim(q.shape[2])
    scale = reference.resolve_softmax_scale(softmax_scale, q.shape[2])
    return launch_paged_decode(
        q, k_cache, v_cache, cache_seqlens, block_table, scale, num_splits
    )


def launch_paged_decode(
    q, k_cache, v_cache, cache_seqlens, block_table, scale: float, num_splits: int = 0
) -> torch.Tensor:
    """Launch the decode kernel (and the merge, when the contexts are split: `split_plan`)
    without any checks."""
    batch, num_heads, head_dim = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    block_g, block_n, block_d = decode_tiles(head_dim, group, q.dtype)
    head_tiles = -(-group // block_g)
    num_splits, tokens_per_split = split_plan(q, k_cache, block_table, num_splits)
    cache_seqlens = cache_seqlens.contiguous()
    split = num_splits > 1
    if split:
        part_m = torch.empty(
            batch, num_heads, num_splits, dtype=torch.float32, device=q.device
        )
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(
            batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
        )
    else:  # the kernel writes `out` itself; the partial-result arguments are never touched
        part_m = part_l = part_acc = out.new_empty((1, 1, 1, 1), dtype=torch.float32)
    _paged_decode_kernel[(batch, num_kv_heads * head_tiles, num_splits)](
        q,
        k_cache,
        v_cache,
        out,
        part_m,
        part_l,
        part_acc,
        cache_seqlens,
        block_table,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *out.stride(),
        *block_table.stride(),
        *part_m.stride()[:3],
        *part_acc.stride(),
        scale * LOG2_E,
        block_size,
        head_dim,
        group,
        head_tiles,
        tokens_per_split,
        BLOCK_G=block_g,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        SPLIT=split,
        DOT_IN_FP32=INTERPRET or q.dtype == torch.float32,
    )
    if split:
        _merge_decode_splits_kernel[(batch, num_heads)](
            out,
            part_m,
            part_l,
            part_acc,
            cache_seqlens,
            *out.stride(),
            *part_m.stride(),
            *part_acc.stride(),
            head_dim,
            tokens_per_split,
            BLOCK_S=next_power_of_2(num_splits),
            BLOCK_D=next_power_of_2(head_dim),
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
    """Varlen causal attention over contexts read through the block table. Same contract as the
    torch twin."""
    check_triton_device(q)
    q_lens, _ = reference.check_prefill_args(
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
    check_head_dim(head_dim)
    scale = reference.resolve_softmax_scale(softmax_scale, head_dim)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    longest = max(q_lens, default=0)
    if longest == 0:
        return out
    block_m, block_n, block_d = prefill_tiles(head_dim, q.dtype)
    grid = (len(q_lens), num_heads, math.ceil(longest / block_m))
    _paged_prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        cu_seqlens_q.contiguous(),
        cu_seqlens_k.contiguous(),
        block_table,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *out.stride(),
        *block_table.stride(),
        scale * LOG2_E,
        k_cache.shape[1],
        head_dim,
        num_heads // k_cache.shape[2],
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        DOT_IN_FP32=INTERPRET or q.dtype == torch.float32,
    )
    return out
