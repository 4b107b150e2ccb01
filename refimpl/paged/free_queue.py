"""A FIFO queue of free block ids that can also remove any id in O(1)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator


class FreeBlockQueue:
    """FIFO of free block ids: take from the head, return to the tail, pull out from the
    middle.

    nano-vllm uses a `deque`, whose `remove` scans the queue (O(n)); reviving a cached block
    then gets slower as the pool grows. An `OrderedDict` is a hash map threaded on a doubly
    linked list, so all three operations are O(1) and iteration order is exactly the deque's
    order.
    """

    def __init__(self, block_ids: Iterable[int] = ()) -> None:
        self._ids: OrderedDict[int, None] = OrderedDict.fromkeys(block_ids)

    def popleft(self) -> int:
        """Remove and return the head (the block freed longest ago)."""
        if not self._ids:
            raise IndexError("popleft from an empty free queue")
        block_id, _ = self._ids.popitem(last=False)
        return block_id

    def append(self, block_id: int) -> None:
        """Put a block at the tail (it will be reused last)."""
        if block_id in self._ids:
            raise ValueError(f"block {block_id} is already in the free queue")
        self._ids[block_id] = None

    def remove(self, block_id: int) -> None:
        """Take a block out from anywhere in the queue."""
        if block_id not in self._ids:
            raise ValueError(f"block {block_id} is not in the free queue")
        del self._ids[block_id]

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._ids

    def __getitem__(self, index: int) -> int:
        """The id at a queue position (0 is the head); O(n), for pictures and tests only."""
        ids = list(self._ids)
        return ids[index]

    def __repr__(self) -> str:
        return f"FreeBlockQueue({list(self._ids)})"
