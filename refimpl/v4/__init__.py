"""Part III: a tiny DeepSeek V4 running on the hybrid paged cache of Part II.

Specs from Part II's one DeepSeek V4 spec builder (`hybrid.deepseek_v4.kv_cache_specs`, float32
rows, sizes from the Hugging Face config), Part II's planner, packed slab and `KVCacheManager`
(`build_kv_cache`), addresses from Part II's addressing and the V4 index kernels (the model
runner), the paged attention with its compressor and indexer (`paged_attention`), and the
engine `V4LLM.generate`, whose greedy output equals transformers' DeepSeek V4 (the oracle,
`oracle_generate`) token for token. transformers is imported only when a model is loaded.
"""

from refimpl.v4.topk import stable_topk, stable_topk_in_transformers


def __getattr__(name: str):
    """Import the torch-heavy parts on first use, by name (the import contract sees them)."""
    if name == "V4LLM":
        from refimpl.v4.llm import V4LLM as value
    elif name == "make_tiny_v4":
        from refimpl.v4.tiny import make_tiny_v4 as value
    elif name == "build_kv_cache":
        from refimpl.v4.cache import build_kv_cache as value
    elif name == "paged_attention":
        from refimpl.v4.attention import paged_attention as value
    elif name == "oracle_generate":
        from refimpl.v4.oracle import oracle_generate as value
    else:
        raise AttributeError(f"module 'refimpl.v4' has no attribute {name!r}")
    return value


__all__ = [
    "V4LLM",
    "build_kv_cache",
    "make_tiny_v4",
    "oracle_generate",
    "paged_attention",
    "stable_topk",
    "stable_topk_in_transformers",
]
