"""Falcon (vLLM's falcon.py): which flag decides the KV heads.

The new decoder architecture (Falcon-40B/180B) has `num_kv_heads` groups; the original one
shares one K/V head among all heads when `multi_query` is set (Falcon-7B), else keeps one per
head. Every layer is full attention, head size = hidden_size / num_attention_heads.
Falcon's rotary and ALiBi attention layers are built without vLLM's cache config, so their
cache stays in the model dtype even with `--kv-cache-dtype fp8`; only the plain variant
(neither rotary nor ALiBi) follows the flag.
"""

from __future__ import annotations

from dataclasses import replace

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
    model = generic.attention_layers(
        cfg, tensor_parallel_size, [None] * n, total_kv_heads(cfg)
    )
    if cfg.text.get("rotary", True) or cfg.text.get("alibi", False):
        model.layers = [replace(layer, model_dtype_cache=True) for layer in model.layers]
    return model
