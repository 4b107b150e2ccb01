"""MiniCPM3 (vLLM's minicpm3.py): latent projections, but an ordinary K/V cache.

MiniCPM3 has DeepSeek-style `kv_lora_rank` projections, yet vLLM does not run it with MLA:
its attention layer caches full K and V rows per head, of qk_nope_head_dim + qk_rope_head_dim
values (not the config's `head_dim`), with one K/V head per attention head.
"""

from __future__ import annotations

from dataclasses import replace

from refimpl.models import generic
from refimpl.models.config import HFConfig
from refimpl.models.registry import ModelLayers

ARCHITECTURES = ("MiniCPM3ForCausalLM",)


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    size = int(generic.first(cfg, ("qk_nope_head_dim",), "MiniCPM3's head")) + int(
        generic.first(cfg, ("qk_rope_head_dim",), "MiniCPM3's head")
    )
    heads = int(generic.first(cfg, ("num_attention_heads",), "attention heads"))
    n = generic.num_layers(cfg)
    model = generic.attention_layers(cfg, tensor_parallel_size, [None] * n, heads)
    model.layers = [replace(layer, head_size=size) for layer in model.layers]
    model.head_size = size
    return model
