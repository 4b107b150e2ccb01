"""Falcon (vLLM's falcon.py): which flag decides the KV heads.

The new decoder architecture (Falcon-40B/180B) has `num_kv_heads` groups; the original one
shares one K/V head among all heads when `multi_query` is set (Falcon-7B), else keeps one per
head. Every layer is full attention, head size = hidden_size / num_attention_heads.
"""

from __future__ import annotations

from refimpl.models import generic
from refimpl.models.config import HFConfig
from refimpl.models.registry import ModelLayers

ARCHITECTURES = ("FalconForCausalLM",)


def total_kv_heads(cfg: HFConfig) -> int:
    if cfg.text.get("new_decoder_architecture"):
        return int(generic.first(cfg, ("num_kv_heads",), "Falcon's KV heads"))
    if cfg.text.get("multi_query", True):
        return 1
    return int(generic.first(cfg, ("num_attention_heads",), "attention heads"))


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    n = generic.num_layers(cfg)
    return generic.attention_layers(cfg, tensor_parallel_size, [None] * n, total_kv_heads(cfg))
