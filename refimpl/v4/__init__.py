"""Part III: a tiny DeepSeek V4 running on the hybrid paged cache of Part II.

Specs from a Hugging Face DeepSeek V4 config (`kv_cache_specs_from_hf`), Part II's planner,
packed slab and `KVCacheManager` (`build_kv_cache`), the paged attention with its compressor and
indexer (`paged_attention`), and the engine `V4LLM.generate`, whose greedy output equals
transformers' DeepSeek V4 token for token. transformers is imported only when a model is loaded.
"""

from refimpl.v4.specs import cache_shape_from_hf, kv_cache_specs_from_hf
from refimpl.v4.topk import stable_topk, stable_topk_in_transformers


def __getattr__(name: str):
    """Import the torch-heavy parts on first use."""
    lazy = {
        "V4LLM": "refimpl.v4.llm",
        "make_tiny_v4": "refimpl.v4.tiny",
        "build_kv_cache": "refimpl.v4.cache",
        "paged_attention": "refimpl.v4.attention",
        "reference_generate": "refimpl.v4.reference",
    }
    if name in lazy:
        import importlib

        return getattr(importlib.import_module(lazy[name]), name)
    raise AttributeError(f"module 'refimpl.v4' has no attribute {name!r}")


__all__ = [
    "V4LLM",
    "build_kv_cache",
    "cache_shape_from_hf",
    "kv_cache_specs_from_hf",
    "make_tiny_v4",
    "paged_attention",
    "reference_generate",
    "stable_topk",
    "stable_topk_in_transformers",
]
