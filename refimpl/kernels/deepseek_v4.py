"""Triton kernels for DeepSeek V4's sparse attention indices (twins: `reference_v4`).

DeepSeek V4's attention reads, per query token, a sliding window of recent tokens from the SWA
cache plus a few selected compressed entries (top-k) from the ratio-4 / ratio-128 caches. The
attention kernel needs those as *slots* in the paged caches. These two kernels build them:

- `compute_swa_indices_and_lens`: one program per token; the window's positions go through the
  SWA group's block table (block size 64);
- `compute_global_topk_indices_and_lens`: one program per token; local compressed indices go
  through the MLA group's block table at the storage block size (64 or 2 entries per block).

On a machine without CUDA they run in Triton's interpreter (see `triton_setup`), which is about
1000 times slower than torch: keep shapes tiny there. Offsets are computed in int64.

The kernels trust their indices, so the wrappers check them on the host first, with the same
functions as the twins (`v4_checks`): a bad request id, position or top-k index is a ValueError
naming the argument, raised before any output is allocated or any kernel launched.
`compressed_slot_mapping` has no Triton version; `refimpl.kernels` exports the torch function.
"""

from __future__ import annotations

import torch

from refimpl.kernels import reference_v4
from refimpl.kernels.common import check_triton_device, next_power_of_2
from refimpl.kernels.reference_v4 import compressed_slot_mapping  # noqa: F401 (re-export)
from refimpl.kernels.triton_setup import HAS_TRITON, tl, triton
from refimpl.kernels.v4_checks import check_swa_index_ranges, check_topk_index_ranges

