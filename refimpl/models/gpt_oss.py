"""gpt-oss: sliding-window and full attention alternate, every layer with attention sinks
(vLLM's gpt_oss.py).

vLLM slides the even layers (`layer_idx % 2 == 0`) whatever `layer_types` says. The sinks are
learned per-head logits, weights rather than cache: they add nothing to the KV cache, so the
specs are the plain full / sliding-window ones.
"""

from __future__ import annotations

from refimpl.models.config import HFConfig, kv_heads_per_rank
from refimpl.models.layers import AttentionLayer
from refimpl.models.registry import ModelLayers

ARCHITECTURES = ("GptOssForCausalLM",)


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    n = int(cfg.require("num_hidden_layers"))
    window = int(cfg.require("sliding_window"))
    per_rank = kv_heads_per_rank(int(cfg.require("num_key_value_heads")), tensor_parallel_size)
    size = int(cfg.require("head_dim"))
    layers = [
        AttentionLayer(
            f"model.layers.{i}.attn.attn", per_rank, size, window if i % 2 == 0 else None
        )
        for i in range(n)
    ]
    return ModelLayers(layers, num_kv_heads=per_rank, head_size=size)
