"""`--decode-context-parallel-size` (DCP): a request's KV cache spread over ranks (vLLM 0.32).

DCP reuses tensor-parallel ranks that would otherwise hold copies of the same KV heads (an
MLA layer's one latent head, or GQA's heads when TP exceeds them): rank r of a DCP group
stores tokens r, r + dcp, r + 2 x dcp, ... So every attention layer keeps its per-rank spec
(page, block size), but a block of `block_size` slots now spans `block_size x dcp` tokens of
the sequence, and one request at `max_model_len` needs cdiv(max_model_len, dcp) slots per
rank: the same budget holds `dcp` times the tokens. Mamba states are not split. vLLM
refuses the settings that cannot split (`ParallelConfig`,
`ModelConfig.verify_with_parallel_config`), a backend without DCP kernels (`supports_dcp`),
and sliding-window layers.
"""

from __future__ import annotations

from dataclasses import replace

from refimpl.hybrid.kv_cache_interface import AttentionSpec, SlidingWindowSpec
from refimpl.models.config import HFConfig

#: Attention backends whose vLLM 0.32 implementation sets `supports_dcp` (of those refimpl
#: models; TRITON_ATTN and vLLM's CPU backends do not).
DCP_BACKENDS = ("FLASH_ATTN", "FLASHINFER", "FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA")


def check_decode_context_parallel(
    cfg: HFConfig, *, use_mla: bool, tensor_parallel_size: int, dcp: int
) -> None:
    """vLLM's checks of a DCP size against the TP size and the model's heads: DCP ranks are
    TP ranks, so dcp divides TP; without MLA, TP must exceed the KV heads, dcp can be at most
    TP / KV heads, and each KV head's query heads must split evenly over the DCP ranks."""
    tp = tensor_parallel_size
    if tp % dcp:
        raise ValueError(
            f"--tensor-parallel-size {tp} must be divisible by --decode-context-parallel-size "
            f"{dcp} (DCP ranks are TP ranks)"
        )
    if use_mla:
        return
    heads = int(cfg.require("num_attention_heads"))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    if tp <= kv_heads:
        raise ValueError(
            f"decode context parallelism without MLA needs --tensor-parallel-size ({tp}) "
            f"greater than the model's {kv_heads} KV heads; raise -tp or use -dcp 1"
        )
    if dcp > tp // kv_heads:
        raise ValueError(
            f"--decode-context-parallel-size {dcp} exceeds the most {tp // kv_heads} that "
            f"--tensor-parallel-size {tp} and {kv_heads} KV heads allow"
        )
    if (heads // kv_heads) % dcp:
        raise ValueError(
            f"the model's {heads // kv_heads} query heads per KV head must be divisible by "
            f"--decode-context-parallel-size {dcp}"
        )


def shard_over_decode_context(specs: dict, dcp: int, backend_name: str) -> dict:
    """The specs with every attention layer's tokens spread over `dcp` ranks
    (`AttentionSpec.dcp_world_size`); refused for a backend without DCP kernels and for
    sliding-window layers, as vLLM refuses them."""
    if dcp == 1:
        return specs
    if backend_name not in DCP_BACKENDS:
        raise ValueError(
            f"the {backend_name} attention backend has no decode context parallel kernels "
            f"in vLLM 0.32; DCP runs on {', '.join(DCP_BACKENDS)}"
        )
    windowed = [name for name, spec in specs.items() if isinstance(spec, SlidingWindowSpec)]
    if windowed:
        raise ValueError(
            f"decode context parallelism does not support sliding-window layers "
            f"({len(windowed)}, e.g. {windowed[0]}); vLLM 0.32 refuses them"
        )
    return {
        name: replace(spec, dcp_world_size=dcp) if isinstance(spec, AttentionSpec) else spec
        for name, spec in specs.items()
    }
