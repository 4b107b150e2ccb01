"""The tiny DeepSeek V4 forward pass on the paged cache.

Everything that works token by token and never touches the cache is transformers' own module,
loaded from the same checkpoint: the embedding, the mHC hyper-connections, the norms, the
hash-MoE / MoE blocks, the final hyper-head and `lm_head`. Attention (with its compressor and
indexer) is `refimpl.v4.attention.paged_attention`, which reads and writes only the cache
views.
"""

from __future__ import annotations

import torch

from refimpl.v4.attention import AttentionMetadata, paged_attention, rope_tables
from refimpl.v4.cache import LayerCaches


def mix_streams(
    post: torch.Tensor, comb: torch.Tensor, block_out: torch.Tensor, streams: torch.Tensor
) -> torch.Tensor:
    """mHC update: expand the block output into the streams and add the mixed residual
    streams."""
    return post.unsqueeze(-1) * block_out.unsqueeze(-2) + torch.matmul(
        comb.transpose(-1, -2), streams
    )


@torch.no_grad()
def forward_step(
    hf_model, input_ids: torch.Tensor, meta: AttentionMetadata, caches: list[LayerCaches]
) -> torch.Tensor:
    """Hidden states (T, hidden) after the final norm for the packed rows of one step."""
    core = hf_model.model
    ids = input_ids[None]  # transformers' modules expect a batch dimension
    embeds = core.embed_tokens(ids)
    meta.rope = rope_tables(core.rotary_emb, embeds, meta.positions)
    streams = embeds.unsqueeze(2).expand(-1, -1, hf_model.config.hc_mult, -1).contiguous()
    for i, layer in enumerate(core.layers):
        post, comb, collapsed = layer.attn_hc(streams)
        attn_out = paged_attention(
            layer.self_attn, layer.input_layernorm(collapsed)[0], meta, caches[i], i
        )
        streams = mix_streams(post, comb, attn_out[None], streams)
        post, comb, collapsed = layer.ffn_hc(streams)
        mlp_out = layer.mlp(layer.post_attention_layernorm(collapsed), input_ids=ids)
        streams = mix_streams(post, comb, mlp_out, streams)
    return core.norm(core.hc_head(streams))[0]
