"""The overwrite experiment: which cached rows must survive a 256-token prefix hit?

After a request finishes, its full blocks stay in the prefix cache. A new request that shares
the first 256 tokens gets those blocks back and starts computing at position 256. Every window
is closed there, so very little of the old state is read again. To see exactly what, poison
chosen rows of the blocks the hit will reuse with NaN and run the new request: a row that is
read turns the logits into NaN (or at least changes them); a row that is not read leaves the
output bit for bit the same.

Which rows are read is watched from outside the engine: `recording_reads` wraps the model
runner's public `prepare_inputs` so that every step's `AttentionMetadata.read` (the one way a
layer reads a cache) also notes the slots in a `ReadLog`. The engine itself records nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from refimpl.v4.cache import CacheRef, read_rows, row_slots, write_rows

CACHE_KINDS = ("swa", "attn", "attn_state", "idx", "idx_state")


@dataclass
class ReadLog:
    """Every (cache name, slots) read while `recording_reads` watches a model runner."""

    reads: list[tuple[str, torch.Tensor]] = field(default_factory=list)

    def add(self, name: str, slots: torch.Tensor) -> None:
        self.reads.append((name, slots[slots >= 0].flatten().cpu().clone()))

    def slots_read(self, name: str) -> set[int]:
        return {s for n, slots in self.reads if n == name for s in slots.tolist()}


@contextmanager
def recording_reads(model_runner) -> Iterator[ReadLog]:
    """Record every cache row the model reads while the block runs.

    The runner's `prepare_inputs` is wrapped for the duration (an attribute on this one
    instance, removed afterwards): the metadata it returns reads as before and notes each read
    in the log.
    """
    if "prepare_inputs" in vars(model_runner):
        raise ValueError("this model runner is already being recorded")
    log = ReadLog()
    prepare_inputs = model_runner.prepare_inputs

    def prepare_and_watch(chunks):
        input_ids, meta = prepare_inputs(chunks)
        read = meta.read

        def read_and_note(ref: CacheRef, slots: torch.Tensor) -> torch.Tensor:
            log.add(ref.name, slots)
            return read(ref, slots)

        meta.read = read_and_note
        return input_ids, meta

    model_runner.prepare_inputs = prepare_and_watch
    try:
        yield log
    finally:
        del model_runner.prepare_inputs


def hit_block_tables(llm, prompt_ids: Sequence[int]) -> tuple[tuple[list[int], ...], int]:
    """The block table per group a new request with `prompt_ids` would get from the prefix
    cache, and the hit length in tokens (nothing is allocated)."""
    manager = llm.scheduler.kv_cache_manager
    probe = manager.make_request("overwrite-probe", list(prompt_ids))
    blocks, hit = manager.get_computed_blocks(probe)
    return blocks.get_block_ids(), hit


def poison_rows(
    llm,
    tables: tuple[list[int], ...],
    layer: int,
    kind: str,
    index: Sequence[int],
    columns: Sequence[slice] | None = None,
) -> int:
    """Set rows `index` (token positions, or entry numbers for `attn`/`idx`) of one cache to
    NaN.

    `columns` limits the poison to parts of the row (e.g. the first series of a ratio-4 state
    row). Returns how many floats were poisoned.
    """
    if kind not in CACHE_KINDS:
        raise ValueError(f"kind must be one of {CACHE_KINDS}, got {kind!r}")
    ref = getattr(llm.model_runner.kv_cache.layers[layer], kind)
    if ref is None:
        raise ValueError(f"layer {layer} has no {kind} cache")
    slot_mapping = row_slots(ref, tables[ref.group], index)
    rows = read_rows(ref, slot_mapping)
    mask = torch.zeros(rows.shape[-1], dtype=torch.bool)
    for part in columns or [slice(None)]:
        mask[part] = True
    rows[:, mask] = float("nan")
    write_rows(ref, slot_mapping, rows)
    return int(mask.sum()) * len(slot_mapping)


def rows_read_after_hit(
    llm, first: Sequence[int], second: Sequence[int], sampling_params
) -> dict:
    """Run `first`, then `second` (which shares a prefix with it) and record, for every cache,
    which rows of the blocks the hit reused were read while `second` ran.

    Returns {"hit": tokens, "caches": {name: {"ratio", "block_size", "reused", "read"}}} where
    `reused` and `read` are sorted token positions (per-token caches) or entry numbers
    (compressed caches) inside the reused blocks.
    """
    llm.generate([list(first)], sampling_params)
    tables, hit = hit_block_tables(llm, second)
    with recording_reads(llm.model_runner) as log:
        llm.generate([list(second)], sampling_params)
    caches = {}
    layers = llm.model_runner.kv_cache.layers
    for ref in [
        getattr(layer, kind)
        for layer in layers
        for kind in CACHE_KINDS
        if getattr(layer, kind) is not None
    ]:
        table = tables[ref.group]
        # positions or entry numbers the reused blocks hold
        rows = range(len(table) * ref.entries_per_block)
        # null block: no slot
        index_of = {int(s): i for i, s in zip(rows, row_slots(ref, table, rows)) if s >= 0}
        read = {index_of[s] for s in log.slots_read(ref.name) if s in index_of}
        caches[ref.name] = {
            "ratio": ref.ratio,
            "block_size": ref.block_size,
            "reused": sorted(index_of.values()),
            "read": sorted(read),
        }
    return {"hit": hit, "caches": caches}
