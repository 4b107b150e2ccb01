"""Labels and table rows that describe a planned layout (for the CLI, tables and figures)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from refimpl.hybrid.kv_cache_interface import (
    KVCacheConfig,
    KVCacheGroupSpec,
    UniformTypeKVCacheSpecs,
)


@dataclass(frozen=True)
class GroupSummary:
    """One row of a layout table."""

    index: int
    kind: str
    block_size: int
    num_layers: int
    width_bytes: int
    unused_tail_bytes: int  # block_stride - width: bytes this group never touches in a block
    padding_bytes: int  # alignment padding inside its pages


def group_kind(group: KVCacheGroupSpec) -> str:
    """A short label: "MLA", "SWA" or "state w=8" style, from the group's first member."""
    spec = group.kv_cache_spec
    first = spec.first_spec if isinstance(spec, UniformTypeKVCacheSpecs) else spec
    window = getattr(first, "sliding_window", None)
    name = type(first).__name__.replace("AttentionSpec", "").replace("Spec", "")
    if window is None:
        return name
    if getattr(first, "model_version", None) == "deepseek_v4" and first.dtype in (
        "uint8",
        "bfloat16",
    ):
        return f"SWA w={window}"
    return (
        f"state bs={first.block_size} w={window}"
        if first.dtype == "float32"
        else f"{name} w={window}"
    )


def summarize_groups(groups: Sequence[KVCacheGroupSpec]) -> list[GroupSummary]:
    stride = max(g.width_bytes for g in groups) if groups else 0
    rows = []
    for i, g in enumerate(groups):
        padding = sum(
            g.page_size_of(n) - g.layer_spec(n).real_page_size_bytes for n in g.layer_names
        )
        rows.append(
            GroupSummary(
                i,
                group_kind(g),
                g.block_size,
                len(g.layer_names),
                g.width_bytes,
                stride - g.width_bytes,
                padding,
            )
        )
    return rows


def groups_in_layout_order(config: KVCacheConfig) -> list[KVCacheGroupSpec]:
    """The config's groups, each listing its layers in the order their pages sit in a block.

    Planner C lays a group out spec run by spec run (all ratio-128 pages of the MLA group, then
    all indexer pages, then all ratio-4 pages), not in registration order. The slab pictures
    (`viz.hybrid_layout.slab_text`, `draw_slab`) place a group's pages one after another in
    list order, so they show the planned offsets when given these groups. Members and widths
    are unchanged; only the order of `layer_names` follows the byte offsets.
    """
    at = {
        name: tensor.layer_offset(name)
        for tensor in config.kv_cache_tensors
        for name in tensor.shared_by
    }
    return [
        KVCacheGroupSpec(
            sorted(g.layer_names, key=at.__getitem__), g.kv_cache_spec, g.is_eagle_group
        )
        for g in config.kv_cache_groups
    ]
