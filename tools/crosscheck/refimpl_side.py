"""refimpl's allocator behind the crosscheck harness's `Allocator` interface."""

from __future__ import annotations

from refimpl.hybrid.kv_cache_manager import KVCacheManager
from refimpl.hybrid.request import RequestStatus
from refimpl.hybrid.specs import FullAttentionSpec, KVCacheGroupSpec, SlidingWindowSpec

from tools.crosscheck.streams import GroupSet


def make_spec(desc: tuple):
    common = dict(num_kv_heads=1, head_size=8, dtype="float16")
    if desc[0] == "full":
        return FullAttentionSpec(block_size=desc[1], **common)
    return SlidingWindowSpec(block_size=desc[1], sliding_window=desc[2], **common)


class RefimplAllocator:
    def __init__(self, gs: GroupSet) -> None:
        groups = [
            KVCacheGroupSpec((f"layer{i}",), make_spec(d), is_eagle_group=i in gs.eagle_groups)
            for i, d in enumerate(gs.groups)
        ]
        eagle = {"use_eagle": True} if gs.use_eagle else {}
        self.m = KVCacheManager(groups, gs.num_blocks, gs.max_model_len, watermark=gs.watermark,
                                enable_caching=gs.enable_caching, **eagle)

    def new_request(self, rid, tokens):
        return self.m.make_request(rid, tokens)

    def append_tokens(self, req, tokens):
        if tokens:
            req.append_output_token_ids(tokens)

    def set_state(self, req, num_computed, running, preempted):
        req.num_computed_tokens = num_computed
        req.status = RequestStatus.RUNNING if running else (RequestStatus.PREEMPTED if preempted else RequestStatus.WAITING)

    def get_computed_blocks(self, req):
        blocks, n = self.m.get_computed_blocks(req)
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
            "free": [b.block_id for b in pool.free_block_queue],
            "ref_cnt": [b.ref_cnt for b in pool.blocks[1:]],
            "hashed": [b.block_id for b in pool.blocks if b.block_hash is not None],
        }
