"""From an HF config to live cache views: specs -> Part II's planner -> packed slab -> views.

`build_kv_cache` runs exactly the Part II pipeline (`get_kv_cache_groups`,
`get_kv_cache_config`, `allocate_kv_cache`) on the float32 specs of `refimpl.v4.specs`, then
wraps each layer's views in `LayerCaches` with the group whose block table addresses them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from refimpl.hybrid.deepseek_v4 import layer_name
from refimpl.hybrid.kv_cache_planning import (
    get_kv_cache_bytes_per_block,
    get_kv_cache_config,
    get_kv_cache_groups,
)
from refimpl.hybrid.kv_cache_interface import KVCacheConfig
from refimpl.hybrid.tensors import allocate_kv_cache
from refimpl.v4.attention import LayerCaches
from refimpl.v4.paged import CacheRef
from refimpl.v4.specs import cache_shape_from_hf, kv_cache_specs_from_hf


@dataclass
class V4KVCache:
    """The planned config, the views of the one slab, and each layer's `LayerCaches`."""

    config: KVCacheConfig
    views: dict[str, torch.Tensor]
    layers: list[LayerCaches]

    @property
    def slab(self) -> torch.Tensor:
        """The single int8 backing tensor every view aliases."""
        first = next(iter(self.views.values()))
        return first.untyped_storage()


def build_kv_cache(hf_config: Any, num_blocks: int, block_size: int = 256) -> V4KVCache:
    """Plan and allocate `num_blocks` blocks for a DeepSeek V4 HF config (ValueError if < 2)."""
    if not isinstance(num_blocks, int) or num_blocks < 2:
        raise ValueError(f"num_blocks must be an int >= 2 (one is the null block), got {num_blocks!r}")
    specs = kv_cache_specs_from_hf(hf_config, block_size)
    groups = get_kv_cache_groups(specs)
    per_block = get_kv_cache_bytes_per_block(groups)
    config = get_kv_cache_config(groups, per_block * num_blocks, num_blocks_override=num_blocks)
    views = allocate_kv_cache(config, "cpu")
    group_of = {name: gid for gid, g in enumerate(config.kv_cache_groups) for name in g.layer_names}

    def ref(layer: int, kind: str) -> CacheRef:
        name = layer_name(layer, kind)
        gid = group_of[name]
        spec = config.kv_cache_groups[gid].layer_spec(name)
        return CacheRef(name, views[name], gid, spec.block_size, spec.compress_ratio)

    layers = []
    for i, ratio in enumerate(cache_shape_from_hf(hf_config).compress_ratios):
        if ratio == 4:
            layers.append(LayerCaches(4, ref(i, "swa"), ref(i, "attn"), ref(i, "attn_state"), ref(i, "idx"), ref(i, "idx_state")))
        elif ratio == 128:
            layers.append(LayerCaches(128, ref(i, "swa"), ref(i, "attn"), ref(i, "attn_state")))
        else:
            layers.append(LayerCaches(0, ref(i, "swa")))
    return V4KVCache(config, views, layers)
