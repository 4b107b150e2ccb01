"""The installed vLLM's planner on a refimpl spec dict (only inside `.venv-vllm`)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from vllm.v1.attention.backend import MultipleOf
try:  # vLLM 0.33 moved the planner out of kv_cache_utils
    from vllm.v1.core import kv_cache_planning as kv_cache_utils
except ImportError:  # vLLM 0.32
    from vllm.v1.core import kv_cache_utils
from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec
from vllm.v1.kv_cache_layout import KVCacheLayout

from refimpl.hybrid import kv_cache_interface as R
from tools.crosscheck.planner import _groups, refimpl_specs


def to_vllm_spec(spec):
    """Same page sizes, kinds, windows and equalities as the refimpl spec: one stored state of
    `entry_bytes` per `compress_ratio` tokens, padded to the same alignment."""
    common = dict(block_size=spec.block_size, num_kv_heads=1, head_size=spec.entry_bytes, dtype=torch.uint8,
                  tokens_per_state=spec.compress_ratio, alignment=spec.alignment,
                  cache_dtype_str=spec.cache_dtype_str, model_version=spec.model_version)
    if spec.kernel_block_size is not None:
        common["block_stride_alignment"] = MultipleOf(spec.kernel_block_size)
    if isinstance(spec, R.SlidingWindowMLASpec):
        return SlidingWindowMLASpec(sliding_window=spec.sliding_window, **common)
    return MLAAttentionSpec(**common)


def vllm_config(mtp: bool):
    spec_config = None
    if mtp:
        spec_config = SimpleNamespace(use_eagle=lambda: True, use_eagle_block_drop=lambda: True, method="mtp")
    return SimpleNamespace(
        cache_config=SimpleNamespace(get_resolved_kv_cache_layout=lambda: KVCacheLayout.BLHNC,
                                     num_gpu_blocks_override=None, prefix_cache_retention_interval=None),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        attention_config=SimpleNamespace(hisparse_config=None),
        speculative_config=spec_config,
        model_config=SimpleNamespace(hf_config=SimpleNamespace(model_type="deepseek_v4")),
    )


def plan_vllm(case: dict) -> dict:
    ours = refimpl_specs(case)
    specs = {name: to_vllm_spec(s) for name, s in ours.items()}
    for name, s in ours.items():  # the conversion must keep every page size
        assert specs[name].page_size_bytes == s.page_size_bytes, (name, specs[name].page_size_bytes, s.page_size_bytes)
    cfg = vllm_config(case["mtp"])
    groups = kv_cache_utils.get_kv_cache_groups(cfg, specs)
    if case["mtp"] and "is_draft" in getattr(type(next(iter(specs.values()))), "__dataclass_fields__", {}):
        # vLLM 0.33 flags eagle groups later, in get_kv_cache_configs, from the draft layers'
        # `is_draft` specs (the MTP layer registers last): the same rule applied here
        draft = {next(reversed(specs))}
        for group in groups:
            group.is_eagle_group = not draft.isdisjoint(group.layer_names)
    try:
        config = kv_cache_utils.get_kv_cache_config_from_groups(cfg, groups, case["memory"])
        if config.num_blocks < 1:
            raise ValueError
    except ValueError:
        return {"groups": _groups(groups), "error": "budget below one block"}
    return {
        "groups": _groups(groups),
        "num_blocks": config.num_blocks,
        "block_stride": max(t.block_stride for t in config.kv_cache_tensors),
        "tensors": [[list(t.layers), t.offset, t.layer_stride, t.block_stride, t.size]
                    for t in config.kv_cache_tensors],
    }
