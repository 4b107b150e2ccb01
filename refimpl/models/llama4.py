"""Llama 4 (Scout, Maverick): chunked local layers with RoPE, full NoPE layers (vLLM's
llama4.py).

vLLM reads each layer's kind from `no_rope_layers`, not from `layer_types`: a layer with RoPE
(1) attends within chunks of `attention_chunk_size` tokens (`ChunkedLocalAttention`), a NoPE
layer (0) to every token. The published checkpoints leave `no_rope_layers` empty, and
transformers fills it: every `no_rope_layer_interval`-th layer (4: layers 3, 7, ...) is NoPE.
Without `attention_chunk_size` every layer is full.
"""

from __future__ import annotations

from refimpl.models import generic
from refimpl.models.config import HFConfig
from refimpl.models.registry import ModelLayers

ARCHITECTURES = ("Llama4ForCausalLM", "Llama4ForConditionalGeneration")


def rope_layers(cfg: HFConfig, n: int) -> list[int]:
    """`no_rope_layers` as transformers' `Llama4TextConfig` completes it (1: RoPE, chunked)."""
    given = cfg.get("no_rope_layers")
    if given:
        if len(given) < n:
            raise ValueError(f"{cfg.source}: no_rope_layers lists {len(given)} of {n} layers")
        return [int(flag) for flag in given[:n]]
    interval = cfg.get_int("no_rope_layer_interval", 4, minimum=1)
    return [int((i + 1) % interval != 0) for i in range(n)]


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    cfg = generic.text_config(cfg)
    n = generic.num_layers(cfg)
    chunk = cfg.get_int("attention_chunk_size", None, minimum=1)
    pairs = [(None, chunk if rope and chunk else None) for rope in rope_layers(cfg, n)]
    return generic.attention_layers(
        cfg, tensor_parallel_size, pairs, generic.total_kv_heads(cfg)
    )
