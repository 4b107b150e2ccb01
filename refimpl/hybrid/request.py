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
        self.prompt_token_ids = list(self.prompt_token_ids)
        self._update_block_hashes()

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_schedulable_tokens(self) -> int:
        """Tokens a step may compute up to: here the known tokens; a scheduler's request adds
        draft tokens and (async scheduling) tokens sampled but not yet returned."""
        return self.num_tokens

    def append_output_token_ids(self, token_ids: Sequence[int]) -> None:
        self.output_token_ids.extend(token_ids)
        self._update_block_hashes()

    def _update_block_hashes(self) -> None:
        """Hash every newly completed chunk; same result as `hash_block_tokens` chunk by chunk,
        but the tokens are converted to bytes once (long prompts have many 4-token chunks) and
        each chunk is hashed in one call (xxh3 of parent + tokens, as the streamed updates)."""
        h = self.hash_block_size
        first = len(self.block_hashes) * h
        prompt, output = self.prompt_token_ids, self.output_token_ids
        num_new = (len(prompt) + len(output) - first) // h
        if num_new <= 0:
            return  # most decode steps: no chunk completed, no copy of the tokens
        # only the new chunks' tokens, without joining prompt and output (a long prompt
        # would be copied every time a decode step completes a chunk)
        end, num_prompt = first + num_new * h, len(prompt)
        if end <= num_prompt:
            tokens = prompt[first:end]
        elif first >= num_prompt:
            tokens = output[first - num_prompt : end - num_prompt]
        else:
            tokens = prompt[first:] + output[: end - num_prompt]
        raw = struct.pack(f"<{len(tokens)}q", *tokens)  # int64 as hash_block_tokens packs
        step = 8 * h
        parent = self.block_hashes[-1] if self.block_hashes else NONE_HASH
        hashes, digest = self.block_hashes, xxhash.xxh3_128_digest
        for start in range(0, len(raw), step):
            parent = digest(parent + raw[start : start + step])
            hashes.append(parent)
