"""DeepSeek V4's per-layer KV-cache inventory, in the order vLLM registers the caches.

A V4 decoder layer owns up to five caches. Which ones depends on its `compress_ratio`:

- ratio 4 (CSA, "c4a"): indexer k-cache, indexer compressor state, SWA cache, main compressed
  attention, attention compressor state;
- ratio 128 (HCA, "c128a"): SWA cache, main compressed attention, attention compressor state;
- ratio 0 or 1 (pure sliding window; Flash's first two layers, the MTP layer): SWA cache only.

The dict order matters: it decides the grouping buckets, the MLA group's layer order and every
byte offset in the packed slab. Names look like `layers.2.indexer.k_cache` so the
layer index and the cache kind can be read off (`parse_layer_name`).

`kv_cache_specs` is the one spec builder for every DeepSeek V4 in refimpl. What differs between
uses is a parameter: the sizes (the article's Pro / Flash inventory, or a Hugging Face config
read by `DeepseekV4Config.from_hf_config`, as Part III's tiny model does) and the row format
(vLLM's fp8 or bf16 rows, or the plain float32 rows the CPU engine of Part III stores).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from refimpl.hybrid.kv_cache_interface import (
    KVCacheSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
)
from refimpl.validation import is_integer


@dataclass(frozen=True)
class DeepseekV4Config:
    """The few config numbers the cache plan needs."""

    name: str
    compress_ratios: tuple[int, ...]  # one per decoder layer (the HF list's MTP entry dropped)
    head_dim: int = 512  # main attention: 448 NoPE + 64 RoPE
    index_head_dim: int = 128
    sliding_window: int = 128
    swa_block_size: int = 64  # hard-coded in vLLM so an SWA page equals a c4a page

    @property
    def num_hidden_layers(self) -> int:
        return len(self.compress_ratios)

    @classmethod
    def from_hf_config(cls, config: Any) -> DeepseekV4Config:
        """The cache sizes of a Hugging Face DeepSeek V4 config (a `DeepseekV4Config` object or
        a config.json dict); ValueError when it is not one this package can cache.

        The layers' kinds come in one of two spellings. transformers' is `layer_types` (one
        name per layer) with `compress_rates` (the ratio of each compressed kind). The
        published checkpoints and vLLM's model use `compress_ratios`, one number per layer
        (0 or 1: sliding window only, 4: CSA, 128: HCA), which may run one entry past
        `num_hidden_layers` for the MTP layer; vLLM reads the first `num_hidden_layers`
        entries (`config.compress_ratios[layer_id]`), and transformers folds the same list
        into `layer_types`. A config that spells it both ways must say the same thing.

        A compress ratio other than 4 (CSA) or 128 (HCA) is refused: the state block sizes (4
        and 8 tokens) and the two-series overlap are defined only for those two.
        """

        def find(key: str) -> Any:
            return config.get(key) if isinstance(config, dict) else getattr(config, key, None)

        def get(key: str) -> Any:
            value = find(key)
            if value is None:
                raise ValueError(f"the config has no {key!r}: it is not a DeepSeek V4 config")
            return value

        per_layer = find("compress_ratios")
        if find("layer_types") is None and per_layer is not None:
            ratios = _ratios_from_compress_ratios(per_layer, find("num_hidden_layers"))
        else:
            if find("layer_types") is None:
                raise ValueError(
                    "the config has no 'layer_types' and no 'compress_ratios': it is not a "
                    "DeepSeek V4 config"
                )
            ratios = _ratios_from_layer_types(get("layer_types"), dict(get("compress_rates")))
            n = find("num_hidden_layers")
            if n is not None and int(n) != len(ratios):
                raise ValueError(
                    f"num_hidden_layers is {n} but layer_types lists {len(ratios)} layers"
                )
            if per_layer is not None:
                listed = _ratios_from_compress_ratios(per_layer, len(ratios))
                if listed != ratios:
                    at = next(i for i, (a, b) in enumerate(zip(listed, ratios)) if a != b)
                    raise ValueError(
                        f"compress_ratios and layer_types disagree at layer {at} (ratio "
                        f"{listed[at]} against {ratios[at]}): vLLM reads compress_ratios, "
                        "transformers layer_types"
                    )
        return cls(
            str(get("model_type")),
            ratios,
            head_dim=int(get("head_dim")),
            index_head_dim=int(get("index_head_dim")),
            sliding_window=int(get("sliding_window")),
        )


def _ratios_from_layer_types(layer_types: Any, rates: dict) -> tuple[int, ...]:
    """transformers' spelling: a layer type per layer, a ratio per compressed type."""
    ratios = []
    for i, kind in enumerate(layer_types):
        if kind == "sliding_attention":
            ratios.append(0)
            continue
        if kind not in HF_RATIO_OF_LAYER_TYPE:
            raise ValueError(f"layer {i} has unknown layer type {kind!r}")
        ratio, expected = rates.get(kind), HF_RATIO_OF_LAYER_TYPE[kind]
        if ratio != expected:
            raise ValueError(
                f"layer {i} ({kind}) has compress ratio {ratio!r}; only ratio {expected} "
                f"is supported for {kind}"
            )
        ratios.append(ratio)
    return tuple(ratios)


