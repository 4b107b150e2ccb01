"""The Part II toy: the first four decoder layers of DeepSeek V4-Pro, carried through chapters 09-12.

Four layers are enough to meet every cache kind and every group of the full model: layers 0, 1
and 3 compress with ratio 128, layer 2 with ratio 4 (and so has an indexer). Planned like Pro by
the article's planner (`older_planners.get_kv_cache_groups_b`, as chapters 09-12 use it), the toy's 14 caches form
the same five groups in the same order (MLA, SWA-a, SWA-b, C128 state, C4 state), small enough to
print every layer name.
"""

from __future__ import annotations

from refimpl.hybrid import deepseek_v4
from refimpl.hybrid.kv_cache_interface import KVCacheSpec

#: How many of Pro's layers the toy keeps.
TOY_LAYERS = 4
#: The toy's (and Pro's) groups, in the article's group order.
TOY_GROUP_LABELS = ("MLA", "SWA-a", "SWA-b", "C128 state", "C4 state")


def toy_v4_specs(num_layers: int = TOY_LAYERS, **spec_kwargs) -> dict[str, KVCacheSpec]:
    """The caches of Pro's first `num_layers` layers, {layer name: spec}, in registration order.

    `spec_kwargs` go to `deepseek_v4.kv_cache_specs` (cache_dtype, indexer, block_size).
    """
    specs = deepseek_v4.kv_cache_specs("pro", **spec_kwargs)
    total = deepseek_v4.PRO.num_hidden_layers
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers <= total:
        raise ValueError(f"num_layers must be an int in 1..{total}, got {num_layers!r}")
    return {name: spec for name, spec in specs.items() if deepseek_v4.parse_layer_name(name)[0] < num_layers}
