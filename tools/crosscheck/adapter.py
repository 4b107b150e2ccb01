"""What both wrapped allocators share: the harness's calls made on a `KVCacheManager`
(`self.m`).

vLLM's and refimpl's managers take the same calls with the same argument names; they differ
only in how requests are built, what `get_computed_blocks` returns and how the free queue is
listed, so the sides implement just those (`RequestStatus`, `_computed_blocks`,
`_free_block_ids`).
"""

from __future__ import annotations

from typing import Any


class ManagerAdapter:
    """The `Allocator` interface of `streams.Harness`, on top of a KVCacheManager in
    `self.m`."""

    RequestStatus: Any  # the side's request-status enum
    m: Any

    def _computed_blocks(self, req) -> tuple[Any, int, int]:
        """(KVCacheBlocks of the prefix hit, number of hit tokens, the shared-prefix junction
        the lookup pinned on the request)."""
        raise NotImplementedError

    def _free_block_ids(self) -> list[int]:
        """The pool's free queue, head first."""
        raise NotImplementedError

    def append_tokens(self, req, tokens):
        if tokens:
            req.append_output_token_ids(tokens)

    def set_state(self, req, num_computed, running, preempted):
        status = self.RequestStatus
        req.num_computed_tokens = num_computed
        req.status = (
            status.RUNNING if running else (status.PREEMPTED if preempted else status.WAITING)
        )

    def pin_junction(self, req, junction):
        """What vLLM's scheduler does with the lookup's third value."""
        req.shared_prefix_boundary = junction

    def get_computed_blocks(self, req):
        blocks, n, junction = self._computed_blocks(req)
        return blocks, [list(g) for g in blocks.get_block_ids()], n, junction

    def allocate_slots(
        self,
        req,
        n,
        n_computed,
        hits,
        lookahead,
        must_fit,
        has_scheduled,
        reserved=0,
        delay=False,
    ):
        out = self.m.allocate_slots(
            req,
            n,
            num_new_computed_tokens=n_computed,
            new_computed_blocks=hits,
            num_lookahead_tokens=lookahead,
            full_sequence_must_fit=must_fit,
            has_scheduled_reqs=has_scheduled,
            reserved_blocks=reserved,
            delay_cache_blocks=delay,
        )
        return None if out is None else [list(g) for g in out.get_block_ids()]

    def reset_prefix_cache(self):
        return bool(self.m.reset_prefix_cache())

    def free(self, req):
        self.m.free(req)

    def tables(self, rid):
        return [list(g) for g in self.m.get_block_ids(rid)]

    def pool_state(self):
        """The free queue in order, every ref count and the hashed blocks, run-length encoded
        (DeepSeek V4's real block sizes put hundreds of blocks in a pool)."""
        pool = self.m.block_pool
        return {
            "free": id_runs(self._free_block_ids()),
            "ref_cnt": value_runs([b.ref_cnt for b in pool.blocks[1:]]),
            "hashed": id_runs([b.block_id for b in pool.blocks if b.block_hash is not None]),
        }


def id_runs(ids: list[int]) -> list[list[int]]:
    """[3, 4, 5, 9, 8] -> [[3, 5], [9, 9], [8, 8]]: runs of consecutive increasing ids, order
    kept."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return runs


def value_runs(values: list[int]) -> list[list[int]]:
    """[0, 0, 1, 1, 1, 0] -> [[0, 2], [1, 3], [0, 1]]: (value, repeat count) pairs."""
    runs: list[list[int]] = []
    for v in values:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return runs