def _ratios_from_compress_ratios(values: Any, num_hidden_layers: Any) -> tuple[int, ...]:
    """The checkpoints' (and vLLM's) spelling: one ratio per layer, the MTP entry past the
    last decoder layer ignored, 1 read as 0 (vLLM's `max(1, ratio)`: no compression)."""
    if num_hidden_layers is None:
        raise ValueError("a config with compress_ratios needs num_hidden_layers")
    if not isinstance(values, (list, tuple)) or not all(is_integer(v) for v in values):
        raise ValueError(f"compress_ratios must be a list of whole numbers, got {values!r}")
    n = int(num_hidden_layers)
    if len(values) < n:
        raise ValueError(
            f"compress_ratios lists {len(values)} layers, fewer than num_hidden_layers {n}"
        )
    ratios = []
    for i, ratio in enumerate(values[:n]):
        ratio = int(ratio)
        if ratio not in (0, 1, *HF_RATIO_OF_LAYER_TYPE.values()):
            raise ValueError(
                f"layer {i} has compress ratio {ratio}; allowed: 0 or 1 (sliding window "
                "only), 4 (CSA), 128 (HCA)"
            )
        ratios.append(0 if ratio == 1 else ratio)
    return tuple(ratios)


#: transformers' layer type names and the one compress ratio each is defined for.
HF_RATIO_OF_LAYER_TYPE = {
    "compressed_sparse_attention": 4,
    "heavily_compressed_attention": 128,
}


def _alternating(first: list[int], n_rest: int) -> tuple[int, ...]:
    return tuple(first + [4 if i % 2 == 0 else 128 for i in range(n_rest)])


# Pro: 61 layers, [128, 128] then 4, 128, 4, ... ending with 4 (30 x ratio 4, 31 x ratio 128).
PRO = DeepseekV4Config("deepseek-v4-pro", _alternating([128, 128], 59))
# Flash: 43 layers, [0, 0] then 4, 128, ... ending with 4 (2 pure SWA, 21 x 4, 20 x 128).
FLASH = DeepseekV4Config("deepseek-v4-flash", _alternating([0, 0], 41))
CONFIGS = {"pro": PRO, "flash": FLASH}


@dataclass(frozen=True)
class RowFormat:
    """How one cache row is stored: what differs between vLLM's fp8 / bf16 caches and
    float32."""

    dtype: str  # element dtype of the SWA and main-attention rows
    # pages padded up to a multiple of this many bytes (None: no padding)
    alignment: int | None
    cache_dtype_str: str | None  # vLLM's --kv-cache-dtype, which picks the packed fp8 row
    model_version: str | None


ROW_FORMATS = {
    # 584-byte rows, 576-byte alignment
    "fp8_ds_mla": RowFormat("uint8", 576, "fp8_ds_mla", "deepseek_v4"),
    "bfloat16": RowFormat("bfloat16", 512, "bfloat16", "deepseek_v4"),
    "float32": RowFormat("float32", None, None, None),  # what Part III's CPU engine stores
}
CACHE_DTYPES = tuple(ROW_FORMATS)
INDEXER_DTYPES = ("fp8", "fp4")

