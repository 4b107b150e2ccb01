"""Granite 4.0-H: Mamba2 layers with a few attention layers (vLLM's granitemoehybrid.py).

`layer_types` names each layer "mamba" or "attention". A Mamba2 layer
(`model.layers.{i}.mixer`) keeps, per request, a convolution state of (conv_kernel - 1) x
conv_dim values, conv_dim =
mamba_expand x hidden_size + 2 x n_groups x d_state, and an SSM state of n_heads x d_head x
d_state; both in the model dtype unless vLLM's `--mamba-ssm-cache-dtype` says otherwise.
Tensor parallelism splits conv_dim and the heads (n_groups is first raised to a multiple of the
rank count: each rank needs the groups of its own heads).
"""

from __future__ import annotations

from refimpl.models.config import HFConfig, kv_heads_per_rank
from refimpl.models.layers import AttentionLayer, MambaLayer
from refimpl.models.registry import ModelLayers

ARCHITECTURES = ("GraniteMoeHybridForCausalLM",)


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(f"{what} ({numerator}) does not split over {denominator} ranks")
    return numerator // denominator


def mamba2_state_shapes(
    tp: int,
    intermediate_size: int,
    n_groups: int,
    num_heads: int,
    head_dim: int,
    state_size: int,
    conv_kernel: int,
) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """(conv state, SSM state) shapes on one rank (vLLM's `mamba2_state_shape`)."""
    if n_groups % tp:
        n_groups = tp  # vLLM: extra groups so each rank holds whole groups for its heads
    conv_dim = intermediate_size + 2 * n_groups * state_size
    conv = (conv_kernel - 1, divide(conv_dim, tp, "the Mamba2 conv dim"))
    ssm = (divide(num_heads, tp, "the Mamba2 heads"), head_dim, state_size)
    return conv, ssm


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    types = cfg.require("layer_types")
    model_dtype = cfg.model_dtype()
    shapes = mamba2_state_shapes(
        tensor_parallel_size,
        int(cfg.require("mamba_expand")) * int(cfg.require("hidden_size")),
        int(cfg.require("mamba_n_groups")),
        int(cfg.require("mamba_n_heads")),
        int(cfg.require("mamba_d_head")),
        int(cfg.require("mamba_d_state")),
        int(cfg.require("mamba_d_conv")),
    )
    per_rank = kv_heads_per_rank(int(cfg.require("num_key_value_heads")), tensor_parallel_size)
    size = int(cfg.require("hidden_size")) // int(cfg.require("num_attention_heads"))
    layers = []
    for i, kind in enumerate(types):
        if kind == "mamba":
            layers.append(
                MambaLayer(
                    f"model.layers.{i}.mixer",
                    shapes,
                    (model_dtype, model_dtype),
                    num_prefill_checkpoint_blocks=1,  # vLLM's MambaMixer2
                )
            )
        elif kind == "attention":
            layers.append(AttentionLayer(f"model.layers.{i}.self_attn.attn", per_rank, size))
        else:
            raise ValueError(f"{cfg.source}: layer {i} has unknown layer type {kind!r}")
    return ModelLayers(layers, num_kv_heads=per_rank, head_size=size)
