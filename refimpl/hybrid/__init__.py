"""Part II: vLLM v1's hybrid KV cache, as used for DeepSeek V4.

The modules follow vLLM's file map (`vllm/v1/kv_cache_interface.py`, `vllm/v1/core/*`):
`kv_cache_interface` (specs: how many bytes one block of one layer needs), `kv_cache_planning`
(grouping layers that share a block table, packing all groups into one slab), `kv_cache_utils`
(blocks, the free queue, block hashes), `block_pool`, `single_type_kv_cache_manager`,
`kv_cache_coordinator` and `kv_cache_manager` (handing out block ids from that slab). The
planners vLLM ran before are in `older_planners`; `deepseek_v4` lists the model's caches,
`tensors` builds the slab and its per-layer views, `addressing` turns positions into slots.
"""

from refimpl.hybrid import deepseek_v4
from refimpl.hybrid.block_pool import BlockPool
from refimpl.hybrid.invariants import check_pool_invariants
from refimpl.hybrid.kv_cache_coordinator import (
    HybridKVCacheCoordinator,
    KVCacheCoordinator,
    KVCacheCoordinatorNoPrefixCache,
    UnitaryKVCacheCoordinator,
    get_kv_cache_coordinator,
)
from refimpl.hybrid.kv_cache_interface import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from refimpl.hybrid.kv_cache_layout import KVCacheLayout
from refimpl.hybrid.kv_cache_manager import KVCacheBlocks, KVCacheManager
from refimpl.hybrid.kv_cache_planning import (
    approximate_gcd,
    get_kv_cache_config,
    get_kv_cache_groups,
)
from refimpl.hybrid.kv_cache_utils import (
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    KVCachePlan,
    plan_kv_cache,
)
from refimpl.hybrid.request import Request, RequestStatus
from refimpl.hybrid.single_type_kv_cache_manager import (
    FullAttentionManager,
    MambaManager,
    SlidingWindowManager,
)


def __getattr__(name: str):
    """Import torch only when a tensor helper is first used (planning needs no torch)."""
    if name in ("allocate_kv_cache", "bind_kv_cache"):
        from refimpl.hybrid import tensors

        return getattr(tensors, name)
    raise AttributeError(f"module 'refimpl.hybrid' has no attribute {name!r}")


__all__ = [
    "AttentionSpec",
    "BlockPool",
    "ChunkedLocalAttentionSpec",
    "KVCacheLayout",
    "KVCachePlan",
    "MambaManager",
    "MambaSpec",
    "plan_kv_cache",
    "FreeKVCacheBlockQueue",
    "FullAttentionManager",
    "FullAttentionSpec",
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheConfig",
    "KVCacheCoordinator",
    "HybridKVCacheCoordinator",
    "UnitaryKVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "get_kv_cache_coordinator",
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
