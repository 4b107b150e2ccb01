"""One pool of KV-cache blocks shared by every cache group (vLLM v1's `BlockPool`).

A hybrid model such as DeepSeek V4 has several cache groups (full-attention MLA, sliding-window
KV, compressor state, ...). Each group keeps its own block tables, but all block ids come from
this single pool, so a block id means "one slab of `block_stride` bytes" whichever group owns it.

Pieces, with upstream names kept:
- `KVCacheBlock`: bookkeeping of one block (ref count, prefix-cache key, free-queue links).
- `FreeKVCacheBlockQueue`: a doubly linked list threaded through the blocks themselves, with fake
  head and tail sentinels, so popleft / remove / append / prepend are all O(1).
- `BlockHashToBlockMap`: prefix-cache key -> block(s); duplicates are allowed because a block
  table only ever grows, so two requests that computed the same block keep their own copies.
- `BlockPool`: hands out blocks, takes them back, registers and looks up cached blocks.

`refimpl.hybrid.invariants.check_pool_invariants` states the rules the three structures keep.

Block 0 is the *null block*: a placeholder that sliding-window groups put in their tables where
a block has left the window. It is never handed out, never hashed, never put back in the queue.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Sequence

from refimpl.errors import InvariantError
from refimpl.validation import check_positive_int

BlockHash = bytes
"""A chained content hash of a prefix (see `request.hash_block_tokens`)."""

BlockHashWithGroupId = bytes
"""A prefix-cache key: the block hash followed by the group id as 4 big-endian bytes."""


def make_block_hash_with_group_id(block_hash: BlockHash, group_id: int) -> BlockHashWithGroupId:
    """Key of a block in the prefix cache: the same prefix cached by two groups gives two keys."""
    return block_hash + group_id.to_bytes(4, "big")


def get_group_id(key: BlockHashWithGroupId) -> int:
    """The group id stored in the last 4 bytes of a prefix-cache key."""
    return int.from_bytes(key[-4:], "big")


class KVCacheBlock:
    """Metadata of one block of the pool; the bytes themselves live in the cache tensors.

    `ref_cnt` counts the block tables holding this block. A block with `ref_cnt == 0` sits in the
    free queue but may still carry a hash ("lazily freed"): a prefix hit can revive it until
    `get_new_blocks` hands it to someone else and its hash is dropped.
    """

    __slots__ = ("block_id", "ref_cnt", "_block_hash", "prev_free_block", "next_free_block", "is_null")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self._block_hash: BlockHashWithGroupId | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False

    @property
    def block_hash(self) -> BlockHashWithGroupId | None:
        return self._block_hash

    def set_block_hash(self, key: BlockHashWithGroupId) -> None:
        """Give the block its prefix-cache key; a block is hashed once until `reset_hash`."""
        if self._block_hash is not None:
            raise InvariantError(f"block {self.block_id} already has a hash; reset it before re-hashing")
        self._block_hash = key

    def reset_hash(self) -> None:
        """Forget the prefix-cache key (the block is about to hold other tokens)."""
        self._block_hash = None

    def __repr__(self) -> str:
        tag = ", null" if self.is_null else ""
        hashed = ", hashed" if self._block_hash is not None else ""
        return f"KVCacheBlock({self.block_id}, ref_cnt={self.ref_cnt}{hashed}{tag})"


class FreeKVCacheBlockQueue:
    """Free blocks in eviction order, head first, as a doubly linked list with sentinels.

    The links live on the blocks (`prev_free_block` / `next_free_block`), so removing a block
    found by a prefix hit needs no search. The sentinels mean no operation special-cases an
    empty list or an end of the list.
    """

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        chain = [self.fake_free_list_head, *blocks, self.fake_free_list_tail]
        for left, right in zip(chain, chain[1:]):
            left.next_free_block = right
            right.prev_free_block = left

    def popleft(self) -> KVCacheBlock:
        """Take the head block (the next to be reused)."""
        first = self.fake_free_list_head.next_free_block
        if first is self.fake_free_list_tail or first is None:
            raise ValueError("no free blocks left: popleft from an empty free queue")
        self._unlink(first)
        return first

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Take the first `n` blocks, in queue order."""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks: only {self.num_free_blocks} are free")
        return [self.popleft() for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        """Take a block out from anywhere in the queue in O(1) (a prefix hit revives it)."""
        if block.prev_free_block is None or block.next_free_block is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        self._unlink(block)

    def append(self, block: KVCacheBlock) -> None:
        """Put a block at the tail: it will be reused last (LRU for cached blocks)."""
        self._link_before(self.fake_free_list_tail, block)

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        for block in blocks:
            self.append(block)

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put blocks at the head, keeping their order: blocks[0] becomes the new head."""
        anchor = self.fake_free_list_head.next_free_block
        assert anchor is not None
        for block in blocks:
            self._link_before(anchor, block)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The free blocks in queue order (head first); O(n), for tests and pictures."""
        return list(self)

    def __iter__(self) -> Iterator[KVCacheBlock]:
        node = self.fake_free_list_head.next_free_block
        while node is not None and node is not self.fake_free_list_tail:
            yield node
            node = node.next_free_block

    def __len__(self) -> int:
        return self.num_free_blocks

    def _link_before(self, anchor: KVCacheBlock, block: KVCacheBlock) -> None:
        if block.prev_free_block is not None or block.next_free_block is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        before = anchor.prev_free_block
        assert before is not None
        before.next_free_block = block
        block.prev_free_block = before
        block.next_free_block = anchor
        anchor.prev_free_block = block
        self.num_free_blocks += 1

    def _unlink(self, block: KVCacheBlock) -> None:
        before, after = block.prev_free_block, block.next_free_block
        assert before is not None and after is not None
        before.next_free_block = after
        after.prev_free_block = before
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1


class BlockHashToBlockMap:
    """Prefix-cache key -> the blocks holding that prefix, first inserted first.

    Usually one block per key; a second request that computed the same block before the first
    one registered it keeps its own copy, and both stay registered (no deduplication), so block
    tables never have to be rewritten.
    """

    def __init__(self) -> None:
        self._cache: dict[BlockHashWithGroupId, dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: BlockHashWithGroupId) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        if not blocks:
            return None
        return next(iter(blocks.values()))

    def insert(self, key: BlockHashWithGroupId, block: KVCacheBlock) -> None:
        self._cache.setdefault(key, {})[block.block_id] = block

    def pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        if blocks is None:
            return None
        block = blocks.pop(block_id, None)
        if not blocks:
            del self._cache[key]
        return block

    def items(self) -> Iterator[tuple[BlockHashWithGroupId, list[KVCacheBlock]]]:
        for key, blocks in self._cache.items():
            yield key, list(blocks.values())

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
        # Extra keys of partially filled blocks (fine-grained prefix caching): block id -> keys.
        self.cached_block_hashes_by_block: dict[int, list[BlockHashWithGroupId]] = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    # --- prefix cache
    def get_cached_block(self, block_hash: BlockHash, kv_cache_group_ids: Sequence[int]) -> list[KVCacheBlock] | None:
        """One cached block per group for this prefix, or None if any group misses it."""
        found = []
        for group_id in kv_cache_group_ids:
            block = self.cached_block_hash_to_block.get_one_block(make_block_hash_with_group_id(block_hash, group_id))
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
    ) -> None:
        """Register blocks [num_cached_blocks, num_full_blocks) of one group's table.

        `block_hashes[i]` is the hash of the prefix ending with block i at this group's block
        size. Null blocks and blocks whose `block_mask` entry is False are skipped (a sliding
        window group hashes only the blocks a future hit could use).
        """
        if num_cached_blocks >= num_full_blocks:
            return
        if num_full_blocks > len(blocks) or num_full_blocks > len(block_hashes):
            raise ValueError(
                f"cannot cache {num_full_blocks} full blocks: the table has {len(blocks)} blocks "
                f"and the request has {len(block_hashes)} block hashes"
            )
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.is_null or (block_mask is not None and not block_mask[i]):
                continue
            if block.block_hash is not None:  # already registered (e.g. a prefix hit)
                continue
            key = make_block_hash_with_group_id(block_hashes[i], kv_cache_group_id)
            self._drop_partial_hashes(block)  # promotion: the full key replaces partial aliases
            block.set_block_hash(key)
            self.cached_block_hash_to_block.insert(key, block)

    def cache_partial_block(self, block_hash: BlockHash, block: KVCacheBlock, kv_cache_group_id: int) -> None:
        """Register a not-yet-full block under the hash of a prefix that ends inside it.

        Only fine-grained groups (hit alignment smaller than the block size) do this: a later
        request may then reuse the block's first tokens by copying them (copy-on-write).
        """
        if block.is_null or block.block_hash is not None:
            return
        key = make_block_hash_with_group_id(block_hash, kv_cache_group_id)
        aliases = self.cached_block_hashes_by_block.setdefault(block.block_id, [])
        if key not in aliases:
            aliases.append(key)
            self.cached_block_hash_to_block.insert(key, block)

    def _drop_partial_hashes(self, block: KVCacheBlock) -> bool:
        aliases = self.cached_block_hashes_by_block.pop(block.block_id, [])
        for key in aliases:
            if self.cached_block_hash_to_block.pop(key, block.block_id) is None:
                raise InvariantError(f"block {block.block_id} has a partial key missing from the hash map")
        return bool(aliases)

    def is_cached(self, block: KVCacheBlock) -> bool:
        """Does the block answer any prefix-cache key (full or partial)?"""
        return block.block_hash is not None or block.block_id in self.cached_block_hashes_by_block

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop a block's prefix-cache entry before it is reused; True if it had one."""
        had_partial = self._drop_partial_hashes(block)
        key = block.block_hash
        if key is None:
            return had_partial
        if self.cached_block_hash_to_block.pop(key, block.block_id) is None:
            raise InvariantError(f"block {block.block_id} has a hash but is missing from the hash map")
        block.reset_hash()
        return True

    # --- allocate / free
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take `num_blocks` blocks from the head of the free queue (ref_cnt becomes 1)."""
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"cannot allocate {num_blocks} blocks: only {self.get_num_free_blocks()} are free")
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            if self.enable_caching:
                self._maybe_evict_cached_block(block)
            if block.ref_cnt != 0:
                raise InvariantError(f"block {block.block_id} was in the free queue with ref_cnt {block.ref_cnt}")
            block.ref_cnt = 1
        return blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take one more reference on blocks found by a prefix hit (reviving free ones)."""
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block; blocks reaching 0 go back to the free queue.

        `ordered_blocks` is in eviction priority, first evicted first. A block without a key can
        never be a prefix hit, so it goes to the *front* (reused first); a block with a key (full,
        or partial for fine-grained groups) goes to the *back*, so the prefix cache evicts least
        recently freed first.
        """
        to_front: list[KVCacheBlock] = []
        to_back: list[KVCacheBlock] = []
        for block in ordered_blocks:
            if block.ref_cnt <= 0 and not block.is_null:
                raise InvariantError(f"freeing block {block.block_id} whose ref_cnt is already {block.ref_cnt}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and not block.is_null:
                if not self.enable_caching or not self.is_cached(block):
                    to_front.append(block)
                else:
                    to_back.append(block)
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
