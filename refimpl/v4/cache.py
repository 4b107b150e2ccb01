"""From an HF config to live cache views: specs -> Part II's planner -> packed slab -> views.

`build_kv_cache` runs exactly the Part II pipeline on the one DeepSeek V4 spec builder
(`hybrid.deepseek_v4.kv_cache_specs`, float32 rows, sizes from the HF config), then Part II's
`get_kv_cache_groups`, `get_kv_cache_config` and `allocate_kv_cache`, and wraps each layer's
views in `LayerCaches` with the group whose block table addresses them.

Every view has shape `(num_blocks, entries_per_block, row)`; a *slot* is
`block_id * entries_per_block + row`, the flat index that Part II's addressing and the V4 index
kernels compute. `write_rows` / `read_rows` are the only two ways the model touches a view.
The slab lives on the device given to `build_kv_cache` (the engine passes its model's).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from refimpl.hybrid.addressing import slot_for_position
from refimpl.hybrid.deepseek_v4 import DeepseekV4Config, kv_cache_specs, layer_name
from refimpl.hybrid.kv_cache_interface import KVCacheConfig
from refimpl.hybrid.kv_cache_planning import (
    get_kv_cache_bytes_per_block,
    get_kv_cache_config,
    get_kv_cache_groups,
)
from refimpl.hybrid.tensors import allocate_kv_cache


@dataclass(frozen=True)
class CacheRef:
    """One cache of one layer: its view, its group (whose block table addresses it), its
    geometry."""

    name: str
    view: torch.Tensor  # (num_blocks, entries_per_block, row)
    group: int
    block_size: int  # token positions per block
    # tokens per stored entry (1 for the per-token caches: window and compressor state)
    ratio: int
    window: int | None = None  # sliding window in tokens (per-token caches only)

    @property
    def entries_per_block(self) -> int:
        return self.block_size // self.ratio


@dataclass(frozen=True)
class LayerCaches:
    """The cache views of one decoder layer (None where the layer has no such cache)."""

    ratio: int  # 0 = sliding only, 4 = CSA, 128 = HCA
    swa: CacheRef
    attn: CacheRef | None = None
    attn_state: CacheRef | None = None
    idx: CacheRef | None = None
    idx_state: CacheRef | None = None

    def refs(self) -> list[CacheRef]:
        """This layer's caches in registration order."""
        return [
            r
            for r in (self.idx, self.idx_state, self.swa, self.attn, self.attn_state)
            if r is not None
        ]


def write_rows(ref: CacheRef, slot_mapping: torch.Tensor, rows: torch.Tensor) -> None:
    """Store `rows[i]` at `slot_mapping[i]`, skipping -1 (the view aliases the slab, so the
    slab changes)."""
    keep = slot_mapping >= 0
    slots, rows = slot_mapping[keep].long(), rows[keep]
    per_block = ref.entries_per_block
    ref.view[slots // per_block, slots % per_block] = rows.to(ref.view.dtype)


def read_rows(ref: CacheRef, slots: torch.Tensor) -> torch.Tensor:
    """The rows stored at `slots` (any shape; a copy), zeros where a slot is -1."""
    per_block = ref.entries_per_block
    safe = slots.long().clamp(min=0)
    rows = ref.view[safe // per_block, safe % per_block]
    return rows.masked_fill((slots < 0).unsqueeze(-1), 0.0)


def row_slots(ref: CacheRef, block_ids: Sequence[int], index: Sequence[int]) -> torch.Tensor:
    """Slots of token positions (per-token caches) or entry numbers (compressed caches), one by
    one through Part II's `slot_for_position`: entry e sits in storage block e //
    entries_per_block."""
    slots = [slot_for_position(block_ids, int(i), ref.entries_per_block) for i in index]
    return torch.tensor(slots, dtype=torch.long, device=ref.view.device)


@dataclass
class V4KVCache:
    """The planned config, the views of the one slab, and each layer's `LayerCaches`."""

    config: KVCacheConfig
    views: dict[str, torch.Tensor]
    layers: list[LayerCaches]

    @property
    def device(self) -> torch.device:
        """Where the slab (and so every view) lives."""
        return next(iter(self.views.values())).device

    def refs(self) -> Iterator[CacheRef]:
        """Every cache of every layer, in registration order."""
        for layer in self.layers:
            yield from layer.refs()


def build_kv_cache(
    hf_config: Any,
    num_blocks: int,
    block_size: int = 256,
    device: torch.device | str = "cpu",
) -> V4KVCache:
    """Plan and allocate `num_blocks` blocks on `device` for a DeepSeek V4 HF config
    (ValueError if < 2)."""
    if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 2:
        raise ValueError(
            f"num_blocks must be an int >= 2 (one is the null block), got {num_blocks!r}"
        )
    sizes = DeepseekV4Config.from_hf_config(hf_config)
    specs = kv_cache_specs(sizes, cache_dtype="float32", block_size=block_size)
    groups = get_kv_cache_groups(specs)
    config = get_kv_cache_config(
        groups,
        get_kv_cache_bytes_per_block(groups) * num_blocks,
        num_blocks_override=num_blocks,
    )
    views = allocate_kv_cache(config, device)
    group_of = {
        name: gid for gid, g in enumerate(config.kv_cache_groups) for name in g.layer_names
    }

    def ref(layer: int, kind: str) -> CacheRef:
        name = layer_name(layer, kind)
        gid = group_of[name]
        spec = config.kv_cache_groups[gid].layer_spec(name)
        return CacheRef(
            name,
            views[name],
            gid,
            spec.block_size,
            spec.compress_ratio,
            getattr(spec, "sliding_window", None),
        )

    layers = []
    for i, ratio in enumerate(sizes.compress_ratios):
        if ratio == 4:
            layers.append(
                LayerCaches(
                    4,
                    ref(i, "swa"),
                    ref(i, "attn"),
                    ref(i, "attn_state"),
                    ref(i, "idx"),
                    ref(i, "idx_state"),
                )
            )
        elif ratio == 128:
            layers.append(
                LayerCaches(128, ref(i, "swa"), ref(i, "attn"), ref(i, "attn_state"))
            )
        else:
            layers.append(LayerCaches(0, ref(i, "swa")))
    return V4KVCache(config, views, layers)
