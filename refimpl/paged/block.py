"""Block: the bookkeeping record of one physical stretch of KV-cache memory."""

from __future__ import annotations


class Block:
    """Metadata of one physical block; the K/V numbers themselves live in the cache tensors.

    `ref_count` counts the sequences sharing the block, `hash` is the chained content hash
    (-1 while the block is not full or not registered), and `token_ids` keeps a copy of the
    tokens so a hash hit can be double-checked token by token.
    """

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1
        self.token_ids: list[int] = []

    def update(self, hash: int, token_ids: list[int]) -> None:
        """Register the block in the prefix cache once it is full."""
        self.hash = hash
        self.token_ids = token_ids

    def reset(self) -> None:
        """Hand the block to a new owner: one reference, no content yet."""
        self.ref_count = 1
        self.hash = -1
        self.token_ids = []

    def __repr__(self) -> str:
        return (
            f"Block(block_id={self.block_id}, ref_count={self.ref_count}, "
            f"hash={self.hash}, num_tokens={len(self.token_ids)})"
        )
