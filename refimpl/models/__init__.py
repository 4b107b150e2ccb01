"""From a Hugging Face config.json to the per-layer KV cache specs vLLM 0.32 builds.

    from refimpl.models import get_kv_cache_spec
    model = get_kv_cache_spec("path/to/config.json", tensor_parallel_size=2)
    model.specs          # {layer name: spec}, in vLLM's registration order
    model.block_size     # what the platform settled on, and model.notes says why

The whole pipeline, typed: `plan_model(EngineArgs(config, ...))` resolves `vllm serve`'s
settings once (`engine_args`), builds the specs and plans them (`planning`).

One small module per family lists the cache layers its vLLM model registers (llama.py: Llama,
Mistral, Qwen2, Qwen3; gemma.py; gpt_oss.py; deepseek_v2.py: V2/V3 MLA; deepseek_v4.py;
granitemoehybrid.py: Mamba2 hybrid; qwen3_next.py: gated delta net hybrid). `layers.py` turns a
layer into a spec (vLLM's layer classes), `backends.py` holds the attention backends' kernel
block sizes, and this module settles the block size as vLLM's platform does. Nothing here
imports torch, so planning from a config is fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from refimpl.hybrid import kv_cache_planning
from refimpl.hybrid.kv_cache_interface import KVCacheSpec
from refimpl.models import cpu_platform, generic, schema
from refimpl.models.backends import (
    CPU_DEFAULT_BLOCK_SIZE,
    CPU_MLA_BLOCK_SIZE,
    DEEPSEEK_V4_BLOCK_SIZE,
    DEFAULT_BLOCK_SIZE,
    AttentionBackendInfo,
    get_backend,
)
from refimpl.models.config import HFConfig, kv_cache_element_dtype
from refimpl.models.cpu_platform import (
    CPU_MLA_BACKENDS,
    check_cpu_isa,
    cpu_attention_backend,
    resolve_cpu_isa,
    with_ssm_dtype,
)
from refimpl.models.layers import CacheContext, MambaLayer
from refimpl.models.registry import ARCHITECTURES, ModelLayers, resolve_family
from refimpl.models.speculative import with_speculative_conv_rows
from refimpl.validation import check_bool, check_positive_int, check_str

#: `backend` names that select vLLM's CPU platform.
_CPU_BACKENDS = ("cpu", "cpu_attn", *CPU_MLA_BACKENDS)


@dataclass
class ModelKVCacheSpecs:
    """What vLLM's workers would report for this config: the specs, and the settings that
    shaped them."""

    architecture: str
    specs: dict[str, KVCacheSpec]
    block_size: int
    backend: AttentionBackendInfo
    model_dtype: str
    kv_dtype: str
    max_model_len: int
    tensor_parallel_size: int
    mamba_block_size: int | None = None
    notes: list[str] = field(default_factory=list)
    cpu_isa: str | None = None  # the CPU planned for, on vLLM's CPU platform


def resolve_block_size(
    model: ModelLayers,
    backend: AttentionBackendInfo,
    block_size: int | None,
    kv_dtype_size: int,
    *,
    model_type: str,
) -> tuple[int, list[str]]:
    """The full-attention block size vLLM settles on, and why (platform, then backend)."""
    notes = []
    if backend.platform == "cpu":
        if backend.name == "CPU_MLA":
            notes.append(f"vLLM's CPU MLA kernel takes {CPU_MLA_BLOCK_SIZE}-token blocks only")
            return CPU_MLA_BLOCK_SIZE, notes
        if model_type == "deepseek_v4":
            return DEEPSEEK_V4_BLOCK_SIZE, notes
        if (
            block_size is not None
            and backend.is_mla
            and not backend.supports_block_size(block_size)
        ):
            raise ValueError(
                f"block size {block_size} is not a multiple of {backend.multiple_of} tokens, "
                f"which {backend.name}'s kernels need"
            )
        return block_size or CPU_DEFAULT_BLOCK_SIZE, notes
    if block_size is None:
        block_size = backend.preferred_block_size(DEFAULT_BLOCK_SIZE)
        if block_size != DEFAULT_BLOCK_SIZE:
            notes.append(f"{backend.name} runs no {DEFAULT_BLOCK_SIZE}-token kernel block")
    elif not backend.supports_block_size(block_size):
        raise ValueError(
            f"block size {block_size} is not a multiple of any kernel block {backend.name} "
            f"runs ({backend.multiple_of or list(backend.fixed_sizes)})"
        )
    return block_size, notes


def align_hybrid_block_size(
    model: ModelLayers,
    backend: AttentionBackendInfo,
    block_size: int,
    kv_dtype_size: int,
) -> tuple[int, int | None, list[str]]:
    """vLLM's `_align_hybrid_block_size` for this model and backend: the attention block grows
    until one attention page holds the largest Mamba state (in whole kernel blocks), then the
    Mamba page is padded to exactly that attention page (the rule itself is the planner's
    `kv_cache_planning.align_hybrid_block_size`; this reads its inputs off the model).

    Returns (block size, padded Mamba page or None, notes).
    """
    if model.use_mla:
        per_token = model.head_size * kv_dtype_size
    else:
        per_token = 2 * model.num_kv_heads * model.head_size * kv_dtype_size
    mamba_page = max(m.state_bytes for m in model.layers if isinstance(m, MambaLayer))
    aligned, padded = kv_cache_planning.align_hybrid_block_size(
        block_size=block_size,
        attn_page_size_1_token=per_token,
        mamba_page_size=mamba_page,
        kernel_block_alignment=backend.smallest_kernel_block,
        use_mla=model.use_mla,
    )
    notes = []
    if block_size < aligned:
        notes.append(
            f"block size raised from {block_size} to {aligned} tokens so that one attention "
            f"page ({per_token:,} B per token) holds a Mamba state ({mamba_page:,} B)"
        )
        block_size = aligned
    if padded is not None:
        attention_page = padded
        notes.append(
            f"Mamba page padded from {mamba_page:,} B to {attention_page:,} B "
            f"(+{100 * (attention_page - mamba_page) / mamba_page:.2f}%) to equal an "
            "attention page"
        )
    return block_size, padded, notes


def resolve_config(config: str | Path | dict | HFConfig) -> HFConfig:
    """The config as vLLM's ModelConfig sees it: loaded, with the keys transformers fills in
    when the file leaves them out (the family's `with_defaults`), done once: a config that
    already carries its defaults is returned as it is."""
    cfg = config if isinstance(config, HFConfig) else HFConfig.load(config)
    if cfg.defaults:
        return cfg
    family = resolve_family(cfg.architecture)
    return family.with_defaults(cfg) if hasattr(family, "with_defaults") else cfg


def get_kv_cache_spec(
    config: str | Path | dict | HFConfig,
    *,
    tensor_parallel_size: int = 1,
    kv_cache_dtype: str = "auto",
    backend: str | None = None,
    block_size: int | None = None,
    max_model_len: int | None = None,
    dtype: str = "auto",
    enable_prefix_caching: bool | None = None,
    cpu_isa: str | None = None,
    num_mtp_layers: int = 0,
    mamba_ssm_cache_dtype: str = "auto",
    num_speculative_tokens: int = 0,
) -> ModelKVCacheSpecs:
    """The specs vLLM 0.32 builds for this config, in layer registration order.

    `backend`: "flash_attn", "flashinfer", "triton_attn", "flash_attn_mla", "flashmla",
    "triton_mla" or "cpu_attn" (vLLM's CPU platform); None picks what vLLM picks on a Hopper
    GPU for this KV cache dtype (`backends.default_backend`: FlashAttention, or FlashAttention
    MLA, whose 16-token blocks give way to FlashMLA's 64 for an fp8 MLA cache).
    `block_size`: `--block-size`, None for vLLM's choice. `enable_prefix_caching` decides
    the Mamba cache mode ("align": Mamba blocks as large as attention blocks; otherwise one
    state per request, a block of `max_model_len` tokens). None is vLLM's default: on, but
    off for an attention-free model (all Mamba), whose prefix caching vLLM calls experimental
    (`ModelConfig.is_prefix_caching_supported`).
    `backend` "cpu_attn" (or "cpu_mla" / "amx_mla" to name vLLM's CPU MLA backend) plans
    vLLM's CPU platform for `cpu_isa`: "avx512_bf16_amx", "avx512_bf16", "avx512" or "avx2"
    (`cpu_platform.CPU_ISAS`), or None / "auto" for this host's. vLLM keeps Mamba SSM states
    in float32 on AVX512-BF16 CPUs and runs MLA on its AMX backend where there is AMX.
    `num_mtp_layers`: the multi-token-prediction layers a speculative config adds from the
    same checkpoint (planned for DeepSeek V4 only, so far). `mamba_ssm_cache_dtype`:
    vLLM's `--mamba-ssm-cache-dtype`; a dtype given stores every SSM (temporal) state in it,
    on either platform; "auto" keeps the family's, or vLLM's CPU platform's choice.
    `num_speculative_tokens`: `--speculative-config`'s; a Mamba layer keeps one more state
    per speculative token, and its convolution state one more row.
    """
    check_positive_int("tensor_parallel_size", tensor_parallel_size)
    if block_size is not None:
        check_positive_int("block_size", block_size)
    if max_model_len is not None:
        schema.check_config_int("max_model_len", max_model_len, source="get_kv_cache_spec")
    check_str("kv_cache_dtype", kv_cache_dtype)
    check_str("dtype", dtype)
    check_str("backend", backend, optional=True)
    if enable_prefix_caching is not None:
        check_bool("enable_prefix_caching", enable_prefix_caching)
    check_cpu_isa(cpu_isa)
    if num_speculative_tokens:
        check_positive_int("num_speculative_tokens", num_speculative_tokens)
    cfg = resolve_config(config)
    family = resolve_family(cfg.architecture)
    model_dtype = cfg.model_dtype(dtype)
    kv_dtype = kv_cache_element_dtype(kv_cache_dtype, model_dtype)
    from refimpl.hybrid.kv_cache_interface import DTYPE_SIZES

    if hasattr(family, "model_kv_cache_specs"):  # families with their own spec builder
        return family.model_kv_cache_specs(
            cfg,
            tensor_parallel_size=tensor_parallel_size,
            kv_cache_dtype=kv_cache_dtype,
            backend=backend,
            block_size=block_size,
            max_model_len=max_model_len or cfg.derived_max_model_len(),
            model_dtype=model_dtype,
            num_mtp_layers=num_mtp_layers,
        )
    if num_mtp_layers:
        raise ValueError(
            f"MTP speculative decoding is planned for DeepSeek V4 only so far, not for "
            f"{cfg.architecture}"
        )
    model = family.cache_layers(cfg, tensor_parallel_size)
    generic.check_heads_split(cfg, tensor_parallel_size)
    if enable_prefix_caching is None:
        enable_prefix_caching = not all(isinstance(x, MambaLayer) for x in model.layers)
    isa, platform_notes = None, []
    if backend is not None and backend.lower() in _CPU_BACKENDS:
        isa = resolve_cpu_isa(cpu_isa)
        info, platform_notes = cpu_attention_backend(backend, use_mla=model.use_mla, isa=isa)
        ssm_dtype = cpu_platform.mamba_ssm_cache_dtype(isa)
        if (
            mamba_ssm_cache_dtype == "auto"
            and ssm_dtype != "auto"
            and any(isinstance(x, MambaLayer) for x in model.layers)
        ):
            model.layers = with_ssm_dtype(model.layers, ssm_dtype)
            platform_notes.append(
                f"vLLM keeps Mamba SSM states in {ssm_dtype} on an AVX512-BF16 CPU "
                f"({isa.name})"
            )
    else:
        info = get_backend(backend, mla=model.use_mla, kv_cache_dtype=kv_cache_dtype)
    if mamba_ssm_cache_dtype not in ("auto", "float32", "float16", "bfloat16"):
        raise ValueError(
            f"mamba_ssm_cache_dtype must be auto, float32, float16 or bfloat16, got "
            f"{mamba_ssm_cache_dtype!r}"
        )
    if mamba_ssm_cache_dtype != "auto":  # the user's dtype stands, on every platform
        model.layers = with_ssm_dtype(model.layers, mamba_ssm_cache_dtype)
    if num_speculative_tokens:
        model.layers = with_speculative_conv_rows(model.layers, num_speculative_tokens)
    max_len = max_model_len or cfg.derived_max_model_len()
    size, notes = resolve_block_size(
        model, info, block_size, DTYPE_SIZES[kv_dtype], model_type=cfg.text_model_type
    )
    notes = model.notes + platform_notes + notes
    mamba_block, padded = None, None
    if model.is_hybrid:
        size, padded, why = align_hybrid_block_size(model, info, size, DTYPE_SIZES[kv_dtype])
        notes += why
        mamba_block = size if enable_prefix_caching else max_len
    elif any(isinstance(layer, MambaLayer) for layer in model.layers):
        # an all-Mamba model: one state per request, a block of max_model_len tokens
        # (or the attention block size when prefix caching aligns the states)
        mamba_block = size if enable_prefix_caching else max_len
    ctx = CacheContext(
        block_size=size,
        kv_dtype=kv_dtype,
        kv_cache_dtype=kv_cache_dtype,
        backend=info,
        tensor_parallel_size=tensor_parallel_size,
        mamba_block_size=mamba_block,
        mamba_page_size_padded=padded,
        mamba_cache_mode="align" if enable_prefix_caching else "none",
        num_speculative_blocks=num_speculative_tokens,
    )
    specs = {layer.name: layer.get_kv_cache_spec(ctx) for layer in model.layers}
    return ModelKVCacheSpecs(
        architecture=cfg.architecture,
        specs=specs,
        block_size=size,
        backend=info,
        model_dtype=model_dtype,
        kv_dtype=kv_dtype,
        max_model_len=max_len,
        tensor_parallel_size=tensor_parallel_size,
        mamba_block_size=mamba_block,
        notes=notes,
        cpu_isa=isa.name if isa is not None else None,
    )


#: speculative methods vLLM counts as EAGLE (`SpeculativeConfig.use_eagle`)
EAGLE_METHODS = ("eagle", "eagle3", "mtp", "dflash", "dspark")


def hybrid_kv_cache_manager_disabled(
    model: ModelKVCacheSpecs,
    *,
    speculative_method: str | None = None,
    allow_chunked_local_with_hybrid: bool = True,
) -> tuple[bool, str | None]:
    """Whether vLLM 0.32 turns its hybrid KV cache manager off by itself for this model, and
    why (`VllmConfig.__post_init__`): chunked local attention (Llama 4) with an EAGLE
    drafter, or with `VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0` (the default, 1,
    keeps it on). Off, every layer is planned as full attention in one group."""
    from refimpl.hybrid.kv_cache_interface import ChunkedLocalAttentionSpec

    if not any(isinstance(s, ChunkedLocalAttentionSpec) for s in model.specs.values()):
        return False, None
    if speculative_method in EAGLE_METHODS:
        return True, "vLLM runs chunked local attention with EAGLE without its hybrid manager"
    if not allow_chunked_local_with_hybrid:
        return True, (
            "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0 turns the hybrid manager "
            "off for chunked local attention"
        )
    return False, None


def __getattr__(name: str):
    """The typed pipeline (`EngineArgs`, `ServeConfig`, `plan_model`, `ModelKVCachePlan`),
    imported on first use: those modules import this one."""
    if name in ("EngineArgs", "ServeConfig"):
        from refimpl.models import engine_args

        return getattr(engine_args, name)
    if name in ("plan_model", "ModelKVCachePlan", "GroupRow"):
        from refimpl.models import planning

        return getattr(planning, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ARCHITECTURES",
    "EngineArgs",
    "GroupRow",
    "HFConfig",
    "ModelKVCachePlan",
    "ModelKVCacheSpecs",
    "ServeConfig",
    "align_hybrid_block_size",
    "get_kv_cache_spec",
    "hybrid_kv_cache_manager_disabled",
    "plan_model",
    "resolve_block_size",
    "resolve_config",
]
