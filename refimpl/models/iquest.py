"""IQuest-LoopCoder (vLLM's iquest_loopcoder.py): every layer runs `loop_num` times (2 when
the config does not say), each pass with its own cache.

The first pass is an ordinary attention layer; every later pass attends within a sliding
window of `loop_window_size` tokens (64 by default). vLLM numbers pass p of layer i as layer
p x num_hidden_layers + i, so a 12-layer model caches 24 layers: 12 full, 12 windowed.
"""

from __future__ import annotations

from refimpl.models import generic
from refimpl.models.config import HFConfig
from refimpl.models.registry import ModelLayers

ARCHITECTURES = ("IQuestLoopCoderForCausalLM",)
LOOP_NUM = 2  # vLLM's default when the config has no loop_num
LOOP_WINDOW_SIZE = 64  # ... and no loop_window_size


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    n = generic.num_layers(cfg)
    loops = int(cfg.text.get("loop_num") or LOOP_NUM)
    window = int(cfg.text.get("loop_window_size") or LOOP_WINDOW_SIZE)
    first = generic.per_layer_windows(cfg, n, generic.sliding_window(cfg))
    windows = first + [window] * (n * (loops - 1))
    return generic.attention_layers(
        cfg, tensor_parallel_size, windows, generic.total_kv_heads(cfg)
    )
