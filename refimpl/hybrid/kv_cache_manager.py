"""The scheduler's view of the hybrid KV cache (vLLM v1's `KVCacheManager`).

The scheduler asks two things per request and step:
- `get_computed_blocks(request)`: how much of the prompt is already cached (prefix hit), never
  the last token, because its logits must be computed anyway;
- `allocate_slots(request, num_new_tokens, ...)`: make room for this step's tokens in every
  group, or return None (the scheduler then waits or preempts) without changing anything.

The request it works on is `refimpl.hybrid.request.Request`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from refimpl.hybrid.kv_cache_utils import KVCacheBlock
from refimpl.hybrid.kv_cache_coordinator import KVCacheCoordinator
from refimpl.hybrid.request import Request, RequestStatus
from refimpl.validation import check_positive_int
from refimpl.hybrid.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheSpec

@dataclass
class KVCacheBlocks:
    """Blocks per group (group order), as returned to the scheduler."""

    blocks: tuple[list[KVCacheBlock], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in group] for group in self.blocks)

    def num_blocks(self) -> int:
        """Blocks that are not the null block, over all groups."""
        return sum(1 for group in self.blocks for b in group if not b.is_null)


class KVCacheManager:
    """Admission and allocation for all cache groups of a model.

    `kv_cache_groups` and `num_blocks` usually come from a `KVCacheConfig`
    (see `from_config`). `watermark` is a fraction of the pool kept free when admitting new
    requests while others are running, so running requests can still grow. `use_eagle`:
    speculative decoding with an eagle/MTP drafter (prefix hits drop their last block in the
    eagle groups, see `KVCacheCoordinator`).
    """

    def __init__(
        self,
        kv_cache_groups: Sequence[KVCacheGroupSpec | KVCacheSpec],
        num_blocks: int,
        max_model_len: int,
        *,
        enable_caching: bool = True,
        hash_block_size: int | None = None,
        alignment_tokens: int | None = None,
        watermark: float = 0.0,
        max_num_batched_tokens: int | None = None,
        use_eagle: bool = False,
    ) -> None:
        check_positive_int("max_model_len", max_model_len)
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {watermark}")
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.coordinator = KVCacheCoordinator(
            kv_cache_groups,
            num_blocks,
            enable_caching=enable_caching,
            hash_block_size=hash_block_size,
            alignment_tokens=alignment_tokens,
            max_in_flight_tokens=max_num_batched_tokens,
            use_eagle=use_eagle,
        )
        self.block_pool = self.coordinator.block_pool
        self.num_gpu_blocks = num_blocks
        self.watermark_blocks = int(watermark * num_blocks)

    @classmethod
    def from_config(cls, kv_cache_config: KVCacheConfig, max_model_len: int, **kwargs) -> "KVCacheManager":
        """Build from a `KVCacheConfig` (its `kv_cache_groups` and `num_blocks`)."""
        return cls(kv_cache_config.kv_cache_groups, kv_cache_config.num_blocks, max_model_len, **kwargs)

    @property
    def hash_block_size(self) -> int:
        return self.coordinator.hash_block_size

    @property
    def scheduler_block_size(self) -> int:
        return self.coordinator.scheduler_block_size

    def make_request(self, request_id: str, prompt_token_ids: Sequence[int]) -> Request:
        """A `Request` hashed at this manager's hash block size."""
        return Request(request_id, list(prompt_token_ids), self.hash_block_size)

    def empty_blocks(self) -> KVCacheBlocks:
        return KVCacheBlocks(tuple([] for _ in self.coordinator.single_type_managers))

    # --- prefix cache
    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """Prefix-cache hit for a waiting request: blocks per group and the hit length in tokens.

        At most `num_tokens - 1` tokens are looked up: the last token must run through the model
        to produce the next token's logits.
        """
        if not self.enable_caching:
            return self.empty_blocks(), 0
        hits, hit_length = self.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)
        return KVCacheBlocks(hits), hit_length

    # --- allocation
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        delay_cache_blocks: bool = False,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> KVCacheBlocks | None:
        """Make room for `num_new_tokens` more tokens of `request` in every group.

        Returns the newly allocated blocks per group, or None if the pool cannot hold them.
        As in vLLM, the blocks that already left a sliding window are freed *before* the check
        (they are garbage whatever the answer), so even a None answer may have returned blocks
        to the pool; apart from that, None changes nothing.

        `has_scheduled_reqs` defaults to True as in vLLM: the watermark then holds back a
        waiting or preempted request unless the caller says that nothing else is running.
        `num_new_tokens` may be 0 when the step only adopts a prefix hit
        (`num_new_computed_tokens > 0`), as vLLM allows.
        """
        if num_new_tokens < 0 or num_new_computed_tokens < 0 or num_lookahead_tokens < 0 or reserved_blocks < 0:
            raise ValueError("token and block counts passed to allocate_slots must be >= 0")
        if num_new_tokens == 0 and num_new_computed_tokens == 0:
            raise ValueError("num_new_tokens must be > 0 when there are no computed tokens to adopt")
        hits = new_computed_blocks.blocks if new_computed_blocks is not None else None
        if num_new_computed_tokens and hits is None:
            raise ValueError("num_new_computed_tokens > 0 needs the new_computed_blocks from get_computed_blocks")
        total_computed = min(request.num_computed_tokens + num_new_computed_tokens, self.max_model_len)
        if total_computed + num_new_tokens > request.num_tokens + num_lookahead_tokens:
            raise ValueError(
                f"request {request.request_id} has {request.num_tokens} tokens; cannot schedule "
                f"{num_new_tokens} new tokens after {total_computed} computed ones"
            )
        coordinator = self.coordinator
        watermark = self.watermark_blocks
        if not (has_scheduled_reqs and request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)):
            watermark = 0

        if full_sequence_must_fit:
            need_all = coordinator.get_num_blocks_to_allocate(
                request.request_id,
                min(request.num_tokens, self.max_model_len),
                hits,
                total_computed,
                apply_admission_cap=True,
            )
            if need_all + watermark > self.block_pool.get_num_free_blocks():
                return None

        num_tokens_need_slots = min(total_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        # Blocks outside the window are garbage whatever happens next: free them first, so
        # they count as free for the check below (and stay freed if it fails).
        coordinator.remove_skipped_blocks(request.request_id, total_computed)
        num_blocks_to_allocate = coordinator.get_num_blocks_to_allocate(
            request.request_id, num_tokens_need_slots, hits, total_computed
        )
        if num_blocks_to_allocate + watermark > self.block_pool.get_num_free_blocks() - reserved_blocks:
            return None

        if hits is not None:  # first allocation: adopt the hits (possibly none) and start the tables
            coordinator.allocate_new_computed_blocks(request.request_id, hits, total_computed)
        new_blocks = coordinator.allocate_new_blocks(request.request_id, num_tokens_need_slots)

        if self.enable_caching and not delay_cache_blocks:
            coordinator.cache_blocks(
                request.request_id, request.block_hashes, min(total_computed + num_new_tokens, request.num_tokens)
            )
        return KVCacheBlocks(new_blocks)

    def take_kv_cache_block_copies(self) -> list[tuple[int, int, int]]:
        """Tell the allocator the worker ran the pending copy-on-write copies; returns them as
        (group id, source block id, copy block id)."""
        return self.coordinator.take_kv_cache_block_copies()

    def free(self, request: Request) -> None:
        """Give back all blocks of a finished or preempted request (tail first, per group)."""
        self.coordinator.free(request.request_id)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()
