"""Llama-style decoders: Llama, Mistral, Qwen2, Qwen3 (vLLM's llama.py, qwen2.py, qwen3.py).

One attention layer per decoder layer, `model.layers.{i}.self_attn.attn`, with
`num_key_value_heads` K/V heads of `head_dim` (or hidden_size / num_attention_heads). A layer
slides when `layer_types` says "sliding_attention"; a config without `layer_types` (Llama,
Mistral) or with only sliding layers gives every layer the model-wide `sliding_window`.
Qwen2/Qwen3 keep their window only with `use_sliding_window`, and then only from layer
`max_window_layers` on (transformers' rule, which vLLM reads).
"""

from __future__ import annotations

from refimpl.models.config import HFConfig, kv_heads_per_rank
from refimpl.models.layers import AttentionLayer
from refimpl.models.registry import ModelLayers

ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
#: transformers' MistralConfig default when the file has no "sliding_window" key at all.
MISTRAL_DEFAULT_SLIDING_WINDOW = 4096


def head_dim(cfg: HFConfig) -> int:
    """`head_dim`, or hidden_size / num_attention_heads when the config gives none."""
    return int(
        cfg.get("head_dim") or cfg.require("hidden_size") // cfg.require("num_attention_heads")
    )


def layer_types(cfg: HFConfig) -> tuple[list[str] | None, int | None]:
    """(per-layer types or None, the model's sliding window) after transformers' defaults."""
    n = int(cfg.require("num_hidden_layers"))
    window = cfg.get("sliding_window")
    if cfg.text_model_type in ("qwen2", "qwen3"):
        window = window if cfg.get("use_sliding_window") else None
        types = cfg.get("layer_types") or [
            "sliding_attention"
            if window is not None and i >= int(cfg.get("max_window_layers", 28))
            else "full_attention"
            for i in range(n)
        ]
        return list(types), window
    if cfg.text_model_type == "mistral" and "sliding_window" not in cfg.text:
        window = MISTRAL_DEFAULT_SLIDING_WINDOW
    return cfg.get("layer_types"), window


def per_layer_windows(cfg: HFConfig) -> list[int | None]:
    """Each decoder layer's window (None: full attention), vLLM's way: `layer_types` decides
    when it mixes kinds; otherwise the model-wide window (CacheConfig.sliding_window) applies
    to every layer."""
    n = int(cfg.require("num_hidden_layers"))
    types, window = layer_types(cfg)
    if window == 0:  # vLLM: a window of 0 means no sliding window
        window = None
    if types is None or all(t == "sliding_attention" for t in types):
        return [window] * n
    if len(types) < n:
        raise ValueError(f"{cfg.source}: layer_types lists {len(types)} of {n} layers")
    return [window if t == "sliding_attention" else None for t in types[:n]]


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    kv_heads = int(cfg.get("num_key_value_heads") or cfg.require("num_attention_heads"))
    per_rank = kv_heads_per_rank(kv_heads, tensor_parallel_size)
    size = head_dim(cfg)
    layers = [
        AttentionLayer(f"model.layers.{i}.self_attn.attn", per_rank, size, window)
        for i, window in enumerate(per_layer_windows(cfg))
    ]
    return ModelLayers(layers, num_kv_heads=per_rank, head_size=size)
