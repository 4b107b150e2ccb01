"""DeepSeek V4's per-layer KV-cache inventory, in the order vLLM registers the caches.

A V4 decoder layer owns up to five caches. Which ones depends on its `compress_ratio`:

- ratio 4 (CSA, "c4a"): indexer k-cache, indexer compressor state, SWA cache, main compressed
  attention, attention compressor state;
- ratio 128 (HCA, "c128a"): SWA cache, main compressed attention, attention compressor state;
- ratio 0 or 1 (pure sliding window; Flash's first two layers, the MTP layer): SWA cache only.

The dict order matters: it decides the grouping buckets, the MLA group's layer order and every
byte offset in the packed slab (spec 2.1). Names look like `layers.2.indexer.k_cache` so the
layer index and the cache kind can be read off; `short_name` gives `L2.idx`.
"""

from __future__ import annotations

from dataclasses import dataclass

from refimpl.hybrid.grouping import group_and_unify_kv_cache_specs
from refimpl.hybrid.specs import KVCacheGroupSpec, KVCacheSpec, MLAAttentionSpec, SlidingWindowMLASpec


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


def _alternating(first: list[int], n_rest: int) -> tuple[int, ...]:
    return tuple(first + [4 if i % 2 == 0 else 128 for i in range(n_rest)])


# Pro: 61 layers, [128, 128] then 4, 128, 4, ... ending with 4 (30 x ratio 4, 31 x ratio 128).
PRO = DeepseekV4Config("deepseek-v4-pro", _alternating([128, 128], 59))
# Flash: 43 layers, [0, 0] then 4, 128, ... ending with 4 (2 pure SWA, 21 x 4, 20 x 128).
FLASH = DeepseekV4Config("deepseek-v4-flash", _alternating([0, 0], 41))
CONFIGS = {"pro": PRO, "flash": FLASH}

CACHE_DTYPES = ("fp8_ds_mla", "bfloat16")
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
    """Tokens per compressor-state block: 4 for ratio 4, 8 for ratio 128 (hard-coded in vLLM)."""
    return {4: 4, 128: 8}[ratio]


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


def short_name(name: str, spec: KVCacheSpec | None = None) -> str:
    """A compact label such as `L2.idx`, `L3.c128` or `L2.c4_state`.

    With a spec, the main attention and its state are labelled by compress ratio.
    """
    try:
        layer, kind = parse_layer_name(name)
    except ValueError:
        return name
    if kind in ("attn", "attn_state") and spec is not None:
        ratio = getattr(spec, "compress_ratio", 1)
        if kind == "attn_state":  # states keep ratio 1; their window says which compressor
            ratio = 4 if getattr(spec, "sliding_window", None) == 8 else 128
        kind = f"c{ratio}" + ("_state" if kind == "attn_state" else "")
    return f"L{layer}.{kind}"


