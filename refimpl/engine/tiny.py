"""A tiny random Qwen3 checkpoint with an offline byte-level tokenizer, for notebooks and
tests.

`make_tiny_model(path)` writes the same files a real Qwen3 checkpoint directory has
(config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json), so `refimpl.engine.LLM`, `transformers.AutoModelForCausalLM` and
`transformers.AutoTokenizer` all load it with no network. The weights are random but seeded,
and drawn by refimpl itself, so the same seed gives the same model whatever the transformers
version.

The tokenizer maps each UTF-8 byte to the token with the same number (0..255), then adds
special tokens (`<|endoftext|>` = 256 is end of sequence). Any text round-trips exactly.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from refimpl.engine.config import Qwen3ModelConfig

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
NUM_BYTE_TOKENS = 256
EOS_TOKEN = SPECIAL_TOKENS[0]
EOS_TOKEN_ID = NUM_BYTE_TOKENS

TINY_DEFAULTS = dict(
    vocab_size=NUM_BYTE_TOKENS + len(SPECIAL_TOKENS),
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (what ByteLevel uses)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def build_byte_tokenizer(vocab_size: int = TINY_DEFAULTS["vocab_size"]) -> Tokenizer:
    """A byte-level tokenizer: token i < 256 is byte i, then the special tokens.

    It is a BPE model with no merges, so it never joins bytes; ids above the special tokens
    (up to vocab_size) become `<|reserved_N|>` so every id the model can emit decodes.
    """
    num_fixed = NUM_BYTE_TOKENS + len(SPECIAL_TOKENS)
    if vocab_size < num_fixed:
        raise ValueError(
            f"vocab_size must be at least {num_fixed} (256 bytes + {len(SPECIAL_TOKENS)} "
            f"special tokens), got {vocab_size}"
        )
    vocab = {char: byte for byte, char in _bytes_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = list(SPECIAL_TOKENS) + [
        f"<|reserved_{i}|>" for i in range(vocab_size - num_fixed)
    ]
    tokenizer.add_special_tokens(
        [AddedToken(s, special=True, normalized=False) for s in specials]
    )
    return tokenizer


def save_byte_tokenizer(path: Path, tokenizer: Tokenizer, model_max_length: int) -> None:
    """Write tokenizer.json and the tokenizer_config.json that lets AutoTokenizer load it
    offline."""
    tokenizer.save(str(path / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "bos_token": None,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def _random_weights(config: Qwen3ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights with Hugging Face's names, scaled so activations and logits stay O(1).

    Linear layers draw N(0, 1/fan_in); norm weights are near 1 but not equal (so a mix-up of
    two norms would change the output); the output projection gives logits with a spread of
    about 2, so greedy decoding picks varied tokens instead of repeating one.
    """
    g = torch.Generator().manual_seed(seed)
    hidden, inter, hd = config.hidden_size, config.intermediate_size, config.head_dim
    nh, nkv = config.num_attention_heads, config.num_key_value_heads

    def linear(out_features: int, in_features: int, gain: float = 1.0) -> torch.Tensor:
        return torch.randn(out_features, in_features, generator=g) * (
            gain / math.sqrt(in_features)
        )

    def norm(size: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(size, generator=g)

    weights = {
        "model.embed_tokens.weight": torch.randn(config.vocab_size, hidden, generator=g)
    }
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        weights[p + "input_layernorm.weight"] = norm(hidden)
        weights[p + "self_attn.q_proj.weight"] = linear(nh * hd, hidden)
        weights[p + "self_attn.k_proj.weight"] = linear(nkv * hd, hidden)
        weights[p + "self_attn.v_proj.weight"] = linear(nkv * hd, hidden)
        weights[p + "self_attn.q_norm.weight"] = norm(hd)
        weights[p + "self_attn.k_norm.weight"] = norm(hd)
        weights[p + "self_attn.o_proj.weight"] = linear(hidden, nh * hd)
        weights[p + "post_attention_layernorm.weight"] = norm(hidden)
        weights[p + "mlp.gate_proj.weight"] = linear(inter, hidden)
        weights[p + "mlp.up_proj.weight"] = linear(inter, hidden)
        weights[p + "mlp.down_proj.weight"] = linear(hidden, inter)
    weights["model.norm.weight"] = norm(hidden)
    if config.tie_word_embeddings:
        weights["model.embed_tokens.weight"] *= 2.0 / math.sqrt(hidden)
    else:
        weights["lm_head.weight"] = linear(config.vocab_size, hidden, gain=2.0)
    return weights


def make_tiny_model(
    path: str | os.PathLike, seed: int = 0, dtype: str = "float32", **sizes
) -> Path:
    """Write a tiny random Qwen3 checkpoint plus tokenizer to `path`; return the path.

    `sizes` override TINY_DEFAULTS (vocab_size, hidden_size, intermediate_size,
    num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
    max_position_embeddings, rms_norm_eps, rope_theta, tie_word_embeddings).
    """
    unknown = sorted(set(sizes) - set(TINY_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown size arguments {unknown}; allowed: {sorted(TINY_DEFAULTS)}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    hp = {**TINY_DEFAULTS, **sizes}
    # validates the sizes
    config = Qwen3ModelConfig(**hp, eos_token_id=EOS_TOKEN_ID, torch_dtype=dtype)
    tokenizer = build_byte_tokenizer(config.vocab_size)

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    # config.json in the layout of a real Qwen3 checkpoint (transformers 4 and 5 both read it).
    config_json = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        **hp,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rope_scaling": None,
        "use_sliding_window": False,
        "bos_token_id": EOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "torch_dtype": dtype,
        "use_cache": True,
    }
    (path / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    generation_config = {
        "bos_token_id": EOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": EOS_TOKEN_ID,
        "do_sample": False,
    }
    (path / "generation_config.json").write_text(
        json.dumps(generation_config, indent=2) + "\n"
    )
    weights = {
        name: t.to(_DTYPES[dtype]).contiguous()
        for name, t in _random_weights(config, seed).items()
    }
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    save_byte_tokenizer(path, tokenizer, config.max_position_embeddings)
    return path
