"""State-space models and their hybrids: Mamba, Falcon-Mamba, Mamba2 (all Mamba), Jamba
(Mamba1 with an attention layer every `attn_layer_period`-th layer) and Falcon-H1 (a parallel
hybrid: every layer has attention AND a Mamba2 mixer side by side) and Zamba2 (a Mamba2
mixer per layer, plus shared attention blocks applied at `hybrid_layer_ids`: the weights are
shared, but each application keeps its own cache). vLLM's mamba.py, mamba2.py, jamba.py,
falcon_h1.py, zamba2.py.

A Mamba1 layer keeps, per request, a conv state of (conv_kernel - 1) x intermediate values
and an SSM state of intermediate x state_size; Mamba2's are in `granitemoehybrid`
(`mamba2_state_shapes`). Tensor parallelism splits the intermediate size.
"""

from __future__ import annotations

from refimpl.models import generic
from refimpl.models.config import HFConfig, kv_heads_per_rank
from refimpl.models.granitemoehybrid import divide, mamba2_state_shapes
from refimpl.models.layers import AttentionLayer, Layer, MambaLayer
from refimpl.models.registry import ModelLayers

ARCHITECTURES = (
    "MambaForCausalLM",
    "FalconMambaForCausalLM",
    "Mamba2ForCausalLM",
    "JambaForCausalLM",
    "FalconH1ForCausalLM",
    "Zamba2ForCausalLM",
)


def mamba1_layer(cfg: HFConfig, name: str, tp: int, intermediate: int) -> MambaLayer:
    dtype = cfg.model_dtype()
    state = int(generic.first(cfg, ("state_size", "mamba_d_state"), "the SSM state size"))
    conv = int(generic.first(cfg, ("conv_kernel", "mamba_d_conv"), "the conv kernel"))
    per_rank = divide(intermediate, tp, "the Mamba intermediate size")
    return MambaLayer(
        name, ((conv - 1, per_rank), (per_rank, state)), (dtype, dtype), mamba_type="mamba1"
    )


def mamba2_layer(cfg: HFConfig, name: str, tp: int, intermediate: int, **keys) -> MambaLayer:
    """A Mamba2 mixer; `keys` name the config's fields for heads, head dim, groups, state
    and conv kernel (Mamba2 and Falcon-H1 spell them differently)."""
    value = {k: int(generic.first(cfg, names, f"Mamba2's {k}")) for k, names in keys.items()}
    dtype = cfg.model_dtype()
    shapes = mamba2_state_shapes(
        tp,
        intermediate,
        value["n_groups"],
        value["num_heads"],
        value["head_dim"],
        value["state_size"],
        value["conv_kernel"],
    )
    return MambaLayer(name, shapes, (dtype, dtype), num_prefill_checkpoint_blocks=1)


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    tp = tensor_parallel_size
    n = generic.num_layers(cfg)
    arch = cfg.architecture
    layers: list[Layer] = []
    if arch in ("MambaForCausalLM", "FalconMambaForCausalLM"):
        intermediate = int(generic.first(cfg, ("intermediate_size",), "Mamba's inner size"))
        layers = [
            mamba1_layer(cfg, f"backbone.layers.{i}.mixer", tp, intermediate) for i in range(n)
        ]
        return ModelLayers(layers)
    hidden = int(generic.first(cfg, ("hidden_size",), "hidden size"))
    if arch == "Mamba2ForCausalLM":
        intermediate = int(generic.first(cfg, ("expand",), "Mamba2's expand")) * hidden
        keys = {
            "num_heads": ("num_heads",),
            "head_dim": ("head_dim",),
            "n_groups": ("n_groups",),
            "state_size": ("state_size",),
            "conv_kernel": ("conv_kernel",),
        }
        layers = [
            mamba2_layer(cfg, f"backbone.layers.{i}.mixer", tp, intermediate, **keys)
            for i in range(n)
        ]
        return ModelLayers(layers)
    if arch == "Zamba2ForCausalLM":
        return zamba2_layers(cfg, tp, n, hidden)
    attention = generic.attention_layers(cfg, tp, [None] * n, generic.total_kv_heads(cfg))
    if arch == "JambaForCausalLM":
        period = int(generic.first(cfg, ("attn_layer_period",), "Jamba's attention period"))
        offset = int(generic.first(cfg, ("attn_layer_offset",), "Jamba's attention offset"))
        intermediate = int(generic.first(cfg, ("mamba_expand",), "Mamba's expand")) * hidden
        layers = [
            attention.layers[i]
            if i % period == offset
            else mamba1_layer(cfg, f"model.layers.{i}.mixer", tp, intermediate)
            for i in range(n)
        ]
    else:  # Falcon-H1: attention and a Mamba2 mixer in every layer
        intermediate = int(
            cfg.text.get("mamba_d_ssm")
            or int(generic.first(cfg, ("mamba_expand",), "Mamba's expand")) * hidden
        )
        keys = {
            "num_heads": ("mamba_n_heads",),
            "head_dim": ("mamba_d_head",),
            "n_groups": ("mamba_n_groups",),
            "state_size": ("mamba_d_state",),
            "conv_kernel": ("mamba_d_conv",),
        }
        for i, layer in enumerate(attention.layers):
            layers.append(layer)
            layers.append(
                mamba2_layer(cfg, f"model.layers.{i}.mamba", tp, intermediate, **keys)
            )
    return ModelLayers(
        layers, num_kv_heads=attention.num_kv_heads, head_size=attention.head_size
    )


def zamba2_layers(cfg: HFConfig, tp: int, n: int, hidden: int) -> ModelLayers:
    """One cache per application of a shared attention block (`hybrid_layer_ids`), each with
    a K/V head per attention head of `attention_head_dim`, then a Mamba2 mixer per layer."""
    applications = len(generic.first(cfg, ("hybrid_layer_ids",), "Zamba2's attention layers"))
    heads = kv_heads_per_rank(int(generic.first(cfg, ("num_attention_heads",), "heads")), tp)
    size = int(generic.first(cfg, ("attention_head_dim",), "Zamba2's head size"))
    layers: list[Layer] = [
        AttentionLayer(f"model.attn.{j}", heads, size) for j in range(applications)
    ]
    intermediate = int(generic.first(cfg, ("mamba_expand",), "Mamba's expand")) * hidden
    keys = {
        "num_heads": ("n_mamba_heads",),
        "head_dim": ("mamba_headdim",),
        "n_groups": ("mamba_ngroups",),
        "state_size": ("mamba_d_state",),
        "conv_kernel": ("mamba_d_conv",),
    }
    layers += [
        mamba2_layer(cfg, f"model.layers.{i}.mamba", tp, intermediate, **keys)
        for i in range(n)
    ]
    return ModelLayers(layers, num_kv_heads=heads, head_size=size)
