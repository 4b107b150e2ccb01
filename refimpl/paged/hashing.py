"""The prefix-cache fingerprint of a block: xxh64 over the previous block's hash and this block's tokens."""

from __future__ import annotations

from typing import Sequence as Seq

import numpy as np
import xxhash


def compute_hash(token_ids: Seq[int], prefix: int = -1) -> int:
    """Hash one block of tokens, chained to the hash of the block before it.

    Mixing in `prefix` makes the hash stand for the whole prefix up to and including this block,
    so equal blocks after different histories get different hashes (a Merkle-style chain).
    Tokens are hashed as little-endian int64, as numpy lays them out on common platforms.
    """
    h = xxhash.xxh64()
    if prefix != -1:
        h.update(prefix.to_bytes(8, "little"))
    h.update(np.asarray(token_ids, dtype="<i8").tobytes())
    return h.intdigest()
