"""The cache layers a model registers, and the spec each one asks for (vLLM's layer classes).

A family module (llama.py, gemma.py, ...) only says which layers the model has, in the order
vLLM's model code creates them, with the numbers from the config: `AttentionLayer` (K and V
rows, maybe a sliding window), `MLALayer` (one latent row per token) and `MambaLayer` (a
fixed-size recurrent state per request). Turning a layer into a spec is the same for every
family, as it is in vLLM, where the rule lives in the layer class
(`Attention.get_kv_cache_spec`, `MLAAttention.get_kv_cache_spec`,
`MambaBase.get_kv_cache_spec`), not in the model file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from refimpl.hybrid.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from refimpl.models.backends import AttentionBackendInfo


@dataclass(frozen=True)
class CacheContext:
    """The engine settings a layer's spec depends on, once the platform has settled them."""

    block_size: int  # tokens per block of full-attention layers
    kv_dtype: str  # element dtype of K/V rows
    kv_cache_dtype: str  # what the user asked for ("auto", "fp8", ...)
    backend: AttentionBackendInfo
    tensor_parallel_size: int
    mamba_block_size: int | None = None
    mamba_page_size_padded: int | None = None
    mamba_cache_mode: str = "none"
    model_dtype: str | None = None  # for layers built without the cache config


@dataclass(frozen=True)
class AttentionLayer:
    """Softmax attention over K and V rows of `head_size` (`head_size_v` for V when it
    differs); `num_kv_heads` is per rank, already split for tensor parallelism."""

    name: str
    num_kv_heads: int
    head_size: int
    sliding_window: int | None = None
    head_size_v: int | None = None
    #: chunked local attention (Llama 4): attends within chunks of this many tokens
    attention_chunk_size: int | None = None
    #: built without vLLM's cache config (Falcon's rotary / ALiBi layers): the cache keeps
    #: the model dtype whatever --kv-cache-dtype says
    model_dtype_cache: bool = False

    def get_kv_cache_spec(self, ctx: CacheContext) -> KVCacheSpec:
        """A full-attention spec at the block size, a chunked local one at the block size
        (vLLM's `ChunkedLocalAttention`), or a sliding-window spec at the largest kernel
        block that fits in that block size (vLLM's `Attention.get_kv_cache_spec`)."""
        common = {
            "num_kv_heads": self.num_kv_heads,
            "head_size": self.head_size,
            "dtype": ctx.model_dtype if self.model_dtype_cache else ctx.kv_dtype,
            "kernel_block_size": ctx.backend.kernel_block_size,
        }
        if self.head_size_v is not None:
            common["head_size_v"] = self.head_size_v
        if self.attention_chunk_size is not None:
            return ChunkedLocalAttentionSpec(
                block_size=ctx.block_size,
                attention_chunk_size=self.attention_chunk_size,
                **common,
            )
        if self.sliding_window is not None:
            block = ctx.backend.sliding_window_block_size(ctx.block_size)
            return SlidingWindowSpec(
                block_size=block, sliding_window=self.sliding_window, **common
            )
        return FullAttentionSpec(block_size=ctx.block_size, **common)


@dataclass(frozen=True)
class MLALayer:
    """Multi-head latent attention: one row of `head_size` (= kv_lora_rank + rope dims) per
    token, shared by all heads, so tensor parallelism never splits it."""

    name: str
    head_size: int

    def get_kv_cache_spec(self, ctx: CacheContext) -> KVCacheSpec:
        return MLAAttentionSpec(
            block_size=ctx.block_size,
            num_kv_heads=1,
            head_size=self.head_size,
            dtype=ctx.kv_dtype,
            cache_dtype_str=ctx.kv_cache_dtype,
            kernel_block_size=ctx.backend.kernel_block_size,
        )


@dataclass(frozen=True)
class MambaLayer:
    """A recurrent layer: per request one state made of tensors `shapes` (per rank) of
    `dtypes`, whatever the sequence length (Mamba2's conv and SSM states, a gated delta
    net's conv and recurrent states)."""

    name: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    mamba_type: str = "mamba2"
    #: a checkpoint block kept while prefilling in "align" mode (vLLM's MambaMixer2 sets 1)
    num_prefill_checkpoint_blocks: int = 0

    @property
    def state_bytes(self) -> int:
        from refimpl.hybrid.kv_cache_interface import DTYPE_SIZES

        return sum(
            math.prod(s) * DTYPE_SIZES[d]
            for s, d in zip(self.shapes, self.dtypes, strict=True)
        )

    def get_kv_cache_spec(self, ctx: CacheContext) -> KVCacheSpec:
        return MambaSpec(
            block_size=ctx.mamba_block_size,
            shapes=self.shapes,
            dtypes=self.dtypes,
            page_size_padded=ctx.mamba_page_size_padded,
            mamba_type=self.mamba_type,
            mamba_cache_mode=ctx.mamba_cache_mode,
            num_prefill_checkpoint_blocks=self.num_prefill_checkpoint_blocks,
        )


Layer = AttentionLayer | MLALayer | MambaLayer
