"""DeepSeek V4: compressed sparse attention, heavily compressed attention and sliding windows
(vLLM's models/deepseek_v4).

Its cache inventory is refimpl's one V4 spec builder,
`refimpl.hybrid.deepseek_v4.kv_cache_specs`, read here from the config.json
(`DeepseekV4Config.from_hf_config`); its plans are unchanged.
vLLM runs V4 with 256-token blocks only (its sparse-MLA and indexer kernels take no other
size), fp8_ds_mla rows unless the cache is bfloat16, and fp8 indexer keys. Every cache holds
one latent row per entry, so tensor parallelism does not split it.
"""

from __future__ import annotations

from refimpl.hybrid import deepseek_v4
from refimpl.models.backends import DEEPSEEK_V4_BLOCK_SIZE, AttentionBackendInfo
from refimpl.models.config import HFConfig

ARCHITECTURES = ("DeepseekV4ForCausalLM",)
#: --kv-cache-dtype -> V4's row format
CACHE_DTYPES = {
    "auto": "fp8_ds_mla",
    "fp8": "fp8_ds_mla",
    "fp8_ds_mla": "fp8_ds_mla",
    "bfloat16": "bfloat16",
}
V4_BACKEND = AttentionBackendInfo(
    "DEEPSEEK_V4_SPARSE_MLA", None, (DEEPSEEK_V4_BLOCK_SIZE,), True, "cuda"
)
#: On vLLM's CPU platform (`--attention-backend cpu_attn`) V4 keeps its 256-token caches; the
#: platform's scheduler rules (no async scheduling, MLA without chunked prefill) apply.
CPU_V4_BACKEND = AttentionBackendInfo("CPU_ATTN", None, (DEEPSEEK_V4_BLOCK_SIZE,), True, "cpu")


def model_kv_cache_specs(
    cfg: HFConfig,
    *,
    tensor_parallel_size: int,
    kv_cache_dtype: str,
    backend: str | None,
    block_size: int | None,
    max_model_len: int,
    model_dtype: str,
    num_mtp_layers: int = 0,
):
    from refimpl.models import ModelKVCacheSpecs

    if kv_cache_dtype not in CACHE_DTYPES:
        raise ValueError(
            f"DeepSeek V4 caches take kv cache dtype {', '.join(CACHE_DTYPES)}; "
            f"got {kv_cache_dtype!r}"
        )
    if block_size not in (None, DEEPSEEK_V4_BLOCK_SIZE):
        raise ValueError(
            f"DeepSeek V4's kernels take {DEEPSEEK_V4_BLOCK_SIZE}-token blocks only, "
            f"got block size {block_size}"
        )
    info = V4_BACKEND
    if backend is not None and backend.lower() in ("cpu", "cpu_attn"):
        info = CPU_V4_BACKEND  # vLLM's CPU platform: the same 256-token caches
    elif backend is not None:
        raise ValueError(
            f"DeepSeek V4 runs only on its own sparse MLA backend ({V4_BACKEND.name}, or "
            f"cpu_attn for vLLM's CPU platform); --attention-backend {backend} cannot serve it"
        )
    if num_mtp_layers > 1:
        raise ValueError(f"DeepSeek V4 has one MTP layer; {num_mtp_layers} were asked for")
    row = CACHE_DTYPES[kv_cache_dtype]
    for key in ("num_hidden_layers", "head_dim", "index_head_dim", "sliding_window"):
        cfg.get_int(key, None)  # the schema's checks; from_hf_config says what is missing
    specs = deepseek_v4.kv_cache_specs(
        deepseek_v4.DeepseekV4Config.from_hf_config(cfg.raw),
        cache_dtype=row,
        block_size=DEEPSEEK_V4_BLOCK_SIZE,
        mtp=num_mtp_layers > 0,
    )
    return ModelKVCacheSpecs(
        architecture=cfg.architecture,
        specs=specs,
        block_size=DEEPSEEK_V4_BLOCK_SIZE,
        backend=info,
        model_dtype=model_dtype,
        kv_dtype=row,
        max_model_len=max_model_len,
        tensor_parallel_size=tensor_parallel_size,
        notes=[f"DeepSeek V4's kernels take {DEEPSEEK_V4_BLOCK_SIZE}-token blocks only"],
    )
