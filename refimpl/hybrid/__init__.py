"""Part II: vLLM v1's hybrid KV cache, as used for DeepSeek V4.

Specs say how many bytes one block of one layer needs; grouping puts layers that can share a
block table together; the layout packs all groups into one slab; the block pool and managers
hand out block ids from that slab.
"""

from refimpl.hybrid.specs import (
    AttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from refimpl.hybrid import deepseek_v4
from refimpl.hybrid.grouping import approximate_gcd, get_kv_cache_groups
from refimpl.hybrid.layout import get_kv_cache_config


def __getattr__(name: str):
    """Import torch only when a tensor helper is first used (planning needs no torch)."""
    if name in ("allocate_kv_cache", "bind_kv_cache"):
        from refimpl.hybrid import tensors

        return getattr(tensors, name)
    raise AttributeError(f"module 'refimpl.hybrid' has no attribute {name!r}")
from refimpl.hybrid.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock  # noqa: E402
from refimpl.hybrid.invariants import check_pool_invariants  # noqa: E402
from refimpl.hybrid.managers import FullAttentionManager, SlidingWindowManager  # noqa: E402
from refimpl.hybrid.coordinator import KVCacheCoordinator  # noqa: E402
from refimpl.hybrid.request import Request, RequestStatus  # noqa: E402
from refimpl.hybrid.kv_cache_manager import KVCacheBlocks, KVCacheManager  # noqa: E402

__all__ = [
    "AttentionSpec",
    "BlockPool",
    "FreeKVCacheBlockQueue",
    "FullAttentionManager",
    "FullAttentionSpec",
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheConfig",
    "KVCacheCoordinator",
    "KVCacheGroupSpec",
    "KVCacheManager",
    "KVCacheSpec",
    "KVCacheTensor",
    "MLAAttentionSpec",
    "Request",
    "RequestStatus",
    "SlidingWindowManager",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "UniformTypeKVCacheSpecs",
    "allocate_kv_cache",
    "approximate_gcd",
    "bind_kv_cache",
    "check_pool_invariants",
    "deepseek_v4",
    "get_kv_cache_config",
    "get_kv_cache_groups",
]
