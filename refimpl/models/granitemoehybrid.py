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

from refimpl.models import schema
from refimpl.models.config import HFConfig, kv_heads_per_rank
from refimpl.models.layers import AttentionLayer, MambaLayer
from refimpl.models.llama import attention_heads
from refimpl.models.registry import ModelLayers

ARCHITECTURES = ("GraniteMoeHybridForCausalLM",)
#: Layer kinds: the checkpoints' "mamba"/"attention" and the names transformers 5 remaps them
#: to ("linear_attention"/"full_attention").
MAMBA_TYPES = ("mamba", "linear_attention")
ATTENTION_TYPES = ("attention", "full_attention")


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
    n = cfg.get_int("num_hidden_layers")
    types = cfg.get_layer_types(MAMBA_TYPES + ATTENTION_TYPES, n)
    if types is None:
        cfg.require("layer_types")  # transformers' default (all Mamba) is no real model
    model_dtype = cfg.model_dtype()
    hidden = cfg.get_int("hidden_size")
    intermediate = cfg.get_int("mamba_expand") * hidden
    n_heads = cfg.get_int("mamba_n_heads")
    rule = "transformers' GraniteMoeHybridConfig"
    cfg.check_divides(
        "mamba_n_heads", n_heads, "mamba_expand * hidden_size", intermediate, rule
    )
    d_head = cfg.get("mamba_d_head")
    if d_head in (None, "auto"):  # transformers' default: the intermediate size per head
        d_head = intermediate // n_heads
    d_head = schema.check_config_int("mamba_d_head", d_head, source=cfg.source)
    if d_head * n_heads != intermediate:
        raise ValueError(
            f"{cfg.source}: mamba_d_head = {d_head:,} x mamba_n_heads = {n_heads:,} is not "
            f"mamba_expand * hidden_size = {intermediate:,} ({rule})"
        )
    shapes = mamba2_state_shapes(
        tensor_parallel_size,
        intermediate,
        cfg.get_int("mamba_n_groups"),
        n_heads,
        d_head,
        cfg.get_int("mamba_d_state"),
        cfg.get_int("mamba_d_conv"),
    )
    heads = cfg.get_int("num_attention_heads")
    cfg.check_divides("num_attention_heads", heads, "hidden_size", hidden, rule)
    _, kv_heads = attention_heads(cfg)
    per_rank = kv_heads_per_rank(kv_heads, tensor_parallel_size)
    size = hidden // heads
    layers = []
    for i, kind in enumerate(types):
        if kind in MAMBA_TYPES:
            layers.append(
                MambaLayer(
                    f"model.layers.{i}.mixer",
                    shapes,
                    (model_dtype, model_dtype),
                    num_prefill_checkpoint_blocks=1,  # vLLM's MambaMixer2
                )
            )
        else:
            layers.append(AttentionLayer(f"model.layers.{i}.self_attn.attn", per_rank, size))
    return ModelLayers(layers, num_kv_heads=per_rank, head_size=size)
