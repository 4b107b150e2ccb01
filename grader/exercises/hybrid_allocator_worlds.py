"""The worlds exercise 5 (the hybrid allocator) is graded in, and the fields compared after
every step.

Both worlds run refimpl's `KVCacheManager` on small cache groups described as plain rows
`(name, block_size, sliding_window or None)`, so a spec crosses to a grading child as data.

- `WindowWorld` (`check_window_frees`): every sliding-window group is managed by the given
  `SlidingWindowManager` class (refimpl's, or the student's subclass of it); requests run
  through `allocate_slots`, which lets the windows free what left them before every step.
- `HitWorld` (`check_fixed_point_hit`): the coordinator is the given `HybridKVCacheCoordinator`
  class; requests run whole prompts in one step (no window ever frees), register their blocks,
  finish, and later requests look their prefix up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grader.lockstep.calls import StateFields
from refimpl.hybrid.kv_cache_coordinator import HybridKVCacheCoordinator
from refimpl.hybrid.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from refimpl.hybrid.kv_cache_manager import KVCacheManager
from refimpl.hybrid.request import Request, RequestStatus

GroupRow = tuple[str, int, "int | None"]  # (name, block_size, sliding_window; None: full)


def group_specs(rows: Sequence[GroupRow]) -> list[KVCacheGroupSpec]:
    """One single-layer cache group per row (equal rows give equal specs, looked up
    together)."""
    groups = []
    for name, block_size, window in rows:
        common = {
            "block_size": block_size,
            "num_kv_heads": 1,
            "head_size": 8,
            "dtype": "uint8",
        }
        spec = (
            FullAttentionSpec(**common)
            if window is None
            else SlidingWindowSpec(**common, sliding_window=window)
        )
        groups.append(KVCacheGroupSpec([f"{name}.layer"], spec))
    return groups


def _ids(blocks: Sequence[Sequence[Any]]) -> list[list[int]]:
    return [[block.block_id for block in group] for group in blocks]


class _Requests:
    """The requests of a world, by key, and the fields every allocator world reports."""

    manager: KVCacheManager

    def __init__(self, manager: KVCacheManager) -> None:
        self.manager = manager
        self.requests: dict[str, Request] = {}

    def new(self, key: str, token_ids: list[int]) -> None:
        self.requests[key] = self.manager.make_request(key, token_ids)

    def free(self, key: str) -> None:
        return self.manager.free(self.requests[key])

    def pool_state(self) -> StateFields:
        pool = self.manager.block_pool
        fields: StateFields = [
            ("free queue (head first)", [b.block_id for b in pool.free_block_queue]),
        ]
        for key, request in self.requests.items():
            tables = self.manager.coordinator.get_blocks(request.request_id)
            for gid, table in enumerate(tables):
                fields.append((f"{key}.block_table[group {gid}]", [b.block_id for b in table]))
        fields.append(("blocks' ref_cnt (by id)", [b.ref_cnt for b in pool.blocks]))
        fields.append(
            ("hashed block ids", [b.block_id for b in pool.blocks if b.block_hash is not None])
        )
        return fields


class WindowWorld(_Requests):
    """A `KVCacheManager` whose sliding-window groups use `window_class` (exercise 5a)."""

    @classmethod
    def build(
        cls, window_class: type | None, rows: Sequence[GroupRow], num_blocks: int
    ) -> WindowWorld:
        manager = KVCacheManager(
            group_specs(rows), num_blocks, 4096, prefix_cache_retention_interval=None
        )
        if window_class is not None:
            coordinator = manager.coordinator
            for gid, spec in enumerate(coordinator.specs):
                if isinstance(spec, SlidingWindowSpec):
                    coordinator.single_type_managers[gid] = window_class(
                        spec,
                        coordinator.block_pool,
                        gid,
                        hash_block_size=coordinator.hash_block_size,
                        alignment_tokens=coordinator.scheduler_block_size,
                    )
        return cls(manager)

    def state(self) -> StateFields:
        fields = self.pool_state()
        for key, request in self.requests.items():
            fields.append((f"{key}.num_computed_tokens", request.num_computed_tokens))
        return fields

    # --- steps
    def step(self, key: str, num_new_tokens: int) -> list[list[int]] | None:
        """One scheduler step: allocate_slots (the windows free first), then the worker runs
        the tokens. None when they do not fit (nothing is computed)."""
        request = self.requests[key]
        new_blocks = self.manager.allocate_slots(request, num_new_tokens)
        if new_blocks is None:
            return None
        request.num_computed_tokens += num_new_tokens
        request.status = RequestStatus.RUNNING
        return _ids(new_blocks.blocks)

    def sample(self, key: str, token_id: int) -> None:
        """The step's sampled token joins the request (the next step decodes it)."""
        self.requests[key].append_output_token_ids([token_id])

    def remove_skipped_blocks(self, key: str, total_computed_tokens: int) -> list[list[int]]:
        """The coordinator's call, asked directly: every group's freed block ids."""
        return _ids(self.manager.coordinator.remove_skipped_blocks(key, total_computed_tokens))

    def skipped_tokens(self, gid: int, num_computed_tokens: int) -> int:
        manager = self.manager.coordinator.single_type_managers[gid]
        return manager.get_num_skipped_tokens(num_computed_tokens)


