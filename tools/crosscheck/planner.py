"""Planner C against the installed vLLM: random DeepSeek-V4-shaped layer mixes (ratios,
windows, indexer format, cache dtype, MTP, block size, memory budget); compare groups (members,
order, eagle flag), block count, block stride and every KVCacheTensor (layers, offset, layer
stride).

The refimpl side needs no vLLM: `plan_refimpl` is also what the recorded-oracle test replays.
"""

from __future__ import annotations

import random

from refimpl.hybrid import deepseek_v4
from refimpl.hybrid.kv_cache_planning import get_kv_cache_config, get_kv_cache_groups


def random_config(seed: int) -> dict:
    """A JSON-friendly description of one planner case."""
    rng = random.Random(seed)
    num_layers = rng.randrange(1, 24)
    pattern = rng.choice(["random", "pro-like", "flash-like"])
    if pattern == "random":
        ratios = [rng.choice([0, 4, 4, 128, 128]) for _ in range(num_layers)]
    else:
        first = [128, 128] if pattern == "pro-like" else [0, 0]
        ratios = (first + [4 if i % 2 == 0 else 128 for i in range(num_layers)])[
            : num_layers + 2
        ]
    if all(r in (0, 1) for r in ratios):
        ratios[-1] = 4
    return {
        "ratios": ratios,
        "sliding_window": rng.choice([128, 128, 64, 256, 100]),
        "cache_dtype": rng.choice(["fp8_ds_mla", "fp8_ds_mla", "bfloat16"]),
        "indexer": rng.choice(["fp8", "fp4"]),
        "mtp": rng.random() < 0.3,
        "block_size": rng.choice([128, 256, 256, 512, 1024]),
        "memory": rng.randrange(1, 64) << rng.choice([20, 24, 28]),
    }


def refimpl_specs(case: dict) -> dict:
    config = deepseek_v4.DeepseekV4Config(
        "random", tuple(case["ratios"]), sliding_window=case["sliding_window"]
    )
    return deepseek_v4.kv_cache_specs(
        config,
        cache_dtype=case["cache_dtype"],
        indexer=case["indexer"],
        mtp=case["mtp"],
        block_size=case["block_size"],
    )


def plan_refimpl(case: dict) -> dict:
    specs = refimpl_specs(case)
    groups = get_kv_cache_groups(specs, use_eagle=case["mtp"])
    try:
        config = get_kv_cache_config(groups, case["memory"])
    except ValueError:
        return {"groups": _groups(groups), "error": "budget below one block"}
    return {
        "groups": _groups(groups),
        "num_blocks": config.num_blocks,
        "block_stride": config.block_stride,
        "tensors": [
            [list(t.shared_by), t.offset, t.layer_stride, t.block_stride, t.size]
            for t in config.kv_cache_tensors
        ],
    }


def _groups(groups) -> list:
    return [[list(g.layer_names), bool(g.is_eagle_group)] for g in groups]


def plan_causes(case: dict, plan: dict) -> set[str]:
    """What one planner case exercised, for the report."""
    found = {
        f"block size {case['block_size']}",
        f"{case['indexer']} indexer",
        f"{case['cache_dtype']} cache",
    }
    if case["block_size"] > 256 and 4 in case["ratios"]:
        found.add("indexer and main attention split into 256-token kernel blocks")
    if case["mtp"]:
        found.add("MTP layer (eagle group)")
    if "error" in plan:
        found.add("budget below one block")
    return found
