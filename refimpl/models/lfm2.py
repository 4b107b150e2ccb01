"""LFM2 (vLLM's lfm2.py, lfm2_vl.py): gated short-convolution layers with a few attention
layers.

`layer_types` names each layer "conv" or "full_attention". A short-conv layer keeps, per
request, only its convolution's last conv_L_cache - 1 inputs of `conv_dim` channels (split
over tensor-parallel ranks): a Mamba-style state with one tensor and no SSM part, kept in the
model dtype (vLLM's `short_conv_state_shape`, mamba type "short_conv").
"""

from __future__ import annotations

from refimpl.models import generic
from refimpl.models.config import HFConfig
from refimpl.models.granitemoehybrid import divide
from refimpl.models.layers import Layer, MambaLayer
from refimpl.models.registry import ModelLayers

ARCHITECTURES = ("Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Lfm2VlForConditionalGeneration")


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    cfg = generic.text_config(cfg)
    n = generic.num_layers(cfg)
    types = generic.first(cfg, ("layer_types",), "LFM2's layer kinds")
    conv_dim = divide(
        int(generic.first(cfg, ("conv_dim",), "LFM2's conv width")),
        tensor_parallel_size,
        "LFM2's conv dim",
    )
    width = int(generic.first(cfg, ("conv_L_cache",), "LFM2's conv length")) - 1
    dtype = cfg.model_dtype()
    attention = generic.attention_layers(
        cfg, tensor_parallel_size, [None] * n, generic.total_kv_heads(cfg)
    )
    prefix = generic.layer_prefix(cfg)
    layers: list[Layer] = []
    for i, kind in enumerate(types[:n]):
        if kind == "conv":
            layers.append(
                MambaLayer(
                    f"{prefix}model.layers.{i}.short_conv",
                    ((width, conv_dim),),
                    (dtype,),
                    mamba_type="short_conv",
                )
            )
        elif kind == "full_attention":
            layers.append(attention.layers[i])
        else:
            raise ValueError(
                f"{cfg.source}: layer {i} has layer type {kind!r}; "
                "LFM2 has conv, full_attention"
            )
    return ModelLayers(
        layers, num_kv_heads=attention.num_kv_heads, head_size=attention.head_size
    )
