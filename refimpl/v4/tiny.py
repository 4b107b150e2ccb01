"""A tiny random DeepSeek V4 checkpoint that transformers loads, for notebooks and tests.

`make_tiny_v4(path)` builds transformers' `DeepseekV4ForCausalLM` from a small config, draws
every weight itself from a seeded generator, and saves the checkpoint (config.json +
model.safetensors) with the offline byte tokenizer of Part I. No weight is left at the value
a path could hide behind: attention sinks, compressor position biases, the hash-expert table,
hyper-connection bases and scales and every norm weight are random, not 0 or 1.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

import torch

from refimpl.engine.tiny import (
    EOS_TOKEN_ID,
    NUM_BYTE_TOKENS,
    SPECIAL_TOKENS,
    build_byte_tokenizer,
    save_byte_tokenizer,
)

LAYER_TYPE_OF_RATIO = {
    0: "sliding_attention",
    4: "compressed_sparse_attention",
    128: "heavily_compressed_attention",
}

V4_TINY_DEFAULTS = dict(
    vocab_size=NUM_BYTE_TOKENS + len(SPECIAL_TOKENS),
    hidden_size=64,
    moe_intermediate_size=32,
    num_attention_heads=4,
    head_dim=32,
    qk_rope_head_dim=8,
    q_lora_rank=32,
    o_groups=2,
    o_lora_rank=16,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    index_n_heads=8,
    index_head_dim=16,
    index_topk=4,
    sliding_window=16,
    hc_mult=2,
    max_position_embeddings=2048,
    compress_ratios=(0, 4, 128, 4),
    num_hash_layers=2,
)


def tiny_v4_config_dict(**sizes) -> dict:
    """The config.json content for the tiny model; `sizes` override V4_TINY_DEFAULTS."""
    unknown = sorted(set(sizes) - set(V4_TINY_DEFAULTS))
    if unknown:
        raise ValueError(
            f"unknown size arguments {unknown}; allowed: {sorted(V4_TINY_DEFAULTS)}"
        )
    hp = {**V4_TINY_DEFAULTS, **sizes}
    ratios = tuple(hp.pop("compress_ratios"))
    bad = [r for r in ratios if r not in LAYER_TYPE_OF_RATIO]
    if bad or not ratios:
        raise ValueError(
            f"compress_ratios must be a non-empty list of 0, 4 or 128; got {list(ratios)}"
        )
    n = len(ratios)
    num_hash = min(hp.pop("num_hash_layers"), n)
    rope = hp.pop("qk_rope_head_dim")
    if rope <= 0 or rope % 2 or rope > hp["head_dim"]:
        raise ValueError(f"qk_rope_head_dim must be even and in 2..head_dim, got {rope}")
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        **hp,
        "num_hidden_layers": n,
        "num_key_value_heads": 1,
        "partial_rotary_factor": rope / hp["head_dim"],
        "layer_types": [LAYER_TYPE_OF_RATIO[r] for r in ratios],
        "mlp_layer_types": ["hash_moe"] * num_hash + ["moe"] * (n - num_hash),
        "compress_rates": {
            "compressed_sparse_attention": 4,
            "heavily_compressed_attention": 128,
        },
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "hc_sinkhorn_iters": 20,
        "rms_norm_eps": 1e-6,
        "bos_token_id": EOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": EOS_TOKEN_ID,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": 0,
        "torch_dtype": "float32",
    }


def _draw(
    name: str, shape: torch.Size, g: torch.Generator, top_k: int, num_experts: int
) -> torch.Tensor:
    """One parameter's random value, chosen by what the parameter does (see the module doc)."""
    randn = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    if name.endswith("tid2eid"):  # hash routing: top_k distinct experts per token id
        return torch.stack(
            [torch.randperm(num_experts, generator=g)[:top_k] for _ in range(shape[0])]
        )
    if name.endswith("embed_tokens.weight"):
        return randn(*shape)
    if name.endswith("lm_head.weight"):
        return randn(*shape) * (2.0 / math.sqrt(shape[1]))
    if name.endswith("sinks"):
        return 0.5 * randn(*shape)
    if name.endswith("position_bias"):
        return 0.5 * randn(*shape)
    if name.endswith("e_score_correction_bias"):
        return 0.1 * randn(*shape)
    if name.endswith(("base", "hc_base")):
        return 0.5 * randn(*shape)
    if name.endswith(("scale", "hc_scale")):
        return 1.0 + 0.2 * randn(*shape)
    if name.endswith(("fn", "hc_fn")):
        return randn(*shape) / math.sqrt(shape[-1])
    if len(shape) == 1:  # norm weights
        return 1.0 + 0.1 * randn(*shape)
    if len(shape) == 3:  # stacked experts: [experts, out, in]
        return randn(*shape) / math.sqrt(shape[-1])
    return randn(*shape) / math.sqrt(shape[-1])


def make_tiny_v4(path: str | os.PathLike, seed: int = 0, **sizes) -> Path:
    """Write a tiny random DeepSeek V4 checkpoint plus tokenizer to `path`; return the path.

    `sizes` override V4_TINY_DEFAULTS; `compress_ratios` lists one ratio per layer
    (0 = sliding window only, 4 = CSA, 128 = HCA).
    """
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar in notebooks and tests

    config_dict = tiny_v4_config_dict(**sizes)
    fields = {
        k: v
        for k, v in config_dict.items()
        if k not in ("architectures", "model_type", "torch_dtype")
    }
    config = DeepseekV4Config(**fields)
    torch.manual_seed(seed)  # transformers' own init runs first; every value is replaced below
    model = DeepseekV4ForCausalLM(config).float().eval()
    g = torch.Generator().manual_seed(seed)
    state = model.state_dict()
    drawn = {
        name: _draw(name, t.shape, g, config.num_experts_per_tok, config.n_routed_experts).to(
            t.dtype
        )
        for name, t in sorted(state.items())
    }
    model.load_state_dict(drawn, strict=True)

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(str(path))
    save_byte_tokenizer(
        path, build_byte_tokenizer(config.vocab_size), config.max_position_embeddings
    )
    return path
