"""Command R7B / Command A (Cohere2): sliding layers that see one token more than the config's
window (vLLM's commandr.py and cohere2_moe.py).

Cohere's sliding layers attend to [pos - sliding_window, pos], sliding_window + 1 tokens, so
vLLM passes `sliding_window + 1` as the layer's window: a 4,096 window in config.json is a
4,097-token window in the cache. `layer_types` says which layers slide; the others are full.
"""

from __future__ import annotations

from refimpl.models import generic
from refimpl.models.config import HFConfig
from refimpl.models.registry import ModelLayers

ARCHITECTURES = (
    "Cohere2ForCausalLM",
    "Cohere2MoeForCausalLM",
    "Cohere2VisionForConditionalGeneration",
)


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    cfg = generic.text_config(cfg)
    window = generic.sliding_window(cfg)
    n = generic.num_layers(cfg)
    windows = generic.per_layer_windows(cfg, n, None if window is None else window + 1)
    return generic.attention_layers(
        cfg, tensor_parallel_size, windows, generic.total_kv_heads(cfg)
    )
