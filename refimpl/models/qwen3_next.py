"""Qwen3-Next: gated delta net (linear attention) layers with full attention every fourth
layer (vLLM's qwen3_next.py).

A gated delta net layer (`model.layers.{i}.linear_attn`) keeps, per request, a convolution
state of (conv_kernel - 1) x conv_dim values, conv_dim = 2 x key_heads x key_dim + value_heads
x value_dim, and a recurrent state of value_heads x value_dim x key_dim: a Mamba-style state
whose size does not grow with the sequence. `layer_types` (or every `full_attention_interval`-
th layer) marks the full-attention layers, `model.layers.{i}.self_attn.attn`.
"""

from __future__ import annotations

from refimpl.models.config import HFConfig, kv_heads_per_rank
from refimpl.models.granitemoehybrid import divide
from refimpl.models.layers import AttentionLayer, MambaLayer
from refimpl.models.llama import attention_heads
from refimpl.models.registry import ModelLayers

ARCHITECTURES = ("Qwen3NextForCausalLM",)
FULL_ATTENTION_INTERVAL = 4  # transformers' Qwen3NextConfig default
LAYER_TYPES = ("linear_attention", "full_attention")


def gated_delta_net_state_shapes(
    tp: int, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int, conv: int
) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """(conv state, recurrent state) shapes on one rank (vLLM's
    `gated_delta_net_state_shape`)."""
    conv_dim = head_k_dim * num_k_heads * 2 + head_v_dim * num_v_heads
    return (
        (conv - 1, divide(conv_dim, tp, "the gated delta net conv dim")),
        (divide(num_v_heads, tp, "the value heads"), head_v_dim, head_k_dim),
    )


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    n = cfg.get_int("num_hidden_layers")
    interval = cfg.get_int("full_attention_interval", FULL_ATTENTION_INTERVAL)
    types = cfg.get_layer_types(LAYER_TYPES, n) or [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
    ]
    model_dtype = cfg.model_dtype()
    shapes = gated_delta_net_state_shapes(
        tensor_parallel_size,
        cfg.get_int("linear_num_key_heads"),
        cfg.get_int("linear_num_value_heads"),
        cfg.get_int("linear_key_head_dim"),
        cfg.get_int("linear_value_head_dim"),
        cfg.get_int("linear_conv_kernel_dim"),
    )
    _, kv_heads = attention_heads(cfg)
    per_rank = kv_heads_per_rank(kv_heads, tensor_parallel_size)
    size = cfg.get_int("head_dim")
    layers = []
    for i, kind in enumerate(types):
        if kind == "linear_attention":
            layers.append(
                MambaLayer(
                    f"model.layers.{i}.linear_attn",
                    shapes,
                    (model_dtype, model_dtype),
                    mamba_type="gdn_attn",
                )
            )
        else:
            layers.append(AttentionLayer(f"model.layers.{i}.self_attn.attn", per_rank, size))
    return ModelLayers(layers, num_kv_heads=per_rank, head_size=size)
