"""Part I end to end: a tiny nano-vllm engine running a Qwen3-architecture model on the paged
KV cache.

`LLM(model_dir, **kwargs).generate(prompts, sampling_params)` ties the pieces together: the
Scheduler (`refimpl.paged`) decides each step's batch and blocks, the ModelRunner turns block
tables into slot mappings and runs the model, whose attention layers write and read the cache
through the kernels of `refimpl.kernels`. `make_tiny_model` writes a small random checkpoint
that both this engine and transformers load, for notebooks and tests.
"""

from refimpl.engine.config import Config, Qwen3ModelConfig
from refimpl.engine.context import Context, get_context, reset_context, set_context
from refimpl.engine.kv_budget import (
    available_kv_cache_memory,
    blocks_for_work,
    kv_cache_num_blocks,
)
from refimpl.engine.llm import LLM, EngineStats, LLMEngine
from refimpl.engine.loader import load_model
from refimpl.engine.model import Qwen3ForCausalLM
from refimpl.engine.model_runner import ModelRunner
from refimpl.engine.sampler import Sampler
from refimpl.engine.tiny import build_byte_tokenizer, make_tiny_model
from refimpl.paged.sequence import SamplingParams

__all__ = [
    "LLM",
    "LLMEngine",
    "Config",
    "Context",
    "EngineStats",
    "ModelRunner",
    "available_kv_cache_memory",
    "blocks_for_work",
    "kv_cache_num_blocks",
    "Qwen3ForCausalLM",
    "Qwen3ModelConfig",
    "Sampler",
    "SamplingParams",
    "build_byte_tokenizer",
    "get_context",
    "load_model",
    "make_tiny_model",
    "reset_context",
    "set_context",
]
