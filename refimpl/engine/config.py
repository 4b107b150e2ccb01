"""Configuration: the model's shape (read from config.json) and the engine's knobs.

`Qwen3ModelConfig` holds only what our Qwen3-architecture model needs, parsed from a Hugging
Face `config.json` (a real Qwen3 checkpoint's file or the one `make_tiny_model` writes).
`Config` mirrors nano-vllm's `Config`: the engine settings `LLM(model_dir, **kwargs)` accepts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from refimpl.kernels.backend import ATTENTION_BACKENDS
from refimpl.paged.sequence import check_block_size
from refimpl.validation import check_fraction, check_positive_int, is_integer

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Qwen3ModelConfig:
    """The hyperparameters of a Qwen3 dense model (the fields of its config.json we use)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 40960
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    eos_token_id: int | None = None
    torch_dtype: str | None = None

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            check_positive_int(name, getattr(self, name))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads}) for grouped-query attention"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"head_dim must be even for rotary embeddings, got {self.head_dim}"
            )

    @property
    def num_kv_groups(self) -> int:
        """How many query heads share one K/V head (1 means plain multi-head attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Qwen3ModelConfig:
        """Read a config.json dictionary; reject features this small model does not
        implement."""
        model_type = raw.get("model_type")
        if model_type != "qwen3":
            raise ValueError(
                "only Qwen3 dense checkpoints are supported (model_type 'qwen3'), got "
                f"{model_type!r}"
            )
        required = (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
        )
        missing = [key for key in required if key not in raw]
        if missing:
            raise ValueError(f"config.json lacks {missing}, which every Qwen3 config has")
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(
                f"only hidden_act 'silu' is supported, got {raw.get('hidden_act')!r}"
            )
        if raw.get("use_sliding_window", False):
            raise ValueError(
                "sliding-window attention (use_sliding_window=true) is not supported"
            )
        # transformers 4 writes rope_theta/rope_scaling; transformers 5 writes rope_parameters.
        rope = raw.get("rope_parameters") or {}
        rope_type = rope.get("rope_type", "default")
        scaling = raw.get("rope_scaling")
        if scaling:
            rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type != "default":
            raise ValueError(
                f"only the default rotary embedding is supported, got rope type {rope_type!r}"
            )
        rope_theta = rope.get("rope_theta", raw.get("rope_theta", 1_000_000.0))
        eos = raw.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        head_dim = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=raw["num_attention_heads"],
            num_key_value_heads=raw.get("num_key_value_heads") or raw["num_attention_heads"],
            head_dim=head_dim,
            max_position_embeddings=raw.get("max_position_embeddings", 40960),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            eos_token_id=eos,
            torch_dtype=raw.get("dtype", raw.get("torch_dtype")),
        )

    @classmethod
    def from_pretrained(cls, model_dir: str | os.PathLike) -> Qwen3ModelConfig:
        path = os.path.join(model_dir, "config.json")
        if not os.path.isfile(path):
            raise ValueError(f"{model_dir!s} is not a model directory: it has no config.json")
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))


def resolve_dtype(
    dtype: str | torch.dtype, checkpoint_dtype: str | None, device: torch.device
) -> torch.dtype:
    """'auto' means float32 on CPU (fast and exact enough to compare with transformers) and the
    checkpoint's own dtype on a GPU."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or 'auto', got {dtype}")
        return dtype
    if dtype == "auto":
        if device.type == "cpu":
            return torch.float32
        return _DTYPES.get(str(checkpoint_dtype), torch.float32)
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or 'auto', got {dtype!r}")
    return _DTYPES[dtype]


@dataclass
class Config:
    """Engine settings (nano-vllm's Config). Unknown keyword arguments are rejected by `LLM`.

    The KV cache pool is `num_kvcache_blocks` blocks if given, else as many blocks as fit in
    `kv_cache_memory_bytes`, else the blocks `max_num_seqs` sequences of `max_model_len` tokens
    can use, within the memory left to this process (256 MiB on a CPU; on a GPU
    `gpu_memory_utilization` of the card less what this process already holds): see
    `refimpl.engine.kv_budget`.
    """

    model: str
    max_num_batched_tokens: int = 16384
    max_num_seqs: int = 512
    max_model_len: int = 4096
    kvcache_block_size: int = 256
    num_kvcache_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    attention_backend: str | None = None
    dtype: str | torch.dtype = "auto"
    device: str | None = None
    seed: int = 0
    hf_config: Qwen3ModelConfig = field(init=False, repr=False)
    eos: int = field(init=False, default=-1)

    def __post_init__(self) -> None:
        if not os.path.isdir(self.model):
            raise ValueError(f"model must be a local checkpoint directory, got {self.model!r}")
        check_positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        check_positive_int("max_num_seqs", self.max_num_seqs)
        check_positive_int("max_model_len", self.max_model_len)
        check_block_size(self.kvcache_block_size)
        if self.num_kvcache_blocks is not None:
            check_positive_int("num_kvcache_blocks", self.num_kvcache_blocks)
        if self.kv_cache_memory_bytes is not None:
            check_positive_int("kv_cache_memory_bytes", self.kv_cache_memory_bytes)
        check_fraction("gpu_memory_utilization", self.gpu_memory_utilization)
        if self.attention_backend not in (None, "auto", *ATTENTION_BACKENDS):
            raise ValueError(
                f"attention_backend must be one of {ATTENTION_BACKENDS} or None/'auto' (best "
                "available), "
                f"got {self.attention_backend!r}"
            )
        if not is_integer(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        self.hf_config = Qwen3ModelConfig.from_pretrained(self.model)
        self.max_model_len = min(self.max_model_len, self.hf_config.max_position_embeddings)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.init and f.name != "model"]
