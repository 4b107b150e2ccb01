"""DeepSeek V4 addressing in plain torch: slots for compressed caches, sliding-window indices
and top-k indices. The Triton kernels in `refimpl.kernels.deepseek_v4` have the same signatures
and must give the same tensors (the kernel tests compare the two).

Vocabulary (one batch of a step, tokens of all requests packed one after another):
- `query_start_loc` `[num_reqs + 1]`: request r's new tokens are rows `qsl[r] : qsl[r+1]`;
- `seq_lens` `[num_reqs]`: tokens of request r after this step (cached + new), so new token i
  of
  r sits at position `seq_len - query_len + i`;
- `token_to_req_indices` `[num_tokens]`: the request each row belongs to;
- `block_table` `[num_reqs, max_blocks]`: one group's block ids per request;
- a *slot* is `block_id * block_size + offset`; -1 means "nothing here".
"""

from __future__ import annotations

import torch

from refimpl.kernels.common import INDEX_DTYPES
from refimpl.kernels.v4_checks import (
    check_compressed_index_ranges,
    check_swa_index_ranges,
    check_topk_index_ranges,
)
from refimpl.validation import check_int_at_least, check_positive_int, is_integer


def _check_index(name: str, x: object, ndim: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")
    if x.dtype not in INDEX_DTYPES and not (
        name == "is_valid_token" and x.dtype == torch.bool
    ):
        raise ValueError(
            f"{name} must be int32 or int64{' or bool' if name == 'is_valid_token' else ''}, "
            f"got {x.dtype}"
        )
    return x


def check_swa_inputs(
    query_start_loc,
    seq_lens,
    token_to_req_indices,
    is_valid_token,
    block_table,
    block_size,
    window_size,
    token_offset,
    num_rows,
) -> int:
    """Validate the SWA kernel's inputs; return the number of output rows."""
    _check_index("query_start_loc", query_start_loc, 1)
    _check_index("seq_lens", seq_lens, 1)
    _check_index("token_to_req_indices", token_to_req_indices, 1)
    _check_index("is_valid_token", is_valid_token, 1)
    _check_index("block_table", block_table, 2)
    check_positive_int("block_size", block_size)
    check_positive_int("window_size", window_size)
    if query_start_loc.numel() != seq_lens.numel() + 1:
        raise ValueError(
            f"query_start_loc needs num_reqs + 1 = {seq_lens.numel() + 1} entries, got "
            f"{query_start_loc.numel()}"
        )
    if block_table.shape[0] < seq_lens.numel():
        raise ValueError(
            f"block_table has {block_table.shape[0]} rows for {seq_lens.numel()} requests"
        )
    check_int_at_least("token_offset", token_offset, 0)
    num_tokens = min(is_valid_token.numel(), token_to_req_indices.numel())
    if num_rows is None:
        num_rows = num_tokens - token_offset
    if not is_integer(num_rows) or num_rows < 0 or token_offset + num_rows > num_tokens:
        raise ValueError(
            f"rows token_offset .. token_offset + num_rows ({token_offset} .. "
            f"{token_offset}+{num_rows!r}) must lie "
            f"within the {num_tokens} tokens of is_valid_token and token_to_req_indices"
        )
    return num_rows


def check_topk_inputs(
    topk_indices, token_to_req_indices, block_table, block_size, is_valid_token
):
    _check_index("topk_indices", topk_indices, 2)
    _check_index("token_to_req_indices", token_to_req_indices, 1)
    _check_index("block_table", block_table, 2)
    _check_index("is_valid_token", is_valid_token, 1)
    check_positive_int("block_size", block_size)
    n = topk_indices.shape[0]
    if token_to_req_indices.numel() < n or is_valid_token.numel() < n:
        raise ValueError(
            f"token_to_req_indices and is_valid_token need >= {n} entries (one per row of "
            "topk_indices)"
        )


def _token_rows(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    tokens: torch.Tensor,
    reqs: torch.Tensor,
) -> torch.Tensor:
    """Position of each packed token inside its request."""
    qsl = query_start_loc.long()
    start, end = qsl[reqs], qsl[reqs + 1]
    return seq_lens.long()[reqs] - (end - start) + (tokens - start)


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
    """Slots of the sliding window each token attends to.

    Row i describes packed token `t = i + token_offset` at position `pos`: its window is
    positions `max(pos - W + 1, 0) .. pos`, oldest first; `lens[i]` is the window's length (<=
    W) and the rest of the row is -1. An invalid token (`is_valid_token[t]` false: padding)
    gets an all -1 row and length 0. `token_to_req_indices` and `is_valid_token` cover the
    whole batch and are read at `t`, so vLLM computes the prefill rows with `token_offset =
    num_decode_tokens`; `num_rows` (the kernel's grid size) defaults to every token from
    `token_offset` on. Returns `(indices [num_rows, window_size] int32, lens [num_rows]
    int32)`.

    Indices are checked before anything is computed (`v4_checks.check_swa_index_ranges`, one
    device sync): a valid token's request id must be a request of the batch and the token one
    of its rows, `seq_lens[r] >= query_len[r]`, and every position inside the block table;
    otherwise a ValueError names the argument. In particular a request with fewer tokens in its
    sequence than queries (`seq_len < query_len`) is an error, not an empty window: its new
    tokens would sit at negative positions.
    """
    num_rows = check_swa_inputs(
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
    if seq_lens.numel() == 0:  # no request: every row is padding
        return (
            torch.full(
                (num_rows, window_size), -1, dtype=torch.int32, device=block_table.device
            ),
            torch.zeros((num_rows,), dtype=torch.int32, device=block_table.device),
        )
    tokens = torch.arange(num_rows, device=block_table.device) + token_offset
    valid = is_valid_token.bool()[tokens]
    # padding rows may hold stale requests
    reqs = torch.where(valid, token_to_req_indices.long()[tokens], 0)
    pos = _token_rows(query_start_loc, seq_lens, tokens, reqs)
    start = (pos - window_size + 1).clamp(min=0)
    lens = torch.where(valid, pos + 1 - start, torch.zeros_like(pos))
    k = torch.arange(window_size, device=block_table.device)
    p = start[:, None] + k[None, :]
    inside = k[None, :] < lens[:, None]
    col = torch.where(inside, p // block_size, torch.zeros_like(p))
    blocks = block_table.long()[reqs[:, None], col]
    slots = torch.where(inside, blocks * block_size + p % block_size, torch.full_like(p, -1))
    return slots.to(torch.int32), lens.to(torch.int32)


def compute_global_topk_indices_and_lens(
    topk_indices: torch.Tensor,
    token_to_req_indices: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    is_valid_token: torch.Tensor,
    *,
    compressed_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn per-request compressed-entry indices into cache slots.

    `topk_indices[i, k]` is a compressed entry x of token i's request (-1 = unused); the entry
    lives in block `block_table[r, x // block_size]` at offset `x % block_size`, where
    `block_size` is the *storage* block size (64 entries for ratio 4, 2 for ratio 128).
    `lens[i]` counts the valid entries. An invalid token gets an all -1 row and length 0.
    Returns `(indices [num_tokens, K] int32, lens [num_tokens] int32)`.

    Indices of valid tokens are checked first (`v4_checks.check_topk_index_ranges`, one device
    sync): the request id must be a row of `block_table`, and each index -1 or an entry inside
    that row (below `compressed_lens[r]` too, when the per-request compressed lengths are
    given); otherwise a ValueError names the argument.
    """
    check_topk_inputs(
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
    n = topk_indices.shape[0]
    x = topk_indices.long()
    valid = is_valid_token.bool()[:n]
    # padding rows may hold stale requests
    reqs = torch.where(valid, token_to_req_indices.long()[:n], 0)
    ok = (x >= 0) & valid[:, None]
    col = torch.where(ok, x // block_size, torch.zeros_like(x))
    blocks = block_table.long()[reqs[:, None], col]
    slots = torch.where(ok, blocks * block_size + x % block_size, torch.full_like(x, -1))
    return slots.to(torch.int32), ok.sum(dim=1).to(torch.int32)


def compressed_slot_mapping(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    compress_ratio: int,
    num_tokens: int | None = None,
    slot_mapping: torch.Tensor | None = None,
) -> torch.Tensor:
    """Where each new token writes its compressed entry (ratio-4 / ratio-128 caches, indexer).

    Only every `compress_ratio`-th position produces an entry: the token at `pos` writes iff
    `(pos + 1) % compress_ratio == 0`, entry `c = pos // compress_ratio`, into slot
    `block_table[r, c // block_size] * block_size + c % block_size` with the storage block size
    (`256 // ratio`). Every other token, padding rows beyond the batch (up to `num_tokens`),
    and tokens whose own `slot_mapping` entry is -1 get -1. Returns int64 `[num_tokens]`.

    This is plain torch on any device: there is no Triton version (`refimpl.kernels` exports
    this function as it is). Indices are checked first
    (`v4_checks.check_compressed_index_ranges`): `seq_lens[r] >= query_len[r]` and every entry
    the step completes inside the block table.
    """
    _check_index("query_start_loc", query_start_loc, 1)
    _check_index("seq_lens", seq_lens, 1)
    _check_index("block_table", block_table, 2)
    check_positive_int("block_size", block_size)
    check_positive_int("compress_ratio", compress_ratio)
    check_compressed_index_ranges(
        query_start_loc, seq_lens, block_table, block_size, compress_ratio
    )
    total = int(query_start_loc[-1])
    num_tokens = total if num_tokens is None else num_tokens
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < total:
        raise ValueError(
            f"num_tokens must be an int >= the {total} tokens in query_start_loc, got "
            f"{num_tokens!r}"
        )
    if slot_mapping is not None:
        _check_index("slot_mapping", slot_mapping, 1)
        if slot_mapping.numel() < total:
            raise ValueError(
                f"slot_mapping has {slot_mapping.numel()} entries for the {total} tokens in "
                "query_start_loc"
            )
    out = torch.full((num_tokens,), -1, dtype=torch.int64, device=block_table.device)
    if total == 0:
        return out
    query_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
    reqs = torch.repeat_interleave(
        torch.arange(seq_lens.numel(), device=block_table.device), query_lens
    )
    tokens = torch.arange(total, device=block_table.device)
    pos = _token_rows(query_start_loc, seq_lens, tokens, reqs)
    writes = (pos + 1) % compress_ratio == 0
    if slot_mapping is not None:
        writes &= slot_mapping[:total].long() >= 0
    c = pos // compress_ratio
    col = torch.where(writes, c // block_size, torch.zeros_like(c))
    blocks = block_table.long()[reqs, col]
    out[:total] = torch.where(
        writes, blocks * block_size + c % block_size, torch.full_like(c, -1)
    )
    return out
