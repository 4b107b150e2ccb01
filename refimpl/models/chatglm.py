"""ChatGLM / GLM-4 (vLLM's chatglm.py): grouped K/V heads only with `multi_query_attention`.

`multi_query_group_num` K/V heads when `multi_query_attention` is set (GLM-4-9B: 2 groups),
otherwise one per attention head; head size = hidden_size / num_attention_heads (the
config's `kv_channels` is not read); `num_layers` counts the layers, all full attention.
"""

from __future__ import annotations

from refimpl.models import generic
from refimpl.models.config import HFConfig
from refimpl.models.registry import ModelLayers

ARCHITECTURES = ("ChatGLMModel", "ChatGLMForConditionalGeneration")


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    heads = int(generic.first(cfg, ("num_attention_heads",), "attention heads"))
    if cfg.text.get("multi_query_attention"):
        heads = int(generic.first(cfg, ("multi_query_group_num",), "ChatGLM's KV groups"))
    n = generic.num_layers(cfg)
    return generic.attention_layers(cfg, tensor_parallel_size, [None] * n, heads)
