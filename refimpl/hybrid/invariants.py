"""The rules a hybrid `BlockPool` keeps after every operation (Part I's twin:
`paged.invariants`).

Tests and graders call `check_pool_invariants` after each step; it raises `InvariantError`
naming the first broken rule, so a failure says what went wrong rather than where it crashed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from refimpl.errors import InvariantError
from refimpl.hybrid.block_pool import BlockPool
from refimpl.hybrid.kv_cache_utils import KVCacheBlock


def check_pool_invariants(
    pool: BlockPool, block_tables: Iterable[Sequence[KVCacheBlock]] = ()
) -> None:
    """Raise `InvariantError` naming the first broken rule of the pool.

    `block_tables` are all block tables that hold blocks of this pool (every group of every
    request); when given, each block's ref_cnt must equal the number of tables entries naming
    it.
    """
    queue = pool.free_block_queue
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    # 1. free-queue links: walk forward, check back links, count
    seen: list[KVCacheBlock] = []
    node = head
    while node.next_free_block is not tail:
        nxt = node.next_free_block
        if nxt is None:
            raise InvariantError(
                "free queue: forward walk fell off the list before the tail sentinel"
            )
        if nxt.prev_free_block is not node:
            raise InvariantError(
                f"free queue: block {nxt.block_id}'s prev link does not point back"
            )
        seen.append(nxt)
        if len(seen) > pool.num_gpu_blocks:
            raise InvariantError("free queue: cycle in the forward links")
        node = nxt
    if tail.prev_free_block is not node:
        raise InvariantError(
            "free queue: tail sentinel's prev link does not point at the last block"
        )
    if len(seen) != queue.num_free_blocks:
        raise InvariantError(
            f"free queue: counter says {queue.num_free_blocks} but {len(seen)} blocks are "
            "linked"
        )
    in_queue = {b.block_id for b in seen}
    if len(in_queue) != len(seen):
        raise InvariantError("free queue: a block appears twice")
    # 2. per-block rules
    null = pool.null_block
    if (
        null.block_id != 0
        or not null.is_null
        or null.block_id in in_queue
        or null.block_hash is not None
    ):
        raise InvariantError(
            "null block: must be block 0, flagged null, never queued, never hashed"
        )
    for block in pool.blocks:
        if block.is_null:
            continue
        if block.ref_cnt < 0:
            raise InvariantError(
                f"ref counts: block {block.block_id} has ref_cnt {block.ref_cnt}"
            )
        queued = block.block_id in in_queue
        if queued != (block.ref_cnt == 0):
            raise InvariantError(
                f"ref counts: block {block.block_id} has ref_cnt {block.ref_cnt} but "
                f"queued={queued} "
                "(a block is free exactly when nobody references it)"
            )
        if not queued and (
            block.prev_free_block is not None or block.next_free_block is not None
        ):
            raise InvariantError(
                f"free queue: block {block.block_id} is in use but keeps stale links"
            )
    # 3. hash map <-> block hashes
    mapped: set[int] = set()
    for key, blocks in pool.cached_block_hash_to_block.items():
        for block in blocks:
            if block.block_hash != key and key not in pool.cached_block_hashes_by_block.get(
                block.block_id, ()
            ):
                raise InvariantError(
                    f"hash map: block {block.block_id} is filed under a key it does not carry"
                )
            if block.is_null:
                raise InvariantError("hash map: the null block is registered")
            mapped.add(block.block_id)
    for block in pool.blocks:
        if block.block_hash is not None and block.block_id not in mapped:
            raise InvariantError(
                f"hash map: block {block.block_id} carries a hash but is not in the map"
            )
    key_to_blocks = dict(pool.cached_block_hash_to_block.items())
    for block_id, aliases in pool.cached_block_hashes_by_block.items():
        block = pool.blocks[block_id]
        if block.block_hash is None:
            raise InvariantError(
                f"hash map: block {block_id} has extra keys but no key of its own"
            )
        for key in aliases:
            if all(b is not block for b in key_to_blocks.get(key, [])):
                raise InvariantError(
                    f"hash map: partial key of block {block_id} is not in the map"
                )
    # 4. ref counts against the block tables
    tables = list(block_tables)
    if tables:
        counts = [0] * pool.num_gpu_blocks
        for table in tables:
            for block in table:
                counts[block.block_id] += 1
        for block in pool.blocks:
            if not block.is_null and block.ref_cnt != counts[block.block_id]:
                raise InvariantError(
                    f"ref counts: block {block.block_id} has ref_cnt {block.ref_cnt} but "
                    f"{counts[block.block_id]} table entries"
                )
