"""The overwrite experiment: which cached rows must survive a 256-token prefix hit?

After a request finishes, its full blocks stay in the prefix cache. A new request that shares
the first 256 tokens gets those blocks back and starts computing at position 256. Every window
is closed there, so very little of the old state is read again. To see exactly what, poison
chosen rows of the blocks the hit will reuse with NaN and run the new request: a row that is
read turns the logits into NaN (or at least changes them); a row that is not read leaves the
output bit for bit the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from refimpl.v4.paged import read_rows, slots, write_rows

CACHE_KINDS = ("swa", "attn", "attn_state", "idx", "idx_state")


def hit_block_tables(llm, prompt_ids: Sequence[int]) -> tuple[tuple[list[int], ...], int]:
    """The block table per group a new request with `prompt_ids` would get from the prefix cache,
    and the hit length in tokens (nothing is allocated)."""
    probe = llm.manager.make_request("overwrite-probe", list(prompt_ids))
    blocks, hit = llm.manager.get_computed_blocks(probe)
    return tuple([b.block_id for b in group] for group in blocks.blocks), hit


def poison_rows(llm, tables: tuple[list[int], ...], layer: int, kind: str, index: Sequence[int],
                columns: Sequence[slice] | None = None) -> int:
    """Set rows `index` (token positions, or entry numbers for `attn`/`idx`) of one cache to NaN.

    `columns` limits the poison to parts of the row (e.g. the first series of a ratio-4 state
    row). Returns how many floats were poisoned.
    """
    if kind not in CACHE_KINDS:
        raise ValueError(f"kind must be one of {CACHE_KINDS}, got {kind!r}")
    ref = getattr(llm.kv_cache.layers[layer], kind)
    if ref is None:
        raise ValueError(f"layer {layer} has no {kind} cache")
    slot_mapping = slots(ref, tables[ref.group], torch.as_tensor(list(index), dtype=torch.long))
    rows = read_rows(ref, slot_mapping)
    mask = torch.zeros(rows.shape[-1], dtype=torch.bool)
    for part in columns or [slice(None)]:
        mask[part] = True
    rows[:, mask] = float("nan")
    write_rows(ref, slot_mapping, rows)
    return int(mask.sum()) * len(slot_mapping)
