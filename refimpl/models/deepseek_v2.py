"""DeepSeek V2 / V3: multi-head latent attention (vLLM's deepseek_v2.py).

Each layer caches one latent row per token: the compressed KV (`kv_lora_rank`, 512) and the
shared RoPE key (`qk_rope_head_dim`, 64), 576 values for all heads together. The cache has one
"head", so tensor parallelism does not shrink it: every rank keeps the whole row. The MTP layer
(`num_nextn_predict_layers`) registers only when speculative decoding is on, so it is not
listed here.
"""

from __future__ import annotations

from refimpl.models.config import HFConfig
from refimpl.models.layers import MLALayer
from refimpl.models.registry import ModelLayers

ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")


def cache_layers(cfg: HFConfig, tensor_parallel_size: int) -> ModelLayers:
    n = cfg.get_int("num_hidden_layers")
    if cfg.text_model_type == "deepseek_v2":  # (DeepseekV3Config states no such rule)
        cfg.check_divides(
            "num_attention_heads",
            cfg.get_int("num_attention_heads"),
            "hidden_size",
            cfg.get_int("hidden_size"),
            "transformers' DeepseekV2Config: the hidden size must be a multiple of the heads",
        )
    rope = cfg.get_int("qk_rope_head_dim", None)
    nope = cfg.get_int("qk_nope_head_dim", None)
    if rope is None or nope is None:
        raise ValueError(
            f"{cfg.source}: a DeepSeek config without qk_rope_head_dim / qk_nope_head_dim "
            "runs vLLM's non-MLA fallback, which refimpl does not plan"
        )
    size = cfg.get_int("kv_lora_rank") + rope
    layers = [MLALayer(f"model.layers.{i}.self_attn.attn", size) for i in range(n)]
    return ModelLayers(layers, num_kv_heads=1, head_size=size, use_mla=True)
