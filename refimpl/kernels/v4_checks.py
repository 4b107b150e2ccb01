"""Range checks for the DeepSeek V4 index kernels, shared by the Triton wrappers and the torch
twins.

The shape and dtype checks (`reference_v4.check_swa_inputs`, `check_topk_inputs`) cannot see a
request id past the batch, a position past a request's block table, or a top-k index past the
compressed entries: with such an index the Triton kernel reads outside its tensors and writes a
slot made of whatever it found there (2074600449, say), and the twin raises an IndexError from
deep inside torch. These checks run on the host before any launch, on the rows the call will
compute, and raise a `ValueError` that names the argument.

The rules (only rows of valid tokens are checked: padding rows may hold anything):

- `query_start_loc` starts at 0 and never decreases, so request r's new tokens are the rows
  `query_start_loc[r] : query_start_loc[r + 1]`;
- `seq_lens[r] >= query_len[r]`: a request's new tokens are part of its sequence. A call with
  fewer tokens in a sequence than queries has no meaning (it would put new tokens at negative
  positions), so it is an error rather than an empty window;
- `token_to_req_indices[t]` of a valid token t is a request of the batch, and t is one of that
  request's rows;
- every position a sliding window reads, and every compressed entry a token writes, lies inside
  the request's block table (`block_table.shape[1] * block_size` positions or entries);
- a top-k index is -1 (unused) or an entry inside the block table, and below the request's
  compressed length when `compressed_lens` is given.

Cost: a few vectorised comparisons and reductions over tensors of batch size, on the tensors'
device, then one device-to-host copy of a handful of flags (one synchronisation with the device
per call; a second one only to word the error). On CUDA that sync waits for work already queued
on the stream, which matters inside a CUDA graph capture: validate before capturing, or call
the twins' math directly there.
"""

from __future__ import annotations

import torch


def _first(mask: torch.Tensor) -> int:
    """Index of the first True entry (error path only: this is a second sync)."""
    return int(mask.nonzero()[0, 0])


