"""The cache layers of any decoder whose vLLM model file follows the common pattern: one
attention layer per decoder layer, every number read from the config's fields.

vLLM's model files differ in module names, MLPs and norms, which the cache never sees; what the
cache sees comes from a handful of fields, read here the way vLLM reads them:
- the text model's config: `text_config` (or `llm_config`, `language_config`; an omni
  model's thinker's) of a multimodal checkpoint, as transformers' `get_text_config` finds it;
- KV heads: the first of `n_head_kv`, `num_kv_heads`, `num_key_value_heads`,
  `multi_query_group_num`, `num_attention_groups`, else one per attention head
  (`ModelArchConfigConvertor.get_total_num_kv_heads`), divided over tensor-parallel ranks;
- head size: `head_dim` when positive, `hidden_size_per_head`, else hidden size / heads
  (`get_head_size`); MLA models (`MLA_MODEL_TYPES`) cache `kv_lora_rank + qk_rope_head_dim`;
- windows: `layer_types` names each layer ("full_attention", "sliding_attention", or
  "chunked_attention": Llama 4's chunked local layers of `attention_chunk_size`); without
  it, or when every layer slides, `sliding_window` applies to every layer (vLLM's
  `CacheConfig.sliding_window`, which each Attention takes unless its model passes its own:
  Phi-3's window on every layer comes from this rule);
- tensor parallelism: vLLM starts only when the attention heads split evenly.

A family with a quirk (a window one token longer, heads chosen by another flag) has its own
small module that calls these helpers; `registry.py` says which architecture uses which.
"""

from __future__ import annotations

from refimpl.models.config import HFConfig, kv_heads_per_rank
from refimpl.models.layers import AttentionLayer, Layer, MLALayer
from refimpl.models.registry import ModelLayers

#: Sub-configs that hold a multimodal checkpoint's language model, in the order looked at.
TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")
#: model types vLLM runs with multi-head latent attention when `kv_lora_rank` is set
#: (`ModelArchConfigConvertor.is_deepseek_mla`)
MLA_MODEL_TYPES = frozenset(
    {
        "axk1",
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v32",
        "kimi_k2",
        "kimi_linear",
        "longcat_flash",
        "glm4_moe_lite",
        "pangu_ultra_moe",
        "hy_v4",
    }
)
_LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
_KV_HEAD_KEYS = (
    "n_head_kv",
    "num_kv_heads",
    "num_key_value_heads",
    "multi_query_group_num",
    "num_attention_groups",
)
_FULL = ("full_attention", "attention", "global_attention", "global")
_SLIDING = ("sliding_attention", "local_attention", "sliding")
_CHUNKED = ("chunked_attention",)


def text_config(cfg: HFConfig) -> HFConfig:
    """The language model's part of a config (the whole config for a text model); an omni
    model's is its thinker's (`thinker_config.text_config`)."""
    where = cfg.raw
    if isinstance(where.get("thinker_config"), dict):
        where = where["thinker_config"]
    for key in TEXT_CONFIG_KEYS:
        sub = where.get(key)
        if isinstance(sub, dict) and sub:
            return HFConfig(cfg.raw, sub, cfg.source, cfg.defaults)
    return cfg


def first(cfg: HFConfig, keys: tuple[str, ...], what: str):
    """The first of `keys` the text config sets, or a ValueError naming them all."""
    for key in keys:
        value = cfg.text.get(key)
        if value is not None:
            return value
    raise ValueError(f"{cfg.source}: the config sets none of {', '.join(keys)} ({what})")


def num_layers(cfg: HFConfig) -> int:
    return int(first(cfg, _LAYER_KEYS, "the number of layers"))


def total_kv_heads(cfg: HFConfig) -> int:
    for key in _KV_HEAD_KEYS:
        value = cfg.text.get(key)
        if value is not None:
            return int(value)
    return int(first(cfg, _HEAD_KEYS, "attention heads"))


def head_size(cfg: HFConfig) -> int:
    head_dim = cfg.text.get("head_dim")
    if head_dim is not None and head_dim > 0:
        return int(head_dim)
    if cfg.text.get("hidden_size_per_head") is not None:
        return int(cfg.text["hidden_size_per_head"])
    return int(first(cfg, _HIDDEN_KEYS, "hidden size")) // int(
        first(cfg, _HEAD_KEYS, "attention heads")
    )


