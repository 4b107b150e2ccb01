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
