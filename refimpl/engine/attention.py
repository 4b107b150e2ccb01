"""The paged attention layer: store this step's K/V in the cache, then attend through pages.

Every attention backend (`refimpl.kernels.backend`: "torch", "triton", "flash-attn") provides
the same three operations, called here with the step's `Context`:
  1. `store_kvcache`: write each new token's K/V rows into its cache slot (`slot_mapping`);
  2. prefill: causal attention of the new tokens over their whole context (cached prefix and
     this step's tokens), read block by block through `block_tables`;
  3. decode: one query per sequence over its `context_lens` cached tokens, through
    `block_tables`.
Because step 1 runs first, attention always finds the new tokens' K/V in the cache too.
Every layer of a step gets the same metadata, so a backend that allows it
(`AttentionOps.check_once_per_step`) checks the arguments at most once per step: not at all
when the model runner already checked them (`Context.checked`), else in the first layer.
"""

from __future__ import annotations

import torch
from torch import nn

from refimpl.engine.context import get_context
from refimpl.errors import InvariantError
from refimpl.kernels.backend import AttentionOps


class Attention(nn.Module):
    """Paged attention for one layer.

    `k_cache` / `v_cache` (`[num_blocks, block_size, num_kv_heads, head_dim]`) are this layer's
    views into the model runner's single KV tensor, attached after the model is built.
    """

    def __init__(
        self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int, ops: AttentionOps
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.ops = ops
        self.k_cache = self.v_cache = torch.tensor([])

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q `[tokens, num_heads, head_dim]`, k/v `[tokens, num_kv_heads, head_dim]` -> like
        q."""
        ctx = get_context()
        if self.k_cache.numel() == 0:
            raise InvariantError(
                "attention ran before the model runner attached a KV cache to the layer"
            )
        if ctx.slot_mapping is None or ctx.block_tables is None:
            raise InvariantError(
                "attention ran without a step context (set_context was not called)"
            )
        ops = self.ops
        extra = {}
        if ops.check_once_per_step:
            extra["check"] = not ctx.checked
            ctx.checked = True
        ops.store_kvcache(k, v, self.k_cache, self.v_cache, ctx.slot_mapping, **extra)
        if ctx.is_prefill:
            return ops.paged_prefill_attention(
                q,
                self.k_cache,
                self.v_cache,
                ctx.cu_seqlens_q,
                ctx.cu_seqlens_k,
                ctx.max_seqlen_q,
                ctx.max_seqlen_k,
                ctx.block_tables,
                softmax_scale=self.scale,
                **extra,
            )
        return ops.paged_decode_attention(
            q,
            self.k_cache,
            self.v_cache,
            ctx.context_lens,
            ctx.block_tables,
            softmax_scale=self.scale,
            **extra,
        )
