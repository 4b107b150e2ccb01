"""The prefix-cache fingerprint of a block: xxh64 over the previous block's hash and this
block's tokens."""

from __future__ import annotations

import struct
from collections.abc import Sequence as Seq

import numpy as np
import xxhash


def _token_bytes(token_ids: Seq[int]) -> bytes:
    """The tokens as little-endian int64 bytes, what `np.asarray(token_ids, "<i8").tobytes()`
    gives.

    `struct.pack` converts a list of ints about three times faster than numpy; anything it
    refuses (floats, out-of-range ids) goes through numpy, which accepts or rejects it as
    before.
    """
    try:
        return struct.pack(f"<{len(token_ids)}q", *token_ids)
    except struct.error:
        return np.asarray(token_ids, dtype="<i8").tobytes()


def compute_hash(token_ids: Seq[int] | bytes, prefix: int = -1) -> int:
    """Hash one block of tokens, chained to the hash of the block before it.

    Mixing in `prefix` makes the hash stand for the whole prefix up to and including this
    block, so equal blocks after different histories get different hashes (a Merkle-style
    chain). Tokens are hashed as little-endian int64, as numpy lays them out on common
    platforms; the one-shot digest of `prefix bytes + token bytes` equals nano-vllm's two
    `update` calls. Tokens already packed that way (a Sequence packs its prompt once) may be
    passed as bytes.
    """
    data = token_ids if isinstance(token_ids, bytes) else _token_bytes(token_ids)
    if prefix == -1:
        return xxhash.xxh64_intdigest(data)
    return xxhash.xxh64_intdigest(prefix.to_bytes(8, "little") + data)
