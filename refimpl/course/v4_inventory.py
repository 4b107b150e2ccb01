"""Short labels and tables of DeepSeek V4's cache inventory, for the chapters.

`short_name` turns `layers.2.indexer.k_cache` into `L2.idx` (and the main attention of a
ratio-128 layer into `L3.c128`); `layer_kinds` counts the caches of each label,
`page_size_rows` gives one row per kind with its page sizes (chapter 08b's table). The
inventory itself is `refimpl.hybrid.deepseek_v4.kv_cache_specs`.
"""

from __future__ import annotations

from refimpl.hybrid.deepseek_v4 import parse_layer_name
from refimpl.hybrid.kv_cache_interface import KVCacheSpec


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


def layer_kinds(specs: dict[str, KVCacheSpec]) -> dict[str, int]:
    """How many caches of each short kind (c4, c128, idx, swa, ...) the inventory holds."""
    counts: dict[str, int] = {}
    for name, spec in specs.items():
        kind = short_name(name, spec).split(".", 1)[1]
        counts[kind] = counts.get(kind, 0) + 1
    return counts


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
        rows.append(
            {
                "kind": kind,
                "example": name,
                "spec": type(spec).__name__,
                "block_size": spec.block_size,
                "compress_ratio": ratio_of_state.get(kind, spec.compress_ratio),
                "storage_block_size": spec.storage_block_size,
                "entry_bytes": spec.entry_bytes,
                "sliding_window": getattr(spec, "sliding_window", None),
                "dtype": spec.dtype,
                "real_page": spec.real_page_size_bytes,
                "page": spec.page_size_bytes,
                "padding": spec.page_size_bytes - spec.real_page_size_bytes,
            }
        )
    return rows
