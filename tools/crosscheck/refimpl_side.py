"""refimpl's allocator behind the crosscheck harness's `Allocator` interface."""

from __future__ import annotations

from refimpl.hybrid.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from refimpl.hybrid.kv_cache_manager import KVCacheManager
from refimpl.hybrid.request import RequestStatus
from tools.crosscheck.adapter import ManagerAdapter
from tools.crosscheck.streams import GroupSet, retention_interval


def make_spec(desc: tuple):
    common = dict(num_kv_heads=1, head_size=8, dtype="float16")
    if desc[0] == "full":
        return FullAttentionSpec(block_size=desc[1], **common)
    if desc[0] == "chunked":
        return ChunkedLocalAttentionSpec(
            block_size=desc[1], attention_chunk_size=desc[2], **common
        )
    return SlidingWindowSpec(block_size=desc[1], sliding_window=desc[2], **common)


class RefimplAllocator(ManagerAdapter):
    RequestStatus = RequestStatus

    def __init__(self, gs: GroupSet, retention: str = "0") -> None:
        groups = [
            KVCacheGroupSpec((f"layer{i}",), make_spec(d), is_eagle_group=i in gs.eagle_groups)
            for i, d in enumerate(gs.groups)
        ]
        self.m = KVCacheManager(
            groups,
            gs.num_blocks,
            gs.max_model_len,
            watermark=gs.watermark,
            enable_caching=gs.enable_caching,
            use_eagle=gs.use_eagle,
            max_num_batched_tokens=gs.max_in_flight_tokens,
            prefix_cache_retention_interval=retention_interval(retention, gs),
        )

    def new_request(self, rid, tokens):
        return self.m.make_request(rid, tokens)

    def _computed_blocks(self, req):
        return self.m.get_computed_blocks(req)

    def _free_block_ids(self):
        return [b.block_id for b in self.m.block_pool.free_block_queue]
