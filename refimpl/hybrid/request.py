"""A request as the hybrid allocator sees it (a minimal stand-in for vLLM's `Request`).

Token ids, how many are computed, and the chained prefix hashes at `hash_block_size`
granularity, extended as tokens arrive (`kv_cache_utils.hash_block_tokens` is the hash they
chain).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import xxhash

from refimpl.hybrid.kv_cache_utils import NONE_HASH, BlockHash
from refimpl.validation import check_positive_int


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass
class Request:
    """Tokens of one request and the prefix hashes of every full `hash_block_size` chunk."""

    request_id: str
    prompt_token_ids: list[int]
    hash_block_size: int
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    block_hashes: list[BlockHash] = field(default_factory=list)
    # Where a prefix this request shares with others ends, when a sliding window has not kept
    # it yet. The scheduler sets it from `KVCacheManager.get_computed_blocks`' third value (as
    # vLLM's does); retention then keeps the window's blocks there.
    shared_prefix_boundary: int = 0
    # Tokens scheduled in steps whose output is not processed yet (async scheduling keeps
    # one step in flight). A sliding window frees its old blocks only up to the processed
    # tokens: the in-flight step's attention still reads them.
    num_in_flight_tokens: int = 0

    def __post_init__(self) -> None:
        check_positive_int("hash_block_size", self.hash_block_size)
        # a list is kept as given, as vLLM's Request keeps its prompt (make_request passes
        # the fresh list its check built: a long prompt is not copied twice); else a list
        if type(self.prompt_token_ids) is not list:
            self.prompt_token_ids = list(self.prompt_token_ids)
        # vLLM's `num_tokens` is a property (the length of its token list); here a count kept
        # by `append_output_token_ids`, the only place tokens are added, because the
        # scheduler reads it several times per request and step
        self.num_tokens = len(self.prompt_token_ids) + len(self.output_token_ids)
        self._update_block_hashes()

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_schedulable_tokens(self) -> int:
        """Tokens a step may compute up to: here the known tokens; a scheduler's request adds
        draft tokens and (async scheduling) tokens sampled but not yet returned."""
        return self.num_tokens

    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        """Add sampled tokens (one id or several, as vLLM's method takes) and hash the
        chunks they complete."""
        if isinstance(token_ids, int):
            self.output_token_ids.append(token_ids)
        else:
            self.output_token_ids.extend(token_ids)
        self.num_tokens = len(self.prompt_token_ids) + len(self.output_token_ids)
        if self.num_tokens >= (len(self.block_hashes) + 1) * self.hash_block_size:
            self._update_block_hashes()  # a chunk is complete (most decode steps: none)

    def _update_block_hashes(self) -> None:
        """Hash every newly completed chunk (`hash_packed_chunks`); the tokens are converted
        to bytes once, and only the new chunks' tokens, without joining prompt and output (a
        long prompt would be copied every time a decode step completes a chunk)."""
        h = self.hash_block_size
        first = len(self.block_hashes) * h
        prompt, output = self.prompt_token_ids, self.output_token_ids
        num_new = (self.num_tokens - first) // h
        if num_new <= 0:
            return
        end, num_prompt = first + num_new * h, len(prompt)
        if end <= num_prompt:
            tokens = prompt[first:end]
        elif first >= num_prompt:
            tokens = output[first - num_prompt : end - num_prompt]
        else:
            tokens = prompt[first:] + output[: end - num_prompt]
        raw = struct.pack(f"<{len(tokens)}q", *tokens)  # int64 as hash_block_tokens packs
        parent = self.block_hashes[-1] if self.block_hashes else NONE_HASH
        self.block_hashes.extend(hash_packed_chunks(parent, raw, h))


def hash_packed_chunks(parent: BlockHash, raw: bytes, hash_block_size: int) -> list[BlockHash]:
    """The chained hashes of the whole `hash_block_size`-token chunks in `raw` (token ids as
    little-endian int64), the first chained to `parent`: the same as `hash_block_tokens`
    chunk by chunk, one xxh3 call per chunk. `KVCacheManager.make_request` hashes a new
    prompt from the bytes its check already packed."""
    step = 8 * hash_block_size
    hashes, digest = [], xxhash.xxh3_128_digest
    for start in range(0, len(raw) - step + 1, step):
        parent = digest(parent + raw[start : start + step])
        hashes.append(parent)
    return hashes
