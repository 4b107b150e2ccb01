"""Prefix-hit cases for chapter 12's fixed point: a `KVCacheManager` and a waiting request
whose hit the coordinator finds round after round.

On the running example a hit settles in one round. `two_round_hit` plants cached blocks in a
small model (full attention and two windows) so that a window looked up early must shorten the
hit again after a later window shortened it: the hit needs a second round, and a lookup that
stops after one round answers 8 tokens instead of 0.
"""

from __future__ import annotations

from collections.abc import Iterable

from refimpl.course.hybrid_simulate import toy_full_spec, toy_window_spec
from refimpl.hybrid.kv_cache_manager import KVCacheManager
from refimpl.hybrid.request import Request
from refimpl.hybrid.single_type_kv_cache_manager import BlockHashListWithBlockSize


def plant_cached_blocks(
    manager: KVCacheManager, request: Request, group_id: int, indices: Iterable[int]
) -> dict[int, int]:
    """Put cached, free blocks holding `request`'s blocks `indices` into group `group_id`'s
    prefix cache, as if an earlier request had computed and freed exactly those; returns
    {block index: block id}."""
    indices = sorted(set(indices))
    pool, coordinator = manager.block_pool, manager.coordinator
    if not 0 <= group_id < len(coordinator.single_type_managers):
        raise ValueError(f"group_id must be in 0..{len(coordinator.single_type_managers) - 1}")
    spec = coordinator.single_type_managers[group_id].kv_cache_spec
    hashes = BlockHashListWithBlockSize(
        request.block_hashes, coordinator.hash_block_size, spec.block_size
    )
    if not indices or indices[0] < 0 or indices[-1] >= len(hashes):
        raise ValueError(f"block indices must lie in 0..{len(hashes) - 1}, got {indices}")
    table = [pool.null_block] * (indices[-1] + 1)
    for i in indices:
        (table[i],) = pool.get_new_blocks(1)
    pool.cache_full_blocks(hashes, table, 0, len(table), group_id)
    pool.free_blocks([block for block in table if not block.is_null])
    return {i: table[i].block_id for i in indices}


def two_round_hit() -> tuple[KVCacheManager, Request]:
    """Full attention, an 8-token window and a 5-token window, all in 4-token blocks, and a
    25-token request. Cached: full attention's blocks 0-5, the 8-window's blocks 2, 3 and 5,
    the 5-window's block 1. Round 1: full attention offers 24, the 8-window 16 (blocks 2-3),
    the 5-window 8 (block 1); round 2: the 8-window cannot serve 8 (blocks 0-1 are missing),
    so the hit is 0."""
    manager = KVCacheManager(
        [toy_full_spec(4), toy_window_spec(4, 8), toy_window_spec(4, 5)],
        num_blocks=40,
        max_model_len=64,
    )
    request = manager.make_request("R", list(range(25)))
    plant_cached_blocks(manager, request, 0, range(6))
    plant_cached_blocks(manager, request, 1, [2, 3, 5])
    plant_cached_blocks(manager, request, 2, [1])
    return manager, request
