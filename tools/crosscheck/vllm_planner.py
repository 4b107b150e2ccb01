"""The installed vLLM's planner on DeepSeek V4 specs that vLLM builds itself (only inside
`.venv-vllm`).

Nothing here reads refimpl's specs: every cache layer is one of vLLM's own DeepSeek V4 layer
classes (`DeepseekV4IndexerCache`, `CompressorStateCache`, `DeepseekV4SWACache`, and the main
attention's `get_kv_cache_spec`), constructed with the arguments vLLM's model passes them, and
each spec goes through `customize_attention_spec(backend, spec)` with the layer's own attention
backend, which is where a backend's `get_supported_kernel_block_sizes` sets the stride
alignment. Only the layer names (`layers.N.indexer.k_cache`, ...) are refimpl's, so the two
plans can be compared layer by layer.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.models.deepseek_v4.attention import (
    DeepseekV4IndexerCache,
    _resolve_dsv4_kv_cache_dtype,
)
from vllm.models.deepseek_v4.compressor import CompressorStateCache
from vllm.models.deepseek_v4.cpu.cpu_sparse import DeepseekV4CPUAttention
from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.utils import customize_attention_spec

try:  # vLLM 0.33 moved the planner out of kv_cache_utils
    from vllm.v1.core import kv_cache_planning as kv_cache_utils
except ImportError:  # vLLM 0.32
    from vllm.v1.core import kv_cache_utils

from tools.crosscheck.planner import _groups as groups_summary

# DeepSeek V4's model config numbers that vLLM's layers receive (config.json of V4 Pro/Flash).
HEAD_DIM = 512  # config.head_dim
INDEX_HEAD_DIM = 128  # config.index_head_dim
# DeepseekV4Indexer.quant_block_size: one fp32 scale per 128 fp8 values
INDEXER_QUANT_BLOCK = 128
MXFP4_BLOCK = 32  # one UE8M0 scale per 32 fp4 values


def indexer_k_cache_head_dim(indexer: str) -> int:
    """Bytes per indexer entry, as `DeepseekV4Indexer.__init__` computes `k_cache_head_dim`."""
    if indexer == "fp4":
        return INDEX_HEAD_DIM // 2 + INDEX_HEAD_DIM // MXFP4_BLOCK
    return INDEX_HEAD_DIM + INDEX_HEAD_DIM // INDEXER_QUANT_BLOCK * 4


def vllm_specs(case: dict) -> dict:
    """{layer name: vLLM spec after its backend customised it}, in vLLM's registration
    order."""
    vc = VllmConfig()
    vc.cache_config.block_size = case["block_size"]
    vc.cache_config.cache_dtype = case["cache_dtype"]
    attention_cls = DeepseekV4CPUAttention  # the installed platform's V4 attention layer
    fp8_layout = case["cache_dtype"] == "fp8_ds_mla"
    kv_cache_dtype, kv_torch_dtype = _resolve_dsv4_kv_cache_dtype(
        fp8_layout, case["cache_dtype"], vc.cache_config
    )
    layers: list[tuple[str, object, type]] = []  # (name, spec before customising, backend)

    def add(name: str, layer) -> None:
        layers.append((name, layer.get_kv_cache_spec(vc), layer.get_attn_backend()))

    ratios = list(case["ratios"]) + ([0] if case["mtp"] else [])
    with set_current_vllm_config(vc):
        for i, ratio in enumerate(ratios):
            if ratio == 4:
                add(
                    f"layers.{i}.indexer.k_cache",
                    DeepseekV4IndexerCache(
                        head_dim=indexer_k_cache_head_dim(case["indexer"]),
                        dtype=torch.uint8,
                        prefix=f"layers.{i}.indexer.k_cache",
                        cache_config=vc.cache_config,
                        compress_ratio=4,
                    ),
                )
                add(
                    f"layers.{i}.indexer.compressor.state_cache",
                    CompressorStateCache(
                        state_dim=2 * 2 * INDEX_HEAD_DIM,
                        dtype=torch.float32,
                        compress_ratio=4,
                        prefix=f"layers.{i}.indexer.compressor.state_cache",
                    ),
                )
            add(
                f"layers.{i}.swa_cache",
                DeepseekV4SWACache(
                    head_dim=HEAD_DIM,
                    window_size=case["sliding_window"],
                    dtype=kv_torch_dtype,
                    prefix=f"layers.{i}.swa_cache",
                    cache_config=vc.cache_config,
                    backend_cls=attention_cls.swa_backend_cls,
                ),
            )
            if ratio > 1:
                attn = SimpleNamespace(
                    compress_ratio=ratio,
                    kv_cache_dtype=kv_cache_dtype,
                    head_dim=HEAD_DIM,
                    kv_cache_torch_dtype=kv_torch_dtype,
                )
                layers.append(
                    (
                        f"layers.{i}.attn",
                        attention_cls.get_kv_cache_spec(attn, vc),
                        attention_cls.backend_cls,
                    )
                )
                coff = 2 if ratio == 4 else 1
                add(
                    f"layers.{i}.compressor.state_cache",
                    CompressorStateCache(
                        state_dim=2 * coff * HEAD_DIM,
                        dtype=torch.float32,
                        compress_ratio=ratio,
                        prefix=f"layers.{i}.compressor.state_cache",
                    ),
                )
    return {name: customize_attention_spec(backend, spec) for name, spec, backend in layers}


def kernel_block_sizes(case: dict) -> dict:
    """{cache kind: the kernel block sizes its backend reports}, for the report."""
    specs = vllm_specs(case)
    return {name.split(".", 2)[2]: spec.block_stride_alignment for name, spec in specs.items()}


def vllm_config(mtp: bool):
    spec_config = None
    if mtp:
        spec_config = SimpleNamespace(
            use_eagle=lambda: True, use_eagle_block_drop=lambda: True, method="mtp"
        )
    return SimpleNamespace(
        cache_config=SimpleNamespace(
            get_resolved_kv_cache_layout=lambda: KVCacheLayout.BLHNC,
            num_gpu_blocks_override=None,
            prefix_cache_retention_interval=0,
        ),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        attention_config=SimpleNamespace(hisparse_config=None),
        speculative_config=spec_config,
        model_config=SimpleNamespace(hf_config=SimpleNamespace(model_type="deepseek_v4")),
    )


def plan_vllm(case: dict) -> dict:
    specs = vllm_specs(case)
    cfg = vllm_config(case["mtp"])
    groups = kv_cache_utils.get_kv_cache_groups(cfg, specs)
    if case["mtp"] and "is_draft" in getattr(
        type(next(iter(specs.values()))), "__dataclass_fields__", {}
    ):
        # vLLM 0.33 flags eagle groups after grouping, in get_global_kv_cache_groups: every
        # group holding a layer whose spec says `is_draft` (the MTP layer, registered last)
        draft = {next(reversed(specs))}
        for group in groups:
            group.is_eagle_group = not draft.isdisjoint(group.layer_names)
    try:
        config = kv_cache_utils.get_kv_cache_config_from_groups(cfg, groups, case["memory"])
        if config.num_blocks < 1:
            raise ValueError
    except ValueError:
        return {"groups": groups_summary(groups), "error": "budget below one block"}
    return {
        "groups": groups_summary(groups),
        "num_blocks": config.num_blocks,
        "block_stride": max(t.block_stride for t in config.kv_cache_tensors),
        "tensors": [
            [list(t.layers), t.offset, t.layer_stride, t.block_stride, t.size]
            for t in config.kv_cache_tensors
        ],
    }
