"""Part II's running example: the first five decoder layers of DeepSeek V4-Pro, carried through
chapters 08a-13.

Chapters 08a and 13 run them as a tiny random model (`make_tiny_toy`: transformers'
`DeepseekV4ForCausalLM` with the same five compress ratios, 128, 128, 4, 128, 4, at tiny
sizes); chapters 09-12 plan their caches at V4-Pro's sizes (`toy_v4_specs`). Both give the
same five groups in the same order.

Five layers are the fewest of Pro's first layers that meet every cache kind and every group of
the full model: layers 0, 1 and 3 compress with ratio 128, layers 2 and 4 with ratio 4 (and so
have an indexer). Planned like Pro by the planner vLLM runs
(`kv_cache_planning.get_kv_cache_groups`), the toy's 19 caches form the same five
groups in the same order as Pro's (SWA-a, SWA-b, MLA, C128 state, C4 state), small enough to
print every layer name. With four layers the ratio-4 state bucket would hold a single layer,
the approximate gcd would fall to 1 and vLLM's planner would make nine groups (chapter 09's
self-check).
"""

from __future__ import annotations

import os
from pathlib import Path

from refimpl.hybrid import deepseek_v4
from refimpl.hybrid.kv_cache_interface import KVCacheSpec

#: How many of Pro's layers the toy keeps.
TOY_LAYERS = 5
#: The toy's (and Pro's) groups, in planner C's group order.
TOY_GROUP_LABELS = ("SWA-a", "SWA-b", "MLA", "C128 state", "C4 state")
#: The toy's compress ratios, one per layer: Pro's first five (HCA, HCA, CSA, HCA, CSA).
TOY_COMPRESS_RATIOS = deepseek_v4.PRO.compress_ratios[:TOY_LAYERS]


def toy_v4_specs(num_layers: int = TOY_LAYERS, **spec_kwargs) -> dict[str, KVCacheSpec]:
    """The caches of Pro's first `num_layers` layers, {layer name: spec}, in registration
    order.

    `spec_kwargs` go to `deepseek_v4.kv_cache_specs` (cache_dtype, indexer, block_size).
    """
    specs = deepseek_v4.kv_cache_specs("pro", **spec_kwargs)
    total = deepseek_v4.PRO.num_hidden_layers
    if (
        isinstance(num_layers, bool)
        or not isinstance(num_layers, int)
        or not 1 <= num_layers <= total
    ):
        raise ValueError(f"num_layers must be an int in 1..{total}, got {num_layers!r}")
    return {
        name: spec
        for name, spec in specs.items()
        if deepseek_v4.parse_layer_name(name)[0] < num_layers
    }


def make_tiny_toy(path: str | os.PathLike, seed: int = 0, **sizes) -> Path:
    """Write the running example as a tiny random checkpoint (`refimpl.v4.tiny.make_tiny_v4`
    with the toy's compress ratios) to `path`; return the path.

    `sizes` override the tiny model's other sizes; the layer mix is the toy's, so it is not
    one of them.
    """
    if "compress_ratios" in sizes:
        raise ValueError(
            "the running example's compress ratios are fixed: TOY_COMPRESS_RATIOS"
        )
    from refimpl.v4.tiny import make_tiny_v4  # transformers loads only when a model is built

    return make_tiny_v4(path, seed=seed, compress_ratios=TOY_COMPRESS_RATIOS, **sizes)
