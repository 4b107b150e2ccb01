"""One pool of KV-cache blocks shared by every cache group (vLLM v1's `BlockPool`).

A hybrid model such as DeepSeek V4 has several cache groups (full-attention MLA, sliding-window
KV, compressor state, ...). Each group keeps its own block tables, but all block ids come from
this single pool, so a block id means "one slab of `block_stride` bytes" whichever group owns
it.

Pieces, with upstream names kept (`KVCacheBlock` and `FreeKVCacheBlockQueue` live in
`kv_cache_utils.py`, as in vLLM):
- `BlockHashToBlockMap`: prefix-cache key -> block(s); duplicates are allowed because a block
  table only ever grows, so two requests that computed the same block keep their own copies.
- `BlockPool`: hands out blocks, takes them back, registers and looks up cached blocks.

`refimpl.hybrid.invariants.check_pool_invariants` states the rules the three structures keep.

Block 0 is the *null block*: a placeholder that sliding-window groups put in their tables where
a block has left the window. It is never handed out, never hashed, never put back in the queue.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from refimpl.errors import InvariantError
from refimpl.hybrid.kv_cache_utils import (
    BlockHash,
    BlockHashWithGroupId,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    make_block_hash_with_group_id,
)
from refimpl.validation import check_positive_int


class BlockHashToBlockMap:
    """Prefix-cache key -> the blocks holding that prefix, first inserted first.

    Usually one block per key; a second request that computed the same block before the first
    one registered it keeps its own copy, and both stay registered (no deduplication), so block
    tables never have to be rewritten. As in vLLM, a key holds its block itself and only a key
    with several blocks holds a dict {block id: block} (no dict per key to build and collect).
    """

    def __init__(self) -> None:
        self._cache: dict[BlockHashWithGroupId, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: BlockHashWithGroupId) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        if blocks is None or isinstance(blocks, KVCacheBlock):
            return blocks
        return next(iter(blocks.values()))

    def insert(self, key: BlockHashWithGroupId, block: KVCacheBlock) -> None:
        blocks = self._cache.setdefault(key, block)  # a new key: one dict operation
        if blocks is block:
            return
        if isinstance(blocks, KVCacheBlock):
            self._cache[key] = {blocks.block_id: blocks, block.block_id: block}
        else:
            blocks[block.block_id] = block

    def pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        blocks = self._cache.pop(key, None)  # one dict operation for the usual single block
        if blocks is None:
            return None
        if isinstance(blocks, KVCacheBlock):
            if blocks.block_id == block_id:
                return blocks
            self._cache[key] = blocks  # another block holds the key: put it back
            return None
        block = blocks.pop(block_id, None)
        if blocks:
            self._cache[key] = blocks
        return block

    def items(self) -> Iterator[tuple[BlockHashWithGroupId, list[KVCacheBlock]]]:
        for key, blocks in self._cache.items():
            yield key, [blocks] if isinstance(blocks, KVCacheBlock) else list(blocks.values())

    def __len__(self) -> int:
        """Number of distinct keys."""
        return len(self._cache)

    def clear(self) -> None:
        self._cache.clear()


class BlockPool:
    """All blocks of the KV cache, one free queue, one prefix-cache map for every group.

    `num_gpu_blocks` counts the null block too, so `num_gpu_blocks - 1` blocks are usable.
    """

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = True) -> None:
        check_positive_int("num_gpu_blocks (block 0 is the null block)", num_gpu_blocks)
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        # Extra keys of a block that has its own key too (a partial prefix ending inside a full
        # block): block id -> keys.
        self.cached_block_hashes_by_block: dict[int, list[BlockHashWithGroupId]] = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    # --- prefix cache
    def get_cached_block(
        self, block_hash: BlockHash, kv_cache_group_ids: Sequence[int]
    ) -> list[KVCacheBlock] | None:
        """One cached block per group for this prefix, or None if any group misses it."""
        found = []
        for group_id in kv_cache_group_ids:
            block = self.cached_block_hash_to_block.get_one_block(
                make_block_hash_with_group_id(block_hash, group_id)
            )
            if block is None:
                return None
            found.append(block)
        return found

    def cache_full_blocks(
        self,
        block_hashes: Sequence[BlockHash],
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        kv_cache_group_id: int,
        block_mask: Sequence[bool] | None = None,
        block_size: int | None = None,
    ) -> None:
        """Register blocks [num_cached_blocks, num_full_blocks) of one group's table.

        `block_hashes[i]` is the hash of the prefix ending with block i at this group's block
        size. Null blocks and blocks whose `block_mask` entry is False are skipped (a sliding
        window group hashes only the blocks a future hit could use); `block_mask[j]` stands for
        block `num_cached_blocks + j`, as in vLLM. A block that already carries a partial entry
        (see `cache_partial_block`) is promoted: its keys are dropped and the full key replaces
        them. `block_size` only records how many tokens each key covers.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        if num_full_blocks > len(blocks) or num_full_blocks > len(block_hashes):
            raise ValueError(
                f"cannot cache {num_full_blocks} full blocks: the table has {len(blocks)} "
                "blocks "
                f"and the request has {len(block_hashes)} block hashes"
            )
        insert = self.cached_block_hash_to_block.insert
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.is_null or (
                block_mask is not None and not block_mask[i - num_cached_blocks]
            ):
                continue
            if block.block_hash is not None:  # a partial entry becomes a full one
                self._maybe_evict_cached_block(block)
            # the block has no key now, hence no extra key: the full key becomes its own
            # (what `_insert_block_hash` does for a block without a key)
            key = make_block_hash_with_group_id(block_hashes[i], kv_cache_group_id)
            block.set_block_hash(key, None if block_size is None else (i + 1) * block_size)
            insert(key, block)

    def cache_partial_block(
        self,
        block_hash: BlockHash,
        block: KVCacheBlock,
        kv_cache_group_id: int,
        num_tokens: int,
    ) -> None:
        """Register a block under the hash of a prefix of `num_tokens` tokens that ends inside
        it.

        vLLM 0.32's rules: a block without a key takes this one as its own key (so it counts as
        cached and is freed to the back of the queue); a block whose key covers fewer tokens
        drops its keys first (the longer prefix replaces the shorter one); a block whose key
        covers more tokens (a full block) keeps it and answers this key too.
        """
        if block.is_null:
            return
        key = make_block_hash_with_group_id(block_hash, kv_cache_group_id)
        already = block.block_hash == key or key in self.cached_block_hashes_by_block.get(
            block.block_id, ()
        )
        if (
            not already
            and block.block_hash is not None
            and block.block_hash_num_tokens is not None
            and block.block_hash_num_tokens < num_tokens
        ):
            self._maybe_evict_cached_block(block)
        self._insert_block_hash(key, block, num_tokens)

    def _insert_block_hash(
        self, key: BlockHashWithGroupId, block: KVCacheBlock, num_tokens: int | None
    ) -> None:
        """File `block` under `key`: as its own key if it has none, else as an extra key."""
        if block.block_hash == key or key in self.cached_block_hashes_by_block.get(
            block.block_id, ()
        ):
            return
        if block.block_hash is None:
            block.set_block_hash(key, num_tokens)
        else:
            self.cached_block_hashes_by_block.setdefault(block.block_id, []).append(key)
        self.cached_block_hash_to_block.insert(key, block)

    def is_cached(self, block: KVCacheBlock) -> bool:
        """Does the block answer any prefix-cache key? (Extra keys exist only next to its
        own.)"""
        return block.block_hash is not None

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop every prefix-cache key of a block (its own, then any extra ones) before it is
        reused or re-keyed; True if it had any."""
        block_hash, block_id = block.block_hash, block.block_id
        if block_hash is None:  # most reused blocks: no key, so no extra keys either
            return False
        # vLLM's eviction: the block's key out of the map, then its hash reset
        pop = self.cached_block_hash_to_block.pop
        if pop(block_hash, block_id) is None:
            self._raise_missing_key(block_id)
        extra = self.cached_block_hashes_by_block  # (empty unless partial entries exist)
        if extra:
            for key in extra.pop(block_id, ()):
                if pop(key, block_id) is None:
                    self._raise_missing_key(block_id)
        block.reset_hash()
        return True

    @staticmethod
    def _raise_missing_key(block_id: int) -> None:
        raise InvariantError(f"block {block_id} has a key missing from the hash map")

    # --- allocate / free
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take `num_blocks` blocks from the head of the free queue (ref_cnt becomes 1)."""
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(
                f"cannot allocate {num_blocks} blocks: only {self.get_num_free_blocks()} are "
                "free"
            )
        blocks = self.free_block_queue.popleft_n(num_blocks)
        if self.enable_caching:  # (one loop either way, as vLLM's, hence two loops here)
            for block in blocks:
                self._maybe_evict_cached_block(block)
                if block.ref_cnt != 0:
                    self._raise_free_with_refs(block)
                block.ref_cnt = 1
        else:
            for block in blocks:
                if block.ref_cnt != 0:
                    self._raise_free_with_refs(block)
                block.ref_cnt = 1
        return blocks

    @staticmethod
    def _raise_free_with_refs(block: KVCacheBlock) -> None:
        raise InvariantError(
            f"block {block.block_id} was in the free queue with ref_cnt {block.ref_cnt}"
        )

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take one more reference on blocks found by a prefix hit (reviving free ones)."""
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block; blocks reaching 0 go back to the free queue.

        `ordered_blocks` is in eviction priority, first evicted first. A block without a key
        can never be a prefix hit, so it goes to the *front* (reused first); a block with a key
        (full or partial) goes to the *back*, so the prefix cache evicts least recently freed
        first.
        """
        to_front: list[KVCacheBlock] = []
        to_back: list[KVCacheBlock] = []
        caching = self.enable_caching
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt <= 0 and not block.is_null:
                if block.ref_cnt < 0:
                    block.ref_cnt += 1
                    raise InvariantError(
                        f"freeing block {block.block_id} whose ref_cnt is already "
                        f"{block.ref_cnt}"
                    )
                if caching and block.block_hash is not None:  # `is_cached`, without a call
                    to_back.append(block)
                else:
                    to_front.append(block)
        self.free_block_queue.prepend_n(to_front)
        self.free_block_queue.append_n(to_back)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; only allowed when no request holds a block."""
        num_used = self.num_gpu_blocks - self.get_num_free_blocks()
        if num_used != 1:  # the null block is always "used"
            return False
        self.cached_block_hash_to_block.clear()
        self.cached_block_hashes_by_block.clear()
        for block in self.blocks:
            block.reset_hash()
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of usable blocks (all but the null block) that are not free."""
        usable = self.num_gpu_blocks - 1
        if usable == 0:
            return 0.0
        return 1.0 - self.get_num_free_blocks() / usable
