"""vLLM's allocator (the installed package) behind the crosscheck harness's `Allocator`
interface.

Only imported inside `.venv-vllm` (see `make crosscheck`).
"""

from __future__ import annotations

import logging
import math

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus

from tools.crosscheck.adapter import ManagerAdapter
from tools.crosscheck.streams import GroupSet, retention_interval

init_none_hash(sha256)
# refused resets are answers here, not warnings
logging.getLogger("vllm").setLevel(logging.ERROR)


def make_spec(desc: tuple):
    common = dict(num_kv_heads=1, head_size=8, dtype=torch.float16)
    if desc[0] == "full":
        return FullAttentionSpec(block_size=desc[1], **common)
    if desc[0] == "chunked":
        return ChunkedLocalAttentionSpec(
            block_size=desc[1], attention_chunk_size=desc[2], **common
        )
    return SlidingWindowSpec(block_size=desc[1], sliding_window=desc[2], **common)


class VllmAllocator(ManagerAdapter):
    RequestStatus = RequestStatus

    def __init__(self, gs: GroupSet, retention: str = "0") -> None:
        groups = []
        for i, d in enumerate(gs.groups):
            g = KVCacheGroupSpec([f"layer{i}"], make_spec(d))
            g.is_eagle_group = i in gs.eagle_groups
            groups.append(g)
        sizes = [d[1] for d in gs.groups]
        self.hash_block_size = math.gcd(*sizes)
        config = KVCacheConfig(
            num_blocks=gs.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=groups,
            prefix_cache_retention_interval=retention_interval(retention, gs),
        )
        self.m = KVCacheManager(
            config,
            gs.max_model_len,
            scheduler_block_size=math.lcm(*sizes),
            hash_block_size=self.hash_block_size,
            enable_caching=gs.enable_caching,
            use_eagle=gs.use_eagle,
            watermark=gs.watermark,
            max_in_flight_tokens=gs.max_in_flight_tokens,
        )
        self.hasher = get_request_block_hasher(self.hash_block_size, sha256)

    def new_request(self, rid, tokens):
        return Request(
            rid, list(tokens), SamplingParams(max_tokens=1000), None, block_hasher=self.hasher
        )

    def _computed_blocks(self, req):
        return self.m.get_computed_blocks(req)

    def _free_block_ids(self):
        return [b.block_id for b in self.m.block_pool.free_block_queue.get_all_free_blocks()]
