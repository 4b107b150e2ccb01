"""vLLM's allocator (the installed package) behind the crosscheck harness's `Allocator` interface.

Only imported inside `.venv-vllm` (see `make crosscheck`).
"""

from __future__ import annotations

import math

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.request import Request, RequestStatus

from tools.crosscheck.streams import GroupSet

init_none_hash(sha256)


def make_spec(desc: tuple):
    common = dict(num_kv_heads=1, head_size=8, dtype=torch.float16)
    if desc[0] == "full":
        return FullAttentionSpec(block_size=desc[1], **common)
    return SlidingWindowSpec(block_size=desc[1], sliding_window=desc[2], **common)


class VllmAllocator:
    def __init__(self, gs: GroupSet) -> None:
        groups = []
        for i, d in enumerate(gs.groups):
            g = KVCacheGroupSpec([f"layer{i}"], make_spec(d))
            g.is_eagle_group = i in gs.eagle_groups
            groups.append(g)
        sizes = [d[1] for d in gs.groups]
        self.hash_block_size = math.gcd(*sizes)
        config = KVCacheConfig(num_blocks=gs.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
        self.m = KVCacheManager(config, gs.max_model_len, scheduler_block_size=math.lcm(*sizes),
                                hash_block_size=self.hash_block_size, enable_caching=gs.enable_caching,
                                use_eagle=gs.use_eagle, watermark=gs.watermark)
        self.hasher = get_request_block_hasher(self.hash_block_size, sha256)

    def new_request(self, rid, tokens):
        return Request(rid, list(tokens), SamplingParams(max_tokens=1000), None, block_hasher=self.hasher)

    def append_tokens(self, req, tokens):
        if tokens:
            req.append_output_token_ids(tokens)

    def set_state(self, req, num_computed, running, preempted):
        req.num_computed_tokens = num_computed
        req.status = RequestStatus.RUNNING if running else (RequestStatus.PREEMPTED if preempted else RequestStatus.WAITING)

    def get_computed_blocks(self, req):
        blocks, n, _shared = self.m.get_computed_blocks(req)
        return blocks, [list(g) for g in blocks.get_block_ids()], n

    def allocate_slots(self, req, n, n_computed, hits, lookahead, must_fit, has_scheduled):
        out = self.m.allocate_slots(req, n, num_new_computed_tokens=n_computed, new_computed_blocks=hits,
                                    num_lookahead_tokens=lookahead, full_sequence_must_fit=must_fit,
                                    has_scheduled_reqs=has_scheduled)
        return None if out is None else [list(g) for g in out.get_block_ids()]

    def free(self, req):
        self.m.free(req)

    def tables(self, rid):
        return [list(g) for g in self.m.get_block_ids(rid)]

    def pool_state(self):
        pool = self.m.block_pool
        return {
            "free": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
            "ref_cnt": [b.ref_cnt for b in pool.blocks[1:]],
            "hashed": [b.block_id for b in pool.blocks if b.block_hash is not None],
        }
