"""Addressing for the V4 caches: which row of which block a token or compressed entry uses.

Every cache view from `refimpl.hybrid.allocate_kv_cache` has shape
`(num_blocks, entries_per_block, row)`. A block covers `block_size` token positions and stores
`entries_per_block = block_size // ratio` rows (ratio 1 for the sliding-window and state
caches). Position p of a request lands in block `block_table[p // block_size]`; a compressed
entry e (made from tokens e·r .. e·r + r - 1) lands in block `block_table[e·r // block_size]`
at row `e % entries_per_block`. The slot is `block_id · entries_per_block + row`, the flat
index vLLM's slot mappings use; reads and writes here go through slots only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

_read_log: list[tuple[str, torch.Tensor]] | None = None


@dataclass(frozen=True)
class CacheRef:
    """One cache layer: its view, its group (whose block table addresses it) and its geometry."""

    name: str
    view: torch.Tensor  # (num_blocks, entries_per_block, row)
    group: int
    block_size: int  # token positions per block
    ratio: int  # tokens per stored entry (1 for per-token caches)

    @property
    def entries_per_block(self) -> int:
        return self.block_size // self.ratio


def slots_for_positions(block_table: list[int], positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Slots of per-token rows (ratio 1): block_table[p // block_size] * block_size + p % block_size."""
    table = torch.as_tensor(block_table, dtype=torch.long)
    return table[positions // block_size] * block_size + positions % block_size


def slots_for_entries(block_table: list[int], entries: torch.Tensor, block_size: int, ratio: int) -> torch.Tensor:
    """Slots of compressed entries: entry e sits in the block of token e * ratio."""
    table = torch.as_tensor(block_table, dtype=torch.long)
    per_block = block_size // ratio
    return table[(entries * ratio) // block_size] * per_block + entries % per_block


def slots(ref: CacheRef, block_table: list[int], index: torch.Tensor) -> torch.Tensor:
    """Slots for token positions (ratio-1 caches) or entry numbers (compressed caches)."""
    if ref.ratio == 1:
        return slots_for_positions(block_table, index, ref.block_size)
    return slots_for_entries(block_table, index, ref.block_size, ref.ratio)


def write_rows(ref: CacheRef, slot_mapping: torch.Tensor, rows: torch.Tensor) -> None:
    """Store `rows[i]` at `slot_mapping[i]` (the view aliases the packed slab, so the slab changes)."""
    per_block = ref.entries_per_block
    ref.view[slot_mapping // per_block, slot_mapping % per_block] = rows.to(ref.view.dtype)


def read_rows(ref: CacheRef, slot_mapping: torch.Tensor) -> torch.Tensor:
    """The rows stored at `slot_mapping` (a copy)."""
    if _read_log is not None:
        _read_log.append((ref.name, slot_mapping.clone()))
    per_block = ref.entries_per_block
    return ref.view[slot_mapping // per_block, slot_mapping % per_block]


@contextlib.contextmanager
def recording_reads() -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Record every (cache name, slots) read while the block runs: which rows were used."""
    global _read_log
    log: list[tuple[str, torch.Tensor]] = []
    previous, _read_log = _read_log, log
    try:
        yield log
    finally:
        _read_log = previous
