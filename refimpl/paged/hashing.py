"""The prefix-cache fingerprint of a block: xxh64 over the previous block's hash and this block's tokens."""

from __future__ import annotations

import sys
from array import array
from typing import Sequence as Seq

import numpy as np
import xxhash

_LITTLE_ENDIAN = sys.byteorder == "little"


def _token_bytes(token_ids: Seq[int]) -> bytes:
    """The tokens as little-endian int64 bytes, what `np.asarray(token_ids, "<i8").tobytes()` gives.

    `array("q", ...)` converts a list of ints about three times faster than numpy; anything it
    refuses (floats, out-of-range ids) goes through numpy, which accepts or rejects it as before.
    """
    try:
        packed = array("q", token_ids)
    except (TypeError, OverflowError):
        return np.asarray(token_ids, dtype="<i8").tobytes()
    if not _LITTLE_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def compute_hash(token_ids: Seq[int], prefix: int = -1) -> int:
    """Hash one block of tokens, chained to the hash of the block before it.

    Mixing in `prefix` makes the hash stand for the whole prefix up to and including this block,
    so equal blocks after different histories get different hashes (a Merkle-style chain).
    Tokens are hashed as little-endian int64, as numpy lays them out on common platforms; the
    one-shot digest of `prefix bytes + token bytes` equals nano-vllm's two `update` calls.
    """
    if prefix == -1:
        return xxhash.xxh64_intdigest(_token_bytes(token_ids))
    return xxhash.xxh64_intdigest(prefix.to_bytes(8, "little") + _token_bytes(token_ids))