def kv_cache_specs(
    variant: str = "pro",
    cache_dtype: str = "fp8_ds_mla",
    indexer: str = "fp8",
    mtp: bool = False,
    block_size: int = 256,
) -> dict[str, KVCacheSpec]:
    """Every cache of a DeepSeek V4 model, {layer name: spec}, in registration order.

    `cache_dtype="fp8_ds_mla"` gives V4's 584-byte rows with 576-byte page alignment;
    "bfloat16" gives plain element-size rows aligned to 512 bytes. `mtp=True` appends the
    multi-token-prediction layer, which has only an SWA cache and registers last.
    """
    if variant not in CONFIGS:
        raise ValueError(f"variant must be one of {sorted(CONFIGS)}, got {variant!r}")
    if cache_dtype not in CACHE_DTYPES:
        raise ValueError(f"cache_dtype must be one of {CACHE_DTYPES}, got {cache_dtype!r}")
    indexer_bytes = indexer_entry_bytes(indexer)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0 \
            or block_size % 128 != 0:
        raise ValueError(f"block_size must be a positive multiple of 128 (the largest compress "
                         f"ratio), got {block_size!r}")
    config = CONFIGS[variant]
    fp8 = cache_dtype == "fp8_ds_mla"
    alignment = 576 if fp8 else 512
    row_dtype = "uint8" if fp8 else "bfloat16"

    def swa() -> SlidingWindowMLASpec:
        return SlidingWindowMLASpec(
            block_size=config.swa_block_size, num_kv_heads=1, head_size=config.head_dim,
            dtype=row_dtype, sliding_window=config.sliding_window, cache_dtype_str=cache_dtype,
            alignment=alignment, model_version="deepseek_v4",
        )

    def main_attention(ratio: int) -> MLAAttentionSpec:
        return MLAAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=config.head_dim, dtype=row_dtype,
            compress_ratio=ratio, cache_dtype_str=cache_dtype, alignment=alignment,
            model_version="deepseek_v4",
        )

    def indexer_cache() -> MLAAttentionSpec:
        # No model_version and no cache_dtype_str: plain uint8 rows of `indexer_bytes`.
        return MLAAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=indexer_bytes, dtype="uint8",
            compress_ratio=4, alignment=alignment,
        )

    def compressor_state(ratio: int, head_dim: int) -> SlidingWindowMLASpec:
        coff = 2 if ratio == 4 else 1  # ratio-4 compressors keep two overlapping windows
        return SlidingWindowMLASpec(
            block_size=compressor_state_block_size(ratio), num_kv_heads=1,
            head_size=2 * coff * head_dim,  # kv state + score state, fp32
            dtype="float32", sliding_window=coff * ratio, alignment=alignment,
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


def layer_kinds(specs: dict[str, KVCacheSpec]) -> dict[str, int]:
    """How many caches of each short kind (c4, c128, idx, swa, ...) the inventory holds."""
    counts: dict[str, int] = {}
    for name, spec in specs.items():
        kind = short_name(name, spec).split(".", 1)[1]
        counts[kind] = counts.get(kind, 0) + 1
    return counts


# --- Layouts the seed and older vLLM versions describe, kept for comparison -----------------

def seed_layer_order(names: list[str]) -> list[str]:
    """Reorder MLA-group names the way the seed's offset example does: per layer the main
    attention first, then the indexer (vLLM registers the indexer first)."""
    rank = {"attn": 0, "idx": 1}
    return sorted(names, key=lambda n: (parse_layer_name(n)[0], rank.get(parse_layer_name(n)[1], 2)))


def seed_two_group_layout(specs: dict[str, KVCacheSpec], seed_order: bool = False) -> list[KVCacheGroupSpec]:
    """The seed's hypothetical plan: one MLA group and one unsplit SWA group (states left out).

    The real grouping never builds it (the gcd rule always splits the SWA bucket); it is here
    so its stride (2,283,840 B for Pro) can be compared with the real one. `seed_order=True`
    lists each ratio-4 layer's main attention before its indexer, as the seed's offsets assume.
    """
    grouped = group_and_unify_kv_cache_specs(specs)
    if grouped is None:
        raise ValueError("these specs do not take the DeepSeek V4 grouping path")
    mla, swa = grouped[0], grouped[1]
    mla_names = list(mla.kv_cache_specs)
    if seed_order:
        mla_names = seed_layer_order(mla_names)
    return [KVCacheGroupSpec(mla_names, mla), KVCacheGroupSpec(list(swa.kv_cache_specs), swa)]


# --- The seed's tables, as data, and the code's answer to each -------------------------------

# Figures as printed in seed 001 (Pro, fp8_ds_mla, block size 256). Tests and notebooks compare
# each with what the code computes; where they differ the spec's Decisions say why.
SEED_FIGURES = {
    "compress_ratios": (128, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,
                        128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
                        4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4),
    "num_layers": 61,
    "ratio_counts": {4: 30, 128: 31},
    "token_bytes": 584,
    "alignment": 576,
    # name: (storage_block_size, real page, padded page); the indexer row uses 128 B per entry
    "pages": {"CSA": (64, 37376, 37440), "HCA": (2, 1168, 1728), "indexer": (64, 8192, 8640),
              "SWA": (64, 37376, 37440)},
    # name: (head_size, storage_block_size, compressor ratio, sliding_window, real, padded)
    "state_pages": {"Indexer.state_cache": (512, 4, 4, 8, 8192, 8640),
                    "C4A.state_cache": (2048, 4, 4, 8, 32768, 32832),
                    "C128A.state_cache": (1024, 8, 128, 128, 32768, 32832)},
    "bucket_layers": {"MLA": 91, "SWA": 61, "C4 state": 60, "C128 state": 31},
    "layer_tuples": [31, 61, 30, 31],  # order MLA, SWA, C4 state, C128 state
    "gcd": 31,
    "gcd_padding": {31: 2, 32: 7},
    "gcd_padding_per_value": {31: [0, 1, 1, 0], 32: [1, 3, 2, 1]},  # for the seed's order [31, 61, 30, 31]
    "swa_split": [31, 30],
    "group_widths": [("MLA", 1435968), ("SWA KV 1", 1160640), ("SWA KV 2", 1123200),
                     ("SWA state 1 (C4)", 1244160), ("SWA state 2 (C128)", 1017792)],
    "two_group_stride": 2283840,
    "two_group_blocks_10gib": 4701,
    "two_group_last_swa_offset": 2246400,
    "two_group_widths": {"MLA": 1435968, "SWA": 2283840},
    "two_group_swa_offsets": [("swa_0", 0), ("swa_1", 37440), ("swa_2", 74880), ("swa_3", 112320),
                              ("swa_60", 2246400)],
    # the seed's MLA-group walk: main attention before the indexer in each ratio-4 layer
    "two_group_mla_offsets": [("HCA0", 0), ("HCA1", 1728), ("CSA2", 3456), ("Indexer2", 40896),
                              ("HCA3", 49536), ("CSA4", 51264), ("Indexer4", 88704)],
    "two_group_mla_end_after_layer4": 97344,
    "layer_packing": {"swa_0": 0, "hca_0": 0, "hca_1": 1728, "csa_2": 3456, "swa_1": 37440,
                      "indexer_2": 40896, "HCA3": 49536, "CSA4": 51264, "swa_2": 74880, "Indexer4": 88704},
    "five_group_stride": 1435968,
    "five_group_blocks_10gib": 7477,
    "swa_view_shape": (64, 584),
    "swa_view_page_bytes": 37376,
}

# The seed's layer labels, mapped to this package's layer names.
SEED_LABEL_KINDS = {"swa": "swa", "hca": "attn", "csa": "attn", "indexer": "idx"}


def seed_label_to_name(label: str) -> str:
    """'CSA4' or 'swa_1' -> 'layers.4.attn' / 'layers.1.swa_cache'."""
    text = label.lower().replace("_", "")
    for prefix, kind in SEED_LABEL_KINDS.items():
        if text.startswith(prefix) and text[len(prefix):].isdigit():
            return layer_name(int(text[len(prefix):]), kind)
    raise ValueError(f"unknown seed label {label!r}")


def first_of_each_kind(specs: dict[str, KVCacheSpec]) -> dict[str, tuple[str, KVCacheSpec]]:
    """{short kind: (first layer name of that kind, its spec)} in registration order."""
    found: dict[str, tuple[str, KVCacheSpec]] = {}
    for name, spec in specs.items():
        found.setdefault(short_name(name, spec).split(".", 1)[1], (name, spec))
    return found


def page_size_rows(specs: dict[str, KVCacheSpec]) -> list[dict]:
    """One row per cache kind: entries per block, bytes per entry, real and padded page."""
    ratio_of_state = {"idx_state": 4, "c4_state": 4, "c128_state": 128}
    rows = []
    for kind, (name, spec) in first_of_each_kind(specs).items():
        rows.append({
            "kind": kind, "example": name, "spec": type(spec).__name__, "block_size": spec.block_size,
            "compress_ratio": ratio_of_state.get(kind, spec.compress_ratio),
            "storage_block_size": spec.storage_block_size, "entry_bytes": spec.entry_bytes,
            "sliding_window": getattr(spec, "sliding_window", None), "dtype": spec.dtype,
            "real_page": spec.real_page_size_bytes, "page": spec.page_size_bytes,
            "padding": spec.page_size_bytes - spec.real_page_size_bytes,
        })
    return rows
