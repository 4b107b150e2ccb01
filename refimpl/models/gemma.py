"""Gemma 2 and Gemma 3: sliding-window layers interleaved with global ones (vLLM's gemma2.py,
gemma3.py, gemma3_mm.py).

`layer_types` decides each layer; a config without it gets transformers' default pattern:
Gemma 2 alternates (even layers slide), Gemma 3 makes every `sliding_window_pattern`-th layer
(6 by default) global. Gemma 3's multimodal checkpoints keep the text model's numbers under
`text_config`, and vLLM registers its layers under `language_model.`.
"""

from __future__ import annotations

from refimpl.models.config import HFConfig, kv_heads_per_rank
from refimpl.models.layers import AttentionLayer
from refimpl.models.registry import ModelLayers

ARCHITECTURES = ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
#: transformers' Gemma2Config / Gemma3TextConfig defaults for keys a config may leave out.
DEFAULTS = {
    "gemma2": {
        "sliding_window": 4096,
        "head_dim": 256,
        "num_key_value_heads": 4,
        "max_position_embeddings": 8192,
    },
    "gemma3_text": {
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
        "head_dim": 256,
        "num_key_value_heads": 4,
        "num_attention_heads": 8,
        "num_hidden_layers": 26,
    },
}
GEMMA3_SLIDING_WINDOW_PATTERN = 6
#: The layer kinds Gemma 2 and 3 build (transformers' names).
LAYER_TYPES = ("full_attention", "sliding_attention")


def default_layer_types(cfg: HFConfig, n: int) -> list[str]:
    """transformers' pattern: every `period`-th layer global, the others sliding."""
    period = (
        2
        if cfg.text_model_type == "gemma2"
        else cfg.get_int("sliding_window_pattern", GEMMA3_SLIDING_WINDOW_PATTERN)
    )
    return ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(n)]


def with_defaults(cfg: HFConfig) -> HFConfig:
    """The config with transformers' Gemma defaults for the keys it leaves out."""
    text_type = "gemma2" if cfg.text_model_type == "gemma2" else "gemma3_text"
    return cfg.with_defaults(DEFAULTS[text_type])


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    cfg = with_defaults(cfg)
    n = cfg.get_int("num_hidden_layers")
    types = cfg.get_layer_types(LAYER_TYPES, n) or default_layer_types(cfg, n)
    window = cfg.get_int("sliding_window")
    heads, hidden = cfg.get_int("num_attention_heads"), cfg.get_int("hidden_size")
    cfg.check_divides(
        "num_attention_heads",
        heads,
        "hidden_size",
        hidden,
        "transformers' Gemma configs: the hidden size must be a multiple of the heads",
    )
    kv_heads = cfg.get_int("num_key_value_heads")
    cfg.check_divides(
        "num_key_value_heads",
        kv_heads,
        "num_attention_heads",
        heads,
        "vLLM's attention shares each KV head by a whole group of query heads",
    )
    per_rank = kv_heads_per_rank(kv_heads, tensor_parallel_size)
    size = cfg.get_int("head_dim")
    prefix = "language_model." if "text_config" in cfg.raw else ""
    layers = [
        AttentionLayer(
            f"{prefix}model.layers.{i}.self_attn.attn",
            per_rank,
            size,
            window if types[i] == "sliding_attention" else None,
        )
        for i in range(n)
    ]
    return ModelLayers(layers, num_kv_heads=per_rank, head_size=size)
