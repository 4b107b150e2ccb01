"""gpt-oss: sliding-window and full attention alternate, every layer with attention sinks
(vLLM's gpt_oss.py).

vLLM slides the even layers (`layer_idx % 2 == 0`) whatever `layer_types` says. The sinks are
learned per-head logits, weights rather than cache: they add nothing to the KV cache, so the
specs are the plain full / sliding-window ones.
"""

from __future__ import annotations

from refimpl.models.config import HFConfig, kv_heads_per_rank
from refimpl.models.layers import AttentionLayer
from refimpl.models.llama import LAYER_TYPES, attention_heads
from refimpl.models.registry import ModelLayers

ARCHITECTURES = ("GptOssForCausalLM",)


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    n = cfg.get_int("num_hidden_layers")
    cfg.get_layer_types(LAYER_TYPES, n)  # checked, although vLLM slides the even layers
    window = cfg.get_int("sliding_window")
    _, kv_heads = attention_heads(cfg)
    per_rank = kv_heads_per_rank(kv_heads, tensor_parallel_size)
    size = cfg.get_int("head_dim")
    layers = [
        AttentionLayer(
            f"model.layers.{i}.attn.attn", per_rank, size, window if i % 2 == 0 else None
        )
        for i in range(n)
    ]
    return ModelLayers(layers, num_kv_heads=per_rank, head_size=size)
