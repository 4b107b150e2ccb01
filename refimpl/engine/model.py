"""A Qwen3-architecture decoder whose attention reads and writes the paged KV cache.

The math follows Hugging Face's `Qwen3ForCausalLM` exactly (so greedy outputs match
transformers token for token), and the parameter names are the checkpoint's names, so loading
is a plain name-to-tensor copy. Unlike transformers, tokens of all sequences in a step are
packed into one flat batch `[num_tokens, ...]` and there is no padding: where each sequence
starts, and where its K/V live, comes from the step's `Context`.

Qwen3's layer: x + Attn(RMSNorm(x)), then x + MLP(RMSNorm(x)); attention applies an RMSNorm to
each query and key head (q_norm / k_norm) before the rotary embedding, and uses grouped-query
attention (several query heads share one K/V head).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from refimpl.engine.attention import Attention
from refimpl.engine.config import Qwen3ModelConfig
from refimpl.kernels.backend import AttentionOps


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 (as transformers does) and cast back."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (the "rotate half" layout used by Qwen and Llama).

    Position p rotates each pair (x[i], x[i + d/2]) by the angle p * base**(-2i/d). The angle
    depends only on the token's own position, so a token's K is rotated once, stored in the
    cache, and reused unchanged by every later query. cos/sin are computed per step from the
    positions (as transformers does), so no table of max_position rows is kept.
    """

    def __init__(self, head_dim: int, base: float) -> None:
        super().__init__()
        # A plain attribute, not a buffer: model.to(bfloat16) must not round the frequencies.
        self.inv_freq = 1.0 / (
            base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)
        )

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions `[tokens]` -> (cos, sin), each `[tokens, 1, head_dim]` in float32."""
        freqs = positions[:, None].float() * self.inv_freq.to(positions.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """cos/sin already in x's dtype (transformers casts them the same way, once per
    forward)."""
    return x * cos + rotate_half(x) * sin


class Qwen3Attention(nn.Module):
    def __init__(self, config: Qwen3ModelConfig, ops: AttentionOps) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(
            config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias
        )
        self.v_proj = nn.Linear(
            config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias
        )
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.attn = Attention(
            self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads, ops
        )

    def forward(
        self, rope: tuple[torch.Tensor, torch.Tensor], hidden_states: torch.Tensor
    ) -> torch.Tensor:
        num_tokens = hidden_states.shape[0]
        q = self.q_norm(
            self.q_proj(hidden_states).view(num_tokens, self.num_heads, self.head_dim)
        )
        k = self.k_norm(
            self.k_proj(hidden_states).view(num_tokens, self.num_kv_heads, self.head_dim)
        )
        v = self.v_proj(hidden_states).view(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = apply_rotary_emb(q, *rope), apply_rotary_emb(k, *rope)
        out = self.attn(q, k, v)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))


class Qwen3MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: Qwen3ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config: Qwen3ModelConfig, ops: AttentionOps) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(config, ops)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, rope: tuple[torch.Tensor, torch.Tensor], hidden_states: torch.Tensor
    ) -> torch.Tensor:
        hidden_states = hidden_states + self.self_attn(
            rope, self.input_layernorm(hidden_states)
        )
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class Qwen3Model(nn.Module):
    def __init__(self, config: Qwen3ModelConfig, ops: AttentionOps) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [Qwen3DecoderLayer(config, ops) for _ in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        # shared by every layer
        rope = tuple(t.to(hidden_states.dtype) for t in self.rotary_emb(positions))
        for layer in self.layers:
            hidden_states = layer(rope, hidden_states)
        return self.norm(hidden_states)


class Qwen3ForCausalLM(nn.Module):
    """The decoder plus the output projection to vocabulary logits.

    With `tie_word_embeddings` the output projection is the embedding matrix itself (one
    Parameter under two names), as small Qwen3 checkpoints do.
    """

    def __init__(self, config: Qwen3ModelConfig, ops: AttentionOps) -> None:
        super().__init__()
        self.config = config
        self.model = Qwen3Model(config, ops)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions `[num_tokens]` -> hidden states `[num_tokens, hidden_size]`."""
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]