if HAS_TRITON:

    @triton.jit
    def _compute_swa_indices_and_lens_kernel(
        swa_indices_ptr,
        swa_indices_stride,
        swa_lens_ptr,
        window_size,
        query_start_loc_ptr,
        seq_lens_ptr,
        token_to_req_indices_ptr,
        is_valid_token_ptr,
        block_table_ptr,
        block_table_stride,
        block_size,
        token_offset,
        TRITON_BLOCK_SIZE: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        t = row + token_offset
        k = tl.arange(0, TRITON_BLOCK_SIZE)
        in_row = k < window_size
        valid = tl.load(is_valid_token_ptr + t) != 0
        # padding: stale request ids
        req = tl.where(valid, tl.load(token_to_req_indices_ptr + t).to(tl.int64), 0)
        q_start = tl.load(query_start_loc_ptr + req).to(tl.int64)
        q_end = tl.load(query_start_loc_ptr + req + 1).to(tl.int64)
        seq_len = tl.load(seq_lens_ptr + req).to(tl.int64)
        pos = seq_len - (q_end - q_start) + (t - q_start)
        start = tl.maximum(pos - window_size + 1, 0)
        length = tl.where(valid, pos + 1 - start, 0)
        p = start + k
        inside = in_row & (k < length)
        block = tl.load(
            block_table_ptr + req * block_table_stride + p // block_size, mask=inside, other=0
        ).to(tl.int64)
        slot = tl.where(inside, block * block_size + p % block_size, -1)
        tl.store(
            swa_indices_ptr + row * swa_indices_stride + k, slot.to(tl.int32), mask=in_row
        )
        tl.store(swa_lens_ptr + row, length.to(tl.int32))

    @triton.jit
    def _compute_global_topk_indices_and_lens_kernel(
        global_topk_indices_ptr,
        global_topk_indices_stride,
        topk_lens_ptr,
        topk_indices_ptr,
        topk_indices_stride,
        topk,
        token_to_req_indices_ptr,
        block_table_ptr,
        block_table_stride,
        block_size,
        is_valid_token_ptr,
        TRITON_BLOCK_SIZE: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        k = tl.arange(0, TRITON_BLOCK_SIZE)
        in_row = k < topk
        valid = tl.load(is_valid_token_ptr + row).to(tl.int32)
        # padding: stale request ids
        req = tl.where(valid != 0, tl.load(token_to_req_indices_ptr + row).to(tl.int64), 0)
        x = tl.load(
            topk_indices_ptr + row * topk_indices_stride + k, mask=in_row, other=-1
        ).to(tl.int64)
        # broadcast the token's flag over the row
        ok = in_row & (x >= 0) & ((k * 0 + valid) != 0)
        block = tl.load(
            block_table_ptr + req * block_table_stride + x // block_size, mask=ok, other=0
        ).to(tl.int64)
        slot = tl.where(ok, block * block_size + x % block_size, -1)
        tl.store(
            global_topk_indices_ptr + row * global_topk_indices_stride + k,
            slot.to(tl.int32),
            mask=in_row,
        )
        tl.store(topk_lens_ptr + row, tl.sum(ok.to(tl.int32), axis=0))


def compute_swa_indices_and_lens(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    token_to_req_indices: torch.Tensor,
    is_valid_token: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    window_size: int,
    token_offset: int = 0,
    num_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of `reference_v4.compute_swa_indices_and_lens` (same arguments, same
    result)."""
    num_rows = reference_v4.check_swa_inputs(
        query_start_loc,
        seq_lens,
        token_to_req_indices,
        is_valid_token,
        block_table,
        block_size,
        window_size,
        token_offset,
        num_rows,
    )
    check_swa_index_ranges(
        query_start_loc,
        seq_lens,
        token_to_req_indices,
        is_valid_token,
        block_table,
        block_size,
        token_offset,
        num_rows,
        window_size,
    )
    check_triton_device(block_table, twins="refimpl.kernels.reference_v4")
    device = block_table.device
    indices = torch.empty((num_rows, window_size), dtype=torch.int32, device=device)
    lens = torch.empty((num_rows,), dtype=torch.int32, device=device)
    if num_rows == 0:
        return indices, lens
    # no request: every row is padding (and query_start_loc has no second entry to read)
    if seq_lens.numel() == 0:
        return indices.fill_(-1), lens.zero_()
    table = block_table.contiguous()
    _compute_swa_indices_and_lens_kernel[(num_rows,)](
        indices,
        indices.stride(0),
        lens,
        window_size,
        query_start_loc.contiguous(),
        seq_lens.contiguous(),
        token_to_req_indices.contiguous(),
        is_valid_token.to(torch.int8).contiguous(),
        table,
        table.stride(0),
        block_size,
        token_offset,
        TRITON_BLOCK_SIZE=next_power_of_2(window_size),
    )
    return indices, lens


def compute_global_topk_indices_and_lens(
    topk_indices: torch.Tensor,
    token_to_req_indices: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    is_valid_token: torch.Tensor,
    *,
    compressed_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of `reference_v4.compute_global_topk_indices_and_lens`."""
    reference_v4.check_topk_inputs(
        topk_indices, token_to_req_indices, block_table, block_size, is_valid_token
    )
    check_topk_index_ranges(
        topk_indices,
        token_to_req_indices,
        block_table,
        block_size,
        is_valid_token,
        compressed_lens,
    )
    check_triton_device(block_table, twins="refimpl.kernels.reference_v4")
    num_rows, topk = topk_indices.shape
    device = block_table.device
    out = torch.empty((num_rows, topk), dtype=torch.int32, device=device)
    lens = torch.empty((num_rows,), dtype=torch.int32, device=device)
    if num_rows == 0 or topk == 0:
        lens.zero_()
        out.fill_(-1)
        return out, lens
    local = topk_indices.contiguous()
    table = block_table.contiguous()
    _compute_global_topk_indices_and_lens_kernel[(num_rows,)](
        out,
        out.stride(0),
        lens,
        local,
        local.stride(0),
        topk,
        token_to_req_indices.contiguous(),
        table,
        table.stride(0),
        block_size,
        is_valid_token.to(torch.int8).contiguous(),
        TRITON_BLOCK_SIZE=next_power_of_2(topk),
    )
    return out, lens