# Cache kinds, in registration order within a layer; the suffix of the layer name.
KIND_SUFFIX = {
    "idx": "indexer.k_cache",
    "idx_state": "indexer.compressor.state_cache",
    "swa": "swa_cache",
    "attn": "attn",
    "attn_state": "compressor.state_cache",
}


def indexer_entry_bytes(indexer: str, index_head_dim: int = 128) -> int:
    """Bytes per compressed indexer entry.

    fp8: 128 fp8 values + one 4-byte fp32 scale per 128 values = 132.
    fp4: 64 bytes of packed nibbles + one 1-byte UE8M0 scale per 32 values = 68.
    """
    if indexer == "fp8":
        return index_head_dim + index_head_dim // 128 * 4
    if indexer == "fp4":
        return index_head_dim // 2 + index_head_dim // 32
    raise ValueError(f"indexer must be one of {INDEXER_DTYPES}, got {indexer!r}")


def compressor_state_block_size(ratio: int) -> int:
    """Tokens per compressor-state block: 4 for ratio 4, 8 for ratio 128 (hard-coded in
    vLLM)."""
    return {4: 4, 128: 8}[ratio]


def compressor_state_window(ratio: int) -> int:
    """State rows a window-closing token reads back: 2r for ratio 4 (two overlapping windows),
    r for 128."""
    return 2 * ratio if ratio == 4 else ratio


def compressor_state_width(ratio: int, head_dim: int) -> int:
    """Floats in one compressor-state row: [kv | score], both doubled for ratio 4's two
    series."""
    coff = 2 if ratio == 4 else 1
    return 2 * coff * head_dim


def layer_name(layer: int, kind: str) -> str:
    if kind not in KIND_SUFFIX:
        raise ValueError(f"unknown cache kind {kind!r}; allowed: {list(KIND_SUFFIX)}")
    return f"layers.{layer}.{KIND_SUFFIX[kind]}"


def parse_layer_name(name: str) -> tuple[int, str]:
    """`layers.2.indexer.k_cache` -> (2, "idx")."""
    prefix, _, rest = name.partition(".")
    index, _, suffix = rest.partition(".")
    for kind, kind_suffix in KIND_SUFFIX.items():
        if prefix == "layers" and index.isdigit() and suffix == kind_suffix:
            return int(index), kind
    raise ValueError(f"{name!r} is not a DeepSeek V4 cache layer name")


#: The sparse MLA backend of the main attention takes kernel blocks of exactly 256 tokens, so a
#: larger --block-size is split into 256-token kernel blocks (planner C rounds the stride for
# it).
SPARSE_MLA_KERNEL_BLOCK_SIZE = 256
#: vLLM's DeepSeek V4 indexer backend reports the same single kernel block of 256 tokens (its
#: pages of 64 compressed rows), so the indexer cache is split and rounded the same way. The
# SWA
#: backend (any multiple of 32) and the compressor backend (any size) set no kernel block.
INDEXER_KERNEL_BLOCK_SIZE = 256


