"""Labels and table rows that describe a planned layout.

`python -m refimpl plan` prints them; the chapters' tables and figures use the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from refimpl.hybrid.kv_cache_interface import KVCacheGroupSpec, UniformTypeKVCacheSpecs


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
    """One `GroupSummary` per group; the unused tail is measured against the widest group."""
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
