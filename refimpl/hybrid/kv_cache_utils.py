"""Small pieces every part of the hybrid cache shares (vLLM v1's `kv_cache_utils.py`).

- `BlockHash`, `hash_block_tokens`: the chained content hash of a block of tokens.
- `make_block_hash_with_group_id` / `get_group_id`: the prefix-cache key, block hash + group
  id.
- `KVCacheBlock`: bookkeeping of one block (ref count, prefix-cache key, free-queue links).
- `FreeKVCacheBlockQueue`: a doubly linked list threaded through the blocks themselves, with
  fake
  head and tail sentinels, so popleft / remove / append / prepend are all O(1).

vLLM keeps the planner (grouping, layout) here too in 0.32 and moves it to
`kv_cache_planning.py` in later versions; refimpl has it in `kv_cache_planning.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import xxhash

from refimpl.errors import InvariantError

BlockHash = bytes
"""A chained content hash of a prefix (see `hash_block_tokens`)."""

BlockHashWithGroupId = bytes
"""A prefix-cache key: the block hash followed by the group id as 4 big-endian bytes."""


def make_block_hash_with_group_id(
    block_hash: BlockHash, group_id: int
) -> BlockHashWithGroupId:
    """Key of a block in the prefix cache: the same prefix cached by two groups gives two
    keys."""
    return block_hash + group_id.to_bytes(4, "big")


def get_group_id(key: BlockHashWithGroupId) -> int:
    """The group id stored in the last 4 bytes of a prefix-cache key."""
    return int.from_bytes(key[-4:], "big")


class KVCacheBlock:
    """Metadata of one block of the pool; the bytes themselves live in the cache tensors.

    `ref_cnt` counts the block tables holding this block. A block with `ref_cnt == 0` sits in
    the free queue but may still carry a hash ("lazily freed"): a prefix hit can revive it
    until `get_new_blocks` hands it to someone else and its hash is dropped.

    `block_hash_num_tokens` is the prefix length the key stands for: the end of the block for a
    full block, a point inside it for a partial entry (vLLM's `_cache_partial_tail_block`).
    """

    __slots__ = (
        "block_id",
        "ref_cnt",
        "_block_hash",
        "block_hash_num_tokens",
        "prev_free_block",
        "next_free_block",
        "is_null",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self._block_hash: BlockHashWithGroupId | None = None
        self.block_hash_num_tokens: int | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False

    @property
    def block_hash(self) -> BlockHashWithGroupId | None:
        return self._block_hash

    def set_block_hash(self, key: BlockHashWithGroupId, num_tokens: int | None = None) -> None:
        """Give the block its prefix-cache key; a block is hashed once until `reset_hash`."""
        if self._block_hash is not None:
            raise InvariantError(
                f"block {self.block_id} already has a hash; reset it before re-hashing"
            )
        self._block_hash = key
        self.block_hash_num_tokens = num_tokens

    def reset_hash(self) -> None:
        """Forget the prefix-cache key (the block is about to hold other tokens)."""
        self._block_hash = None
        self.block_hash_num_tokens = None

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


NONE_HASH: BlockHash = xxhash.xxh3_128(b"refimpl NONE_HASH").digest()
"""Parent hash of the first block. Fixed (vLLM draws it at random unless PYTHONHASHSEED is set)
so that notebook output is reproducible."""


def hash_block_tokens(
    parent_block_hash: BlockHash | None, token_ids: Sequence[int]
) -> BlockHash:
    """Hash of a prefix: 128-bit xxh3 over the parent's hash and this block's tokens
    (int64)."""
    h = xxhash.xxh3_128()
    h.update(parent_block_hash if parent_block_hash is not None else NONE_HASH)
    h.update(np.asarray(token_ids, dtype="<i8").tobytes())
    return h.digest()
