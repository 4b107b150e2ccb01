"""KV cache specs for a DeepSeek V4 model, read off its Hugging Face config (float32 rows).

Part II's `refimpl.hybrid.deepseek_v4.kv_cache_specs` knows only the Pro and Flash inventories
and vLLM's fp8/bf16 row formats. This engine runs in float32 on a CPU, so every cache row here
is plain float32, and the layer mix, head sizes and window come from the config of whatever
checkpoint is loaded. Names and registration order are Part II's, so the same planner, slab
and `KVCacheManager` apply unchanged.

Per layer (ratio r = the layer's compress ratio):
- `swa`: one normalised, RoPE'd kv row per token, blocks of 64 tokens, window `sliding_window`;
- `attn`: one compressed entry per r tokens, blocks of 256 tokens = 256 / r entries;
- `attn_state`: one row `[kv | score]` per token (both series for r = 4, so 4·d wide; 2·d for
  r = 128), blocks of 4 (r = 4) or 8 (r = 128) tokens, window 2r (r = 4) or r (r = 128);
- ratio 4 only: `idx` (compressed indexer keys, like `attn` at the indexer head dim) and
  `idx_state` (the indexer compressor's rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from refimpl.hybrid.deepseek_v4 import compressor_state_block_size, layer_name
from refimpl.hybrid.kv_cache_interface import KVCacheSpec, MLAAttentionSpec, SlidingWindowMLASpec

SWA_BLOCK_SIZE = 64  # vLLM's fixed SWA block (one SWA page = one c4 page in the fp8 layout)


@dataclass(frozen=True)
class V4CacheShape:
    """The few numbers of an HF DeepSeek V4 config that size the caches."""

    compress_ratios: tuple[int, ...]  # one per layer: 0 (sliding only), 4 (CSA) or 128 (HCA)
    head_dim: int
    index_head_dim: int
    sliding_window: int
    max_position_embeddings: int


def _get(config: Any, key: str) -> Any:
    return config[key] if isinstance(config, dict) else getattr(config, key)


def cache_shape_from_hf(config: Any) -> V4CacheShape:
    """Read the cache-relevant numbers from an HF config (object or dict); ValueError if unusable.

    A compress ratio other than 4 (CSA) or 128 (HCA) is refused: the state block sizes (4 and
    8 tokens) and the two-series overlap are defined only for those two.
    """
    layer_types = list(_get(config, "layer_types"))
    rates = dict(_get(config, "compress_rates") or {})
    ratios = []
    for i, kind in enumerate(layer_types):
        if kind == "sliding_attention":
            ratios.append(0)
            continue
        if kind not in ("compressed_sparse_attention", "heavily_compressed_attention"):
            raise ValueError(f"layer {i} has unknown layer type {kind!r}")
        ratio = rates.get(kind)
        expected = 4 if kind == "compressed_sparse_attention" else 128
        if ratio != expected:
            raise ValueError(
                f"layer {i} ({kind}) has compress ratio {ratio!r}; this engine supports only ratio 4 "
                f"for compressed_sparse_attention and 128 for heavily_compressed_attention"
            )
        ratios.append(ratio)
    return V4CacheShape(
        compress_ratios=tuple(ratios),
        head_dim=int(_get(config, "head_dim")),
        index_head_dim=int(_get(config, "index_head_dim")),
        sliding_window=int(_get(config, "sliding_window")),
        max_position_embeddings=int(_get(config, "max_position_embeddings")),
    )


def state_width(ratio: int, head_dim: int) -> int:
    """Floats in one compressor-state row: [kv | score], doubled for ratio 4's two series."""
    coff = 2 if ratio == 4 else 1
    return 2 * coff * head_dim


def state_window(ratio: int) -> int:
    """State rows a closing token reads back: 2r for ratio 4 (two overlapping windows), r for 128."""
    return 2 * ratio if ratio == 4 else ratio


def kv_cache_specs_from_hf(config: Any, block_size: int = 256) -> dict[str, KVCacheSpec]:
    """{cache layer name: spec} in vLLM's registration order, float32 rows, for an HF V4 config."""
    if block_size <= 0 or block_size % 128:
        raise ValueError(f"block_size must be a positive multiple of 128, got {block_size!r}")
    shape = cache_shape_from_hf(config)
    d, di = shape.head_dim, shape.index_head_dim

    def swa() -> SlidingWindowMLASpec:
        return SlidingWindowMLASpec(block_size=SWA_BLOCK_SIZE, num_kv_heads=1, head_size=d, dtype="float32",
                                    sliding_window=shape.sliding_window)

    def compressed(ratio: int, dim: int) -> MLAAttentionSpec:
        return MLAAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=dim, dtype="float32",
                                compress_ratio=ratio)

    def state(ratio: int, dim: int) -> SlidingWindowMLASpec:
        return SlidingWindowMLASpec(block_size=compressor_state_block_size(ratio), num_kv_heads=1,
                                    head_size=state_width(ratio, dim), dtype="float32",
                                    sliding_window=state_window(ratio))

    specs: dict[str, KVCacheSpec] = {}
    for layer, ratio in enumerate(shape.compress_ratios):
        if ratio == 4:
            specs[layer_name(layer, "idx")] = compressed(4, di)
            specs[layer_name(layer, "idx_state")] = state(4, di)
        specs[layer_name(layer, "swa")] = swa()
        if ratio > 1:
            specs[layer_name(layer, "attn")] = compressed(ratio, d)
            specs[layer_name(layer, "attn_state")] = state(ratio, d)
    return specs