def _check_requests(query_start_loc: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """query_len per request after checking query_start_loc and seq_lens against each other."""
    qsl = query_start_loc.long()
    seq = seq_lens.long()
    query_lens = qsl[1:] - qsl[:-1]
    flags = torch.stack(
        [
            # query_start_loc has num_reqs + 1 >= 1 entries (checked with the shapes)
            qsl[0] != 0,
            (query_lens < 0).any(),
            (seq < query_lens).any(),
        ]
    ).tolist()
    if flags[0]:
        raise ValueError(
            "query_start_loc must start at 0 (the first request's first row), got "
            f"{int(qsl[0])}"
        )
    if flags[1]:
        r = _first(query_lens < 0)
        raise ValueError(
            f"query_start_loc must never decrease: request {r} would have rows "
            f"{int(qsl[r])}..{int(qsl[r + 1])}"
        )
    if flags[2]:
        r = _first(seq < query_lens)
        raise ValueError(
            f"seq_lens[{r}] = {int(seq[r])} is smaller than the request's "
            f"{int(query_lens[r])} new tokens "
            f"(query_start_loc[{r + 1}] - query_start_loc[{r}]): a sequence holds its new "
            "tokens, so seq_len >= query_len"
        )
    return query_lens


def check_swa_index_ranges(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    token_to_req_indices: torch.Tensor,
    is_valid_token: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    token_offset: int,
    num_rows: int,
    window_size: int | None = None,
) -> None:
    """Ranges for `compute_swa_indices_and_lens` (shapes already checked): see the module
    docstring. With `window_size`, every block a valid token's window reads must be a block id
    (>= 0), not the -1 padding of a block table."""
    _check_requests(query_start_loc, seq_lens)
    if num_rows == 0:
        return
    device = token_to_req_indices.device
    tokens = torch.arange(token_offset, token_offset + num_rows, device=device)
    valid = is_valid_token.bool()[tokens]
    reqs = token_to_req_indices.long()[tokens]
    num_reqs = seq_lens.numel()
    bad_req = valid & ((reqs < 0) | (reqs >= num_reqs))
    if bool(bad_req.any()):
        i = _first(bad_req)
        raise ValueError(
            f"token_to_req_indices[{int(tokens[i])}] = {int(reqs[i])} is not a request of "
            "this batch "
            f"(0 .. {num_reqs - 1}) although is_valid_token marks the token valid"
        )
    if num_reqs == 0:  # no request: every row is padding
        return
    safe = torch.where(valid, reqs, torch.zeros_like(reqs))
    qsl = query_start_loc.long()
    start, end = qsl[safe], qsl[safe + 1]
    positions = seq_lens.long()[safe] - (end - start) + (tokens - start)
    capacity = block_table.shape[1] * block_size
    flags = torch.stack(
        [
            (valid & ((tokens < start) | (tokens >= end))).any(),
            (valid & (positions >= capacity)).any(),
        ]
    ).tolist()
    if flags[0]:
        i = _first(valid & ((tokens < start) | (tokens >= end)))
        r = int(safe[i])
        raise ValueError(
            f"token_to_req_indices[{int(tokens[i])}] = {r}, but request {r}'s tokens are rows "
            f"{int(start[i])}..{int(end[i]) - 1} (query_start_loc)"
        )
    if flags[1]:
        i = _first(valid & (positions >= capacity))
        raise ValueError(
            f"token {int(tokens[i])} of request {int(safe[i])} sits at position "
            f"{int(positions[i])}, past its block_table "
            f"({block_table.shape[1]} blocks of {block_size} = {capacity} positions); "
            "seq_lens and block_table disagree"
        )
    if window_size is not None:
        first = (positions - window_size + 1).clamp(min=0) // block_size
        cols = (
            first[:, None]
            + torch.arange(-(-window_size // block_size) + 1, device=device)[None, :]
        )
        read = valid[:, None] & (cols <= (positions // block_size)[:, None])
        ids = block_table.long()[safe[:, None], cols.clamp(max=block_table.shape[1] - 1)]
        bad = read & (ids < 0)
        if bool(bad.any()):
            i, j = (int(x) for x in bad.nonzero()[0])
            raise ValueError(
                f"block_table[{int(safe[i])}, {int(cols[i, j])}] = {int(ids[i, j])} is not a "
                "block id, but token "
                f"{int(tokens[i])}'s window reads it (block ids are >= 0)"
            )


def check_topk_index_ranges(
    topk_indices: torch.Tensor,
    token_to_req_indices: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    is_valid_token: torch.Tensor,
    compressed_lens: torch.Tensor | None = None,
) -> None:
    """Ranges for `compute_global_topk_indices_and_lens` (shapes already checked): see the
    module docstring."""
    n, k = topk_indices.shape
    if compressed_lens is not None:
        if (
            not isinstance(compressed_lens, torch.Tensor)
            or compressed_lens.dim() != 1
            or compressed_lens.dtype not in (torch.int32, torch.int64)
        ):
            raise ValueError(
                "compressed_lens must be a 1-D int32 or int64 tensor (compressed entries per "
                "request) or None"
            )
        if compressed_lens.numel() < block_table.shape[0]:
            raise ValueError(
                f"compressed_lens has {compressed_lens.numel()} entries for "
                f"{block_table.shape[0]} requests (block_table rows)"
            )
    if n == 0:
        return
    valid = is_valid_token.bool()[:n]
    reqs = token_to_req_indices.long()[:n]
    num_reqs = block_table.shape[0]
    bad_req = valid & ((reqs < 0) | (reqs >= num_reqs))
    if k == 0:  # no indices to check, but the request ids must still be right
        if bool(bad_req.any()):
            _bad_topk_request(reqs, bad_req, num_reqs)
        return
    x = topk_indices.long()
    capacity = block_table.shape[1] * block_size
    safe = torch.where(bad_req | ~valid, torch.zeros_like(reqs), reqs)
    limit = torch.full_like(reqs, capacity)
    if compressed_lens is not None:
        limit = torch.minimum(limit, compressed_lens.long()[safe])
    rows = valid[:, None]
    below = rows & (x < -1)
    beyond = rows & (x >= limit[:, None])
    flags = torch.stack([bad_req.any(), below.any(), beyond.any()]).tolist()
    if flags[0]:
        _bad_topk_request(reqs, bad_req, num_reqs)
    if flags[1]:
        i, j = (int(v) for v in below.nonzero()[0])
        raise ValueError(
            f"topk_indices[{i}, {j}] = {int(x[i, j])}: an index is a compressed entry >= 0, "
            "or -1 for unused"
        )
    if flags[2]:
        i, j = (int(v) for v in beyond.nonzero()[0])
        r = int(safe[i])
        if compressed_lens is not None and int(limit[i]) < capacity:
            what = f"request {r}'s {int(limit[i])} compressed entries (compressed_lens[{r}])"
        else:
            what = (
                f"request {r}'s block_table ({block_table.shape[1]} blocks of "
                f"{block_size} = {capacity} entries)"
            )
        raise ValueError(f"topk_indices[{i}, {j}] = {int(x[i, j])} is past {what}")


def _bad_topk_request(reqs: torch.Tensor, bad_req: torch.Tensor, num_reqs: int) -> None:
    i = _first(bad_req)
    raise ValueError(
        f"token_to_req_indices[{i}] = {int(reqs[i])} is not a request of this batch (0 .. "
        f"{num_reqs - 1}, "
        f"the block_table rows) although is_valid_token marks the token valid"
    )


def check_compressed_index_ranges(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    compress_ratio: int,
) -> None:
    """Ranges for `compressed_slot_mapping`: the entries this step completes fit in each block
    table."""
    if query_start_loc.numel() != seq_lens.numel() + 1:
        raise ValueError(
            f"query_start_loc needs num_reqs + 1 = {seq_lens.numel() + 1} entries, got "
            f"{query_start_loc.numel()}"
        )
    if block_table.shape[0] < seq_lens.numel():
        raise ValueError(
            f"block_table has {block_table.shape[0]} rows for {seq_lens.numel()} requests"
        )
    query_lens = _check_requests(query_start_loc, seq_lens)
    seq = seq_lens.long()
    last_entry = seq // compress_ratio - 1  # the newest complete entry of each request
    first_new_position = seq - query_lens
    written = (
        (query_lens > 0)
        & (last_entry >= 0)
        & ((last_entry + 1) * compress_ratio - 1 >= first_new_position)
    )
    beyond = written & (last_entry // block_size >= block_table.shape[1])
    if bool(beyond.any()):
        r = _first(beyond)
        raise ValueError(
            f"request {r} writes compressed entry {int(last_entry[r])} (seq_lens[{r}] = "
            f"{int(seq[r])}, ratio {compress_ratio}), "
            f"past its block_table ({block_table.shape[1]} blocks of {block_size} entries)"
        )
