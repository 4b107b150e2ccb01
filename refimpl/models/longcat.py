"""LongCat-Flash (vLLM's longcat_flash.py): two MLA attention modules in every layer.

Each decoder layer runs attention twice (`self_attn.0`, `self_attn.1`), each with its own
latent cache of kv_lora_rank + qk_rope_head_dim values per token, so the model caches twice
as many MLA layers as `num_layers`.
"""

from __future__ import annotations

from refimpl.models import generic
from refimpl.models.config import HFConfig
from refimpl.models.layers import Layer, MLALayer
from refimpl.models.registry import ModelLayers

ARCHITECTURES = ("LongcatFlashForCausalLM",)


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    size = generic.mla_layers(cfg).head_size
    layers: list[Layer] = [
        MLALayer(f"model.layers.{i}.self_attn.{j}.attn", size)
        for i in range(generic.num_layers(cfg))
        for j in range(2)
    ]
    return ModelLayers(layers, num_kv_heads=1, head_size=size, use_mla=True)
