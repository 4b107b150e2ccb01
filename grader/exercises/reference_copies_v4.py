"""The grader's own copy of exercise 6's reference function, which its broken variants edit.

Kept apart from grader.exercises.reference_copies so that only exercise 6's graders import
torch; see that module for why the grader keeps copies instead of editing the core's source.
"""

from __future__ import annotations

import torch

from refimpl.kernels.reference_v4 import check_swa_inputs
from refimpl.kernels.v4_checks import check_swa_index_ranges


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