class HitWorld(_Requests):
    """A `KVCacheManager` whose coordinator is `coordinator_class` (exercise 5b)."""

    @classmethod
    def build(
        cls,
        coordinator_class: type | None,
        rows: Sequence[GroupRow],
        num_blocks: int,
        retention: int | None,
    ) -> HitWorld:
        groups = group_specs(rows)
        manager = KVCacheManager(
            groups, num_blocks, 4096, prefix_cache_retention_interval=retention
        )
        if not isinstance(manager.coordinator, HybridKVCacheCoordinator):
            raise ValueError("a hit world needs at least two cache groups")
        if coordinator_class is not None:
            manager.coordinator = coordinator_class(
                groups, num_blocks, prefix_cache_retention_interval=retention
            )
            manager.block_pool = manager.coordinator.block_pool
        world = cls(manager)
        world.held: list = []
        return world

    def state(self) -> StateFields:
        fields = self.pool_state()
        for key, request in self.requests.items():
            fields.append((f"{key}.shared_prefix_boundary", request.shared_prefix_boundary))
        return fields

    # --- steps
    def run(self, key: str) -> None:
        """The whole prompt in one step, from scratch, its blocks registered (as
        `allocate_slots` does for a prefill that fits one step)."""
        request = self.requests[key]
        coordinator = self.manager.coordinator
        coordinator.allocate_new_blocks(key, request.num_tokens)
        request.num_computed_tokens = request.num_tokens
        request.status = RequestStatus.RUNNING
        coordinator.cache_blocks(request, request.num_tokens)

    def occupy(self, num_blocks: int) -> list[int]:
        """Another request takes blocks from the head of the free queue (evicting the cached
        prefixes they held)."""
        blocks = self.manager.block_pool.get_new_blocks(num_blocks)
        self.held.extend(blocks)
        return [b.block_id for b in blocks]

    def lookup(self, key: str, max_length: int) -> tuple[list[list[int]], int, int]:
        """The coordinator's `find_longest_cache_hit`, asked directly."""
        hits, hit_length, uncached = self.manager.coordinator.find_longest_cache_hit(
            self.requests[key].block_hashes, max_length
        )
        return _ids(hits), hit_length, uncached

    def get_computed_blocks(self, key: str) -> tuple[list[list[int]], int]:
        """What the scheduler asks (up to the last prompt token); pins the junction on the
        request, as vLLM's scheduler does with the lookup's third value."""
        request = self.requests[key]
        hits, hit_length, request.shared_prefix_boundary = self.manager.get_computed_blocks(
            request
        )
        return _ids(hits.blocks), hit_length