def check_heads_split(cfg: HFConfig, tensor_parallel_size: int) -> None:
    """vLLM starts only when the attention heads split evenly over the tensor-parallel ranks
    (`ModelConfig.verify_with_parallel_config`); a model without attention heads passes."""
    cfg = text_config(cfg)
    heads = next((cfg.text[k] for k in _HEAD_KEYS if cfg.text.get(k) is not None), 0)
    if heads and int(heads) % tensor_parallel_size:
        raise ValueError(
            f"{int(heads)} attention heads cannot be split over {tensor_parallel_size} "
            "tensor-parallel ranks (vLLM needs a divisor)"
        )


def sliding_window(cfg: HFConfig) -> int | None:
    """The model-wide window; 0 means none (vLLM's ModelConfig turns 0 into None)."""
    window = cfg.text.get("sliding_window")
    return int(window) if window else None


def per_layer_windows(cfg: HFConfig, n: int, window: int | None) -> list[int | None]:
    """Each layer's window (None: full attention), from `layer_types` or model-wide."""
    return [w for w, _ in per_layer_attention(cfg, n, window)]


def per_layer_attention(
    cfg: HFConfig, n: int, window: int | None
) -> list[tuple[int | None, int | None]]:
    """Each layer's (sliding window, attention chunk), None where it has none: from
    `layer_types`, or the model-wide window on every layer."""
    types = cfg.text.get("layer_types")
    if types is None or all(t in _SLIDING for t in types):
        return [(window, None)] * n
    if len(types) < n:
        raise ValueError(f"{cfg.source}: layer_types lists {len(types)} of {n} layers")
    out: list[tuple[int | None, int | None]] = []
    for i, kind in enumerate(types[:n]):
        if kind in _FULL:
            out.append((None, None))
        elif kind in _SLIDING:
            if window is None:
                raise ValueError(
                    f"{cfg.source}: layer {i} slides but no sliding_window is set"
                )
            out.append((window, None))
        elif kind in _CHUNKED:
            out.append((None, int(first(cfg, ("attention_chunk_size",), "chunked layers"))))
        else:
            raise ValueError(
                f"{cfg.source}: layer {i} has layer type {kind!r}; the field-driven rules "
                f"plan {', '.join(_FULL + _SLIDING + _CHUNKED)}"
            )
    return out


def layer_prefix(cfg: HFConfig) -> str:
    """vLLM registers a multimodal model's language layers under `language_model.`."""
    return "language_model." if text_config(cfg) is not cfg else ""


def attention_layers(
    cfg: HFConfig,
    tensor_parallel_size: int,
    windows: list[int | None] | list[tuple[int | None, int | None]],
    kv_heads: int,
) -> ModelLayers:
    """One attention layer per decoder layer with these windows (or (window, chunk) pairs)
    and total KV heads."""
    per_rank = kv_heads_per_rank(kv_heads, tensor_parallel_size)
    size = head_size(cfg)
    prefix = layer_prefix(cfg)
    pairs = [w if isinstance(w, tuple) else (w, None) for w in windows]
    layers: list[Layer] = [
        AttentionLayer(
            f"{prefix}model.layers.{i}.self_attn.attn",
            per_rank,
            size,
            window,
            attention_chunk_size=chunk,
        )
        for i, (window, chunk) in enumerate(pairs)
    ]
    return ModelLayers(layers, num_kv_heads=per_rank, head_size=size)


def mla_layers(cfg: HFConfig) -> ModelLayers:
    """One latent row per token and layer: kv_lora_rank + qk_rope_head_dim values."""
    size = int(first(cfg, ("kv_lora_rank",), "MLA")) + int(
        first(cfg, ("qk_rope_head_dim",), "MLA")
    )
    prefix = layer_prefix(cfg)
    layers: list[Layer] = [
        MLALayer(f"{prefix}model.layers.{i}.self_attn.attn", size)
        for i in range(num_layers(cfg))
    ]
    return ModelLayers(layers, num_kv_heads=1, head_size=size, use_mla=True)


def is_mla(cfg: HFConfig) -> bool:
    return (
        cfg.text.get("model_type") in MLA_MODEL_TYPES
        and cfg.text.get("kv_lora_rank") is not None
    )


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    """The field-driven rule: MLA when the model type runs it, else attention layers with
    the config's windows."""
    cfg = text_config(cfg)
    if is_mla(cfg):
        return mla_layers(cfg)
    n = num_layers(cfg)
    windows = per_layer_attention(cfg, n, sliding_window(cfg))
    return attention_layers(cfg, tensor_parallel_size, windows, total_kv_heads(cfg))
