"""From token position to cache slot, for every kind of DeepSeek V4 cache.

Every group has its own block table; every table holds ids from the one pool. A *slot* is
`block_id * S + offset`, where S is the number of rows one block holds in that cache
(p is the token's position):

| cache                             | group table        | S (rows/block) | written at       |
|-----------------------------------|--------------------|----------------|------------------|
| sliding-window KV (SWA)           | SWA group (bs 64)  | 64             | every p          |
| compressor state, ratio 4 / 128   | state group (4, 8) | 4 / 8          | every p          |
| compressed KV, ratio 4 (+indexer) | MLA group (bs 256) | 256 // 4 = 64  | (p+1) % 4 == 0   |
| compressed KV, ratio 128          | MLA group (bs 256) | 256 // 128 = 2 | (p+1) % 128 == 0 |

The slot numbers of different layers are independent: the same slot in two layers is two places
in memory, found through each layer's own strided view (`stride(0)` = the slab's block stride).

Batch helpers build the tensors the kernels take (`query_start_loc`, `seq_lens`,
`token_to_req_indices`, `block_table`, `is_valid_token`) from plain lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

NO_SLOT = -1


def slot_for_position(block_ids: Sequence[int], position: int, block_size: int) -> int:
    """Standard slot of one position: `block_ids[position // block_size] * block_size +
    offset`.

    The null block (id 0) holds nothing: a position whose block was freed gives -1.
    """
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    j = position // block_size
    if j >= len(block_ids):
        raise ValueError(
            f"position {position} needs block {j} but the table has {len(block_ids)} blocks"
        )
    block = block_ids[j]
    return NO_SLOT if block == 0 else block * block_size + position % block_size


def compressed_slot_for_position(
    block_ids: Sequence[int], position: int, block_size: int, compress_ratio: int
) -> int:
    """Slot a token writes in a compressed cache, or -1 if it writes none.

    Only the last token of every `compress_ratio` tokens writes an entry, number
    `position // compress_ratio`; block j of the (logical `block_size`-token) table stores the
    `block_size // compress_ratio` entries of tokens `[j * block_size, (j + 1) * block_size)`.
    """
    if block_size % compress_ratio:
        raise ValueError(
            f"block_size {block_size} must be a multiple of compress_ratio {compress_ratio}"
        )
    if position < 0 or position // block_size >= len(block_ids):
        raise ValueError(
            f"position {position} lies outside the {len(block_ids)} blocks of the table"
        )
    if (position + 1) % compress_ratio:
        return NO_SLOT
    return slot_for_position(
        block_ids, position // compress_ratio, block_size // compress_ratio
    )


def dsv4_slots_for_position(
    position: int,
    mla_block_ids: Sequence[int],
    swa_block_ids: Sequence[int],
    c128_state_block_ids: Sequence[int],
    c4_state_block_ids: Sequence[int],
    block_size: int = 256,
    swa_block_size: int = 64,
    c128_state_block_size: int = 8,
    c4_state_block_size: int = 4,
) -> dict[str, int]:
    """Slot of one token position in each DeepSeek V4 cache kind (-1: writes nothing there)."""
    return {
        "swa_kv": slot_for_position(swa_block_ids, position, swa_block_size),
        "c4_kv": compressed_slot_for_position(mla_block_ids, position, block_size, 4),
        "c4_indexer": compressed_slot_for_position(mla_block_ids, position, block_size, 4),
        "c128_kv": compressed_slot_for_position(mla_block_ids, position, block_size, 128),
        "c4_state": slot_for_position(c4_state_block_ids, position, c4_state_block_size),
        "c128_state": slot_for_position(c128_state_block_ids, position, c128_state_block_size),
    }


def swa_window_positions(position: int, window: int) -> list[int]:
    """Positions a token at `position` attends to in a sliding window of `window` tokens."""
    return list(range(max(position - window + 1, 0), position + 1))


def causal_compressed_entries(position: int, compress_ratio: int) -> int:
    """How many compressed entries a token may read: entry j is complete once token
    `ratio * j + ratio - 1` exists, so a token at `position` sees `(position + 1) // ratio`."""
    return (position + 1) // compress_ratio


def short_context_topk_indices(
    positions: Sequence[int] | torch.Tensor, compress_ratio: int, topk: int
) -> torch.Tensor:
    """Local top-k indices when every usable entry fits in top-k (and ratio-128 layers, which
    have no indexer and read all their entries): row i is `0, 1, ..., n_i - 1` then -1, with
    `n_i = (pos_i + 1) // ratio`. Shape `[len(positions), topk]`, int32."""
    pos = torch.as_tensor(positions, dtype=torch.int64)
    k = torch.arange(topk, dtype=torch.int64)
    usable = (pos + 1) // compress_ratio
    return torch.where(k[None, :] < usable[:, None], k[None, :], torch.full((1, 1), -1)).to(
        torch.int32
    )


@dataclass
class BatchInputs:
    """The per-step tensors DeepSeek V4's index kernels read (one group's block table)."""

    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    seq_lens: torch.Tensor  # [num_reqs] int32
    token_to_req_indices: torch.Tensor  # [num_tokens] int32 (padding rows point at request 0)
    block_table: torch.Tensor  # [num_reqs, max_blocks] int32, padded with 0 (the null block)
    is_valid_token: torch.Tensor  # [num_tokens] bool
    positions: torch.Tensor  # [num_tokens] int64, -1 for padding rows

    @property
    def num_tokens(self) -> int:
        return self.is_valid_token.numel()


def build_batch(
    block_tables: Sequence[Sequence[int]],
    num_computed_tokens: Sequence[int],
    num_new_tokens: Sequence[int],
    num_padding_tokens: int = 0,
) -> BatchInputs:
    """Pack requests for one step: request r has `num_computed_tokens[r]` tokens cached and
    schedules `num_new_tokens[r]` new ones; `num_padding_tokens` invalid rows are appended (as
    with CUDA-graph padding)."""
    n = len(block_tables)
    if not (len(num_computed_tokens) == len(num_new_tokens) == n):
        raise ValueError(
            "block_tables, num_computed_tokens and num_new_tokens need one entry per request"
        )
    if (
        any(q < 0 for q in num_new_tokens)
        or any(c < 0 for c in num_computed_tokens)
        or num_padding_tokens < 0
    ):
        raise ValueError("token counts must be >= 0")
    qsl = [0]
    for q in num_new_tokens:
        qsl.append(qsl[-1] + q)
    seq_lens = [c + q for c, q in zip(num_computed_tokens, num_new_tokens)]
    to_req = [r for r, q in enumerate(num_new_tokens) for _ in range(q)] + [
        0
    ] * num_padding_tokens
    positions = [
        c + i for c, q in zip(num_computed_tokens, num_new_tokens) for i in range(q)
    ] + [-1] * num_padding_tokens
    width = max([len(t) for t in block_tables] + [1])
    table = torch.zeros((max(n, 1), width), dtype=torch.int32)
    for r, ids in enumerate(block_tables):
        table[r, : len(ids)] = torch.tensor(list(ids), dtype=torch.int32)
    return BatchInputs(
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        token_to_req_indices=torch.tensor(to_req, dtype=torch.int32),
        block_table=table,
        is_valid_token=torch.tensor([True] * qsl[-1] + [False] * num_padding_tokens),
        positions=torch.tensor(positions, dtype=torch.int64),
    )


def slot_mapping(batch: BatchInputs, block_size: int) -> torch.Tensor:
    """Standard slot of every row of the batch in one group: `slot_for_position` for all rows
    at once (-1 for padding rows and for positions whose block is the null block)."""
    pos = batch.positions
    valid = batch.is_valid_token
    reqs = batch.token_to_req_indices.long()
    col = torch.where(valid, pos // block_size, torch.zeros_like(pos))
    blocks = batch.block_table.long()[reqs, col]
    return torch.where(
        valid & (blocks != 0),
        blocks * block_size + pos % block_size,
        torch.full_like(pos, NO_SLOT),
    )