def kv_cache_specs(
    variant: str | DeepseekV4Config = "pro",
    cache_dtype: str = "fp8_ds_mla",
    indexer: str | None = None,
    mtp: bool = False,
    block_size: int = 256,
) -> dict[str, KVCacheSpec]:
    """Every cache of a DeepSeek V4 model, {layer name: spec}, in registration order.

    `variant`: "pro", "flash" or any `DeepseekV4Config` (e.g.
    `DeepseekV4Config.from_hf_config`). `cache_dtype` picks the row format (`ROW_FORMATS`):
    "fp8_ds_mla" gives V4's 584-byte rows with 576-byte page alignment, "bfloat16" plain
    element-size rows aligned to 512 bytes, "float32" unpadded float32 rows (the CPU engine's).
    `indexer` is the indexer row format: "fp8" (the default for vLLM's formats) or "fp4";
    float32 caches keep float32 indexer keys, so there it must be None. `mtp=True` appends the
    multi-token-prediction layer, which has only an SWA cache and registers last.
    """
    if not isinstance(variant, DeepseekV4Config) and variant not in CONFIGS:
        raise ValueError(
            f"variant must be one of {sorted(CONFIGS)} or a DeepseekV4Config, got {variant!r}"
        )
    if cache_dtype not in ROW_FORMATS:
        raise ValueError(f"cache_dtype must be one of {CACHE_DTYPES}, got {cache_dtype!r}")
    if not isinstance(mtp, bool):
        raise TypeError(f"mtp must be True or False, got {mtp!r}")
    fmt = ROW_FORMATS[cache_dtype]
    if fmt.dtype == "float32" and indexer is not None:
        raise ValueError(
            "indexer must be None with cache_dtype 'float32' (float32 indexer keys), got "
            f"{indexer!r}"
        )
    indexer_bytes = None if fmt.dtype == "float32" else indexer_entry_bytes(indexer or "fp8")
    if not is_integer(block_size) or block_size <= 0 or block_size % 128 != 0:
        raise ValueError(
            f"block_size must be a positive multiple of 128 (the largest compress "
            f"ratio), got {block_size!r}"
        )
    config = variant if isinstance(variant, DeepseekV4Config) else CONFIGS[variant]

    def swa() -> SlidingWindowMLASpec:
        return SlidingWindowMLASpec(
            block_size=config.swa_block_size,
            num_kv_heads=1,
            head_size=config.head_dim,
            dtype=fmt.dtype,
            sliding_window=config.sliding_window,
            cache_dtype_str=fmt.cache_dtype_str,
            alignment=fmt.alignment,
            model_version=fmt.model_version,
        )

    def main_attention(ratio: int) -> MLAAttentionSpec:
        return MLAAttentionSpec(
            block_size=block_size,
            num_kv_heads=1,
            head_size=config.head_dim,
            dtype=fmt.dtype,
            compress_ratio=ratio,
            cache_dtype_str=fmt.cache_dtype_str,
            alignment=fmt.alignment,
            model_version=fmt.model_version,
            kernel_block_size=SPARSE_MLA_KERNEL_BLOCK_SIZE if fmt.model_version else None,
        )

    def indexer_cache() -> MLAAttentionSpec:
        # No model_version and no cache_dtype_str: plain rows, `indexer_bytes` uint8 or float32
        # keys.
        if indexer_bytes is None:
            return MLAAttentionSpec(
                block_size=block_size,
                num_kv_heads=1,
                head_size=config.index_head_dim,
                dtype="float32",
                compress_ratio=4,
            )
        return MLAAttentionSpec(
            block_size=block_size,
            num_kv_heads=1,
            head_size=indexer_bytes,
            dtype="uint8",
            compress_ratio=4,
            alignment=fmt.alignment,
            kernel_block_size=INDEXER_KERNEL_BLOCK_SIZE,
        )

    def compressor_state(ratio: int, head_dim: int) -> SlidingWindowMLASpec:
        return SlidingWindowMLASpec(
            block_size=compressor_state_block_size(ratio),
            num_kv_heads=1,
            head_size=compressor_state_width(ratio, head_dim),  # kv state + score state, fp32
            dtype="float32",
            sliding_window=compressor_state_window(ratio),
            alignment=fmt.alignment,
        )

    specs: dict[str, KVCacheSpec] = {}
    ratios = list(config.compress_ratios) + ([0] if mtp else [])
    for layer, ratio in enumerate(ratios):
        if ratio == 4:
            specs[layer_name(layer, "idx")] = indexer_cache()
            specs[layer_name(layer, "idx_state")] = compressor_state(4, config.index_head_dim)
        specs[layer_name(layer, "swa")] = swa()
        if ratio > 1:
            specs[layer_name(layer, "attn")] = main_attention(ratio)
            specs[layer_name(layer, "attn_state")] = compressor_state(ratio, config.head_dim)
    return specs
