"""HRM-Text (vLLM's hrm_text.py): a low-level and a high-level stack of
`num_layers_per_stack` layers run in nested cycles, and every run of a layer keeps its own
cache.

Each of the H_cycles high-level cycles runs the low-level stack L_cycles times and then the
high-level stack once: H_cycles x (L_cycles + 1) steps of num_layers_per_stack attention
layers (2 x 4 x 16 = 128 caches for a 16-layer stack), numbered step x num_layers_per_stack
+ layer. `num_hidden_layers` is not what sizes the cache.
"""

from __future__ import annotations

from refimpl.models import generic
from refimpl.models.config import HFConfig
from refimpl.models.registry import ModelLayers

ARCHITECTURES = ("HrmTextForCausalLM",)


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    steps = int(generic.first(cfg, ("H_cycles",), "HRM's high-level cycles")) * (
        int(generic.first(cfg, ("L_cycles",), "HRM's low-level cycles")) + 1
    )
    stack = int(generic.first(cfg, ("num_layers_per_stack",), "HRM's stack depth"))
    return generic.attention_layers(
        cfg, tensor_parallel_size, [None] * (steps * stack), generic.total_kv_heads(cfg)
    )
