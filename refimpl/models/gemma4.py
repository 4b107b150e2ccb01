"""Gemma 4 (vLLM's gemma4.py): per-layer head sizes and cross-layer KV sharing.

- `per_layer_config` (keyed by layer index) overrides a layer's `head_dim` and
  `num_key_value_heads`: the global layers of Gemma 4 have 512-value heads where the sliding
  ones have 256, so one model mixes two page sizes.
- The last `num_kv_shared_layers` layers compute no K/V of their own: each reads the cache of
  the last earlier layer of its own type (vLLM's `kv_sharing_target_layer_name`), so they
  register no cache and the planner never sees them.
`layer_types` says which layers slide (window `sliding_window`).
"""

from __future__ import annotations

from refimpl.models import generic
from refimpl.models.config import HFConfig, kv_heads_per_rank
from refimpl.models.layers import AttentionLayer, Layer
from refimpl.models.registry import ModelLayers

ARCHITECTURES = ("Gemma4ForCausalLM",)


def layer_setting(cfg: HFConfig, index: int, key: str) -> int:
    """A layer's `key`: its per_layer_config entry (keys may be zero-padded), else the
    model's."""
    per_layer = cfg.text.get("per_layer_config") or {}
    for name in (str(index), f"{index:02d}"):
        if isinstance(per_layer.get(name), dict) and per_layer[name].get(key) is not None:
            return int(per_layer[name][key])
    return int(generic.first(cfg, (key,), f"Gemma 4's {key}"))


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    cfg = generic.text_config(cfg)
    n = generic.num_layers(cfg)
    shared = int(cfg.text.get("num_kv_shared_layers") or 0)
    if not 0 <= shared < n:
        raise ValueError(f"{cfg.source}: num_kv_shared_layers {shared} is not in [0, {n})")
    windows = generic.per_layer_windows(cfg, n, generic.sliding_window(cfg))
    layers: list[Layer] = []
    for i, window in enumerate(windows[: n - shared]):
        heads = kv_heads_per_rank(
            layer_setting(cfg, i, "num_key_value_heads"), tensor_parallel_size
        )
        size = layer_setting(cfg, i, "head_dim")
        layers.append(AttentionLayer(f"model.layers.{i}.self_attn.attn", heads, size, window))
    first = layers[0]
    return ModelLayers(layers, num_kv_heads=first.num_kv_heads, head_size=first.head_size)
