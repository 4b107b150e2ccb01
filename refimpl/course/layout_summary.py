"""The groups of a planned layout in the order their pages sit in a block (for the slab
pictures).

The labels and table rows of a layout (`group_kind`, `summarize_groups`) are in
`refimpl.plan_summary`, next to the plan command that prints them.
"""

from __future__ import annotations

from refimpl.hybrid.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec


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
