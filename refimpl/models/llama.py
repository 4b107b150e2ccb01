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


#: The layer kinds these models build (transformers' names).
LAYER_TYPES = ("full_attention", "sliding_attention")


def attention_heads(cfg: HFConfig) -> tuple[int, int]:
    """(query heads, KV heads): a config without `num_key_value_heads` has one KV head per
    query head (transformers' default); vLLM's attention needs whole query groups per KV
    head."""
    heads = cfg.get_int("num_attention_heads")
    kv_heads = cfg.get_int("num_key_value_heads", heads)
    cfg.check_divides(
        "num_key_value_heads",
        kv_heads,
        "num_attention_heads",
        heads,
        "vLLM's attention shares each KV head by a whole group of query heads",
    )
    return heads, kv_heads


def head_dim(cfg: HFConfig) -> int:
    """`head_dim`, or hidden_size // num_attention_heads when the config gives none (an
    explicit 0 is refused, not replaced). LlamaConfig also requires the hidden size to be a
    multiple of the heads (its `validate_architecture`; Mistral's and Qwen's do not)."""
    heads = cfg.get_int("num_attention_heads")
    hidden = cfg.get_int("hidden_size")
    if cfg.text_model_type == "llama":
        cfg.check_divides(
            "num_attention_heads",
            heads,
            "hidden_size",
            hidden,
            "transformers' LlamaConfig: the hidden size must be a multiple of the heads",
        )
    return cfg.get_int("head_dim", hidden // heads)


def layer_types(cfg: HFConfig) -> tuple[list[str] | None, int | None]:
    """(per-layer types or None, the model's sliding window) after transformers' defaults."""
    n = cfg.get_int("num_hidden_layers")
    window = cfg.get_int("sliding_window", None, minimum=0)
    types = cfg.get_layer_types(LAYER_TYPES, n)
    if cfg.text_model_type in ("qwen2", "qwen3"):
        window = window if cfg.get_bool("use_sliding_window") else None
        first_sliding = cfg.get_int("max_window_layers", 28, minimum=0)
        slides = window is not None
        types = types or [
            "sliding_attention" if slides and i >= first_sliding else "full_attention"
            for i in range(n)
        ]
        return types, window
    if cfg.text_model_type == "mistral" and "sliding_window" not in cfg.text:
        window = MISTRAL_DEFAULT_SLIDING_WINDOW
    return types, window


def per_layer_windows(cfg: HFConfig) -> list[int | None]:
    """Each decoder layer's window (None: full attention), vLLM's way: `layer_types` decides
    when it mixes kinds; otherwise the model-wide window (CacheConfig.sliding_window) applies
    to every layer."""
    n = cfg.get_int("num_hidden_layers")
    types, window = layer_types(cfg)
    if window == 0:  # vLLM: a window of 0 means no sliding window
        window = None
    if types is None or all(t == "sliding_attention" for t in types):
        return [window] * n
    return [window if t == "sliding_attention" else None for t in types]


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    _, kv_heads = attention_heads(cfg)
    per_rank = kv_heads_per_rank(kv_heads, tensor_parallel_size)
    size = head_dim(cfg)
    layers = [
        AttentionLayer(f"model.layers.{i}.self_attn.attn", per_rank, size, window)
        for i, window in enumerate(per_layer_windows(cfg))
    ]
    return ModelLayers(layers, num_kv_heads=per_rank, head_size=size)
