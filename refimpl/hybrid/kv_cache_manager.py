"""The scheduler's view of the hybrid KV cache (vLLM v1's `KVCacheManager`).

The scheduler asks two things per request and step:
- `get_computed_blocks(request)`: how much of the prompt is already cached (prefix hit), never
  the last token, because its logits must be computed anyway, and where a shared prefix that
  a sliding window has not kept ends (the scheduler pins it on the request);
- `allocate_slots(request, num_new_tokens, ...)`: make room for this step's tokens in every
  group, or return None (the scheduler then waits or preempts) without changing anything.

The request it works on is `refimpl.hybrid.request.Request`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from refimpl.hybrid.kv_cache_coordinator import get_kv_cache_coordinator
from refimpl.hybrid.kv_cache_interface import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    cdiv,
)
from refimpl.hybrid.kv_cache_utils import NONE_HASH, KVCacheBlock
from refimpl.hybrid.request import Request, RequestStatus, hash_packed_chunks
from refimpl.paged.sequence import checked_token_ids
from refimpl.validation import (
    check_bool,
    check_instance,
    check_int_at_least,
    check_positive_int,
)


def _prefill_end(request: Request) -> int:
    """Where the prefill ends (a resumed request replays its outputs too): Mamba's checkpoint
    rule reads it. Asked only when blocks are counted (not on the decode fast path)."""
    return max(request.num_prompt_tokens, request.num_tokens - 1)


@dataclass
class KVCacheBlocks:
    """Blocks per group (group order), as returned to the scheduler."""

    blocks: tuple[Sequence[KVCacheBlock], ...]  # empty tuples in `empty_kv_cache_blocks`

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
    eagle groups, see `KVCacheCoordinator`). `max_num_batched_tokens` (vLLM's
    `max_in_flight_tokens`) caps what the full-sequence admission check asks of a sliding
    window. `prefix_cache_retention_interval` is vLLM's `CacheConfig` field with vLLM's default
    0: a sliding window keeps its blocks only where a later request can resume (see
    `SlidingWindowManager.reachable_block_mask`); None keeps them at every hit boundary.
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
        prefix_cache_retention_interval: int | None = 0,
    ) -> None:
        check_positive_int("max_model_len", max_model_len)
        check_int_at_least(
            "num_blocks",
            num_blocks,
            2,
            " (block 0 is the null block, so one block holds nothing)",
        )
        check_bool("enable_caching", enable_caching)
        check_bool("use_eagle", use_eagle)
        if max_num_batched_tokens is not None:
            check_positive_int("max_num_batched_tokens", max_num_batched_tokens)
        if isinstance(watermark, bool) or not isinstance(watermark, (int, float)):
            raise TypeError(f"watermark must be a number, got {watermark!r}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {watermark}")
        if isinstance(kv_cache_groups, (str, bytes)) or not isinstance(
            kv_cache_groups, Sequence
        ):
            raise TypeError(
                "kv_cache_groups must be a list of KVCacheGroupSpec, got "
                f"{type(kv_cache_groups).__name__}"
            )
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.coordinator = get_kv_cache_coordinator(
            kv_cache_groups,
            num_blocks,
            enable_caching=enable_caching,
            hash_block_size=hash_block_size,
            alignment_tokens=alignment_tokens,
            max_in_flight_tokens=max_num_batched_tokens,
            use_eagle=use_eagle,
            prefix_cache_retention_interval=prefix_cache_retention_interval,
        )
        # request id -> the Request holding blocks under it (two requests may not share an id)
        self._requests: dict[str, Request] = {}
        self.block_pool = self.coordinator.block_pool
        self.num_gpu_blocks = num_blocks
        self.watermark_blocks = int(watermark * num_blocks)
        # one shared answer for "no blocks", as vLLM's empty_kv_cache_blocks: most decode steps
        # return it, and empty tuples cannot be changed by whoever receives it
        self.empty_kv_cache_blocks = KVCacheBlocks(
            tuple(() for _ in self.coordinator.single_type_managers)
        )

    @classmethod
    def from_config(
        cls, kv_cache_config: KVCacheConfig, max_model_len: int, **kwargs
    ) -> KVCacheManager:
        """Build from a `KVCacheConfig` (its `kv_cache_groups` and `num_blocks`)."""
        return cls(
            kv_cache_config.kv_cache_groups,
            kv_cache_config.num_blocks,
            max_model_len,
            **kwargs,
        )

    @property
    def hash_block_size(self) -> int:
        return self.coordinator.hash_block_size

    @property
    def scheduler_block_size(self) -> int:
        return self.coordinator.scheduler_block_size

    def make_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        request_class: type[Request] = Request,
        **fields,
    ) -> Request:
        """A `Request` (or a subclass's, with its extra `fields`) hashed at this manager's
        hash block size.

        The ids are checked as Part I checks a `Sequence`'s (integers from 0 to 2**63 - 1, the
        int64 the prefix hash packs), the prompt must not be empty and the id must be a string,
        as vLLM's input processor requires. The prompt is hashed from the bytes the check
        packed (a long prompt is packed once).
        """
        check_instance("request_id", request_id, str)
        token_ids, packed = checked_token_ids(prompt_token_ids, "prompt_token_ids")
        if not token_ids:
            raise ValueError(
                f"request {request_id!r} has an empty prompt: a request needs at least one "
                "prompt token"
            )
        block_hashes = hash_packed_chunks(NONE_HASH, packed, self.hash_block_size)
        return request_class(
            request_id, token_ids, self.hash_block_size, block_hashes=block_hashes, **fields
        )

    def empty_blocks(self) -> KVCacheBlocks:
        return self.empty_kv_cache_blocks

    # --- prefix cache
    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int, int]:
        """Prefix-cache hit for a waiting request: blocks per group, the hit length in tokens,
        and `shared_prefix_boundary` (0 when there is none).

        At most `num_tokens - 1` tokens are looked up: the last token must run through the
        model to produce the next token's logits. When a group could have served more than the
        agreed hit (a shared prefix a sliding window has not kept), the third value is the
        junction where that prefix ends. The lookup only reports it: the caller pins it, as
        vLLM's scheduler does (`request.shared_prefix_boundary = ...`), and from then on this
        request's window keeps its blocks there under sparse retention. A caller that ignores
        the value pins nothing, in vLLM as here.
        """
        self._check_request(request)
        if not self.enable_caching:
            return self.empty_blocks(), 0, 0
        hits, hit_length, uncached = self.coordinator.find_longest_cache_hit(
            request.block_hashes, request.num_tokens - 1
        )
        shared_prefix_boundary = hit_length + uncached if uncached else 0
        return KVCacheBlocks(hits), hit_length, shared_prefix_boundary

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
        # (a request that holds blocks passed the check when it got them: the decode steps
        # skip the call)
        if self._requests.get(getattr(request, "request_id", None)) is not request:
            self._check_request(request)
        if not (  # the common case (plain ints and bools) in one test; else name the bad one
            type(num_new_tokens) is int
            and type(num_new_computed_tokens) is int
            and type(num_lookahead_tokens) is int
            and type(reserved_blocks) is int
            and num_new_tokens >= 0
            and num_new_computed_tokens >= 0
            and num_lookahead_tokens >= 0
            and reserved_blocks >= 0
            and type(delay_cache_blocks) is bool
            and type(full_sequence_must_fit) is bool
            and type(has_scheduled_reqs) is bool
        ):
            for name, value in (
                ("num_new_tokens", num_new_tokens),
                ("num_new_computed_tokens", num_new_computed_tokens),
                ("num_lookahead_tokens", num_lookahead_tokens),
                ("reserved_blocks", reserved_blocks),
            ):
                check_int_at_least(name, value, 0)
            for name, flag in (
                ("delay_cache_blocks", delay_cache_blocks),
                ("full_sequence_must_fit", full_sequence_must_fit),
                ("has_scheduled_reqs", has_scheduled_reqs),
            ):
                check_bool(name, flag)
        if new_computed_blocks is not None and not isinstance(
            new_computed_blocks, KVCacheBlocks
        ):
            raise TypeError(
                f"new_computed_blocks must be the KVCacheBlocks from get_computed_blocks, got "
                f"{type(new_computed_blocks).__name__}"
            )
        if num_new_tokens == 0 and num_new_computed_tokens == 0:
            raise ValueError(
                "num_new_tokens must be > 0 when there are no computed tokens to adopt"
            )
        hits = new_computed_blocks.blocks if new_computed_blocks is not None else None
        if hits is not None:
            self._check_hit_blocks(hits)
        if num_new_computed_tokens and hits is None:
            raise ValueError(
                "num_new_computed_tokens > 0 needs the new_computed_blocks from "
                "get_computed_blocks"
            )
        # (comparisons rather than min() on this path: it runs for every request in every
        # step, and min() parses keywords on each call in Python 3.11)
        total_computed = request.num_computed_tokens + num_new_computed_tokens
        if total_computed > self.max_model_len:
            total_computed = self.max_model_len
        if hits is not None:
            self._check_hits_cover(request, hits, total_computed)
        if (
            total_computed + num_new_tokens
            > request.num_schedulable_tokens + num_lookahead_tokens
        ):
            raise ValueError(
                f"request {request.request_id} has {request.num_schedulable_tokens} "
                "schedulable tokens; cannot "
                "schedule "
                f"{num_new_tokens} new tokens after {total_computed} computed ones"
            )
        coordinator = self.coordinator
        watermark = self.watermark_blocks
        if watermark and not (  # (no status to read when there is no watermark)
            has_scheduled_reqs
            and request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        ):
            watermark = 0

        num_tokens = request.num_tokens
        if full_sequence_must_fit:
            need_all = coordinator.get_num_blocks_to_allocate(
                request.request_id,
                min(num_tokens, self.max_model_len),
                hits,
                total_computed,
                apply_admission_cap=True,
                prefill_end=_prefill_end(request),
            )
            if need_all + watermark > self.block_pool.get_num_free_blocks():
                return None

        num_tokens_need_slots = total_computed + num_new_tokens + num_lookahead_tokens
        if num_tokens_need_slots > self.max_model_len:
            num_tokens_need_slots = self.max_model_len
        num_tokens_to_cache = total_computed + num_new_tokens  # (the known ones only)
        if num_tokens_to_cache > num_tokens:
            num_tokens_to_cache = num_tokens
        if hits is None and coordinator.has_slots_for(
            request.request_id, num_tokens_need_slots, num_tokens_to_cache
        ):
            # Most decode steps: every slot exists and no block fills up, so vLLM's calls
            # below would free, allocate and register nothing; only the fit check remains
            # (which needs 0 blocks: it can fail only with a watermark or reserved blocks).
            if (watermark or reserved_blocks) and (
                watermark > self.block_pool.get_num_free_blocks() - reserved_blocks
            ):
                return None
            return self.empty_kv_cache_blocks
        # Blocks outside the window are garbage whatever happens next: free them first, so
        # they count as free for the check below (and stay freed if it fails). Only up to
        # the processed tokens: a step still in flight reads the window below its tokens.
        coordinator.remove_skipped_blocks(
            request.request_id, max(0, total_computed - request.num_in_flight_tokens)
        )
        num_blocks_to_allocate = coordinator.get_num_blocks_to_allocate(
            request.request_id,
            num_tokens_need_slots,
            hits,
            total_computed,
            prefill_end=_prefill_end(request),
        )
        if (
            num_blocks_to_allocate + watermark
            > self.block_pool.get_num_free_blocks() - reserved_blocks
        ):
            return None

        # first allocation: adopt the hits (possibly none) and start the tables
        if hits is not None:
            coordinator.allocate_new_computed_blocks(request.request_id, hits, total_computed)
        new_blocks = coordinator.allocate_new_blocks(request.request_id, num_tokens_need_slots)
        self._requests[request.request_id] = request

        if self.enable_caching and not delay_cache_blocks:
            coordinator.cache_blocks(request, num_tokens_to_cache)
        return KVCacheBlocks(new_blocks)

    def _check_hit_blocks(self, hits: Sequence[Sequence[KVCacheBlock]]) -> None:
        """Hits must be this pool's blocks, one list per group (as get_computed_blocks
        gives)."""
        if len(hits) != len(self.coordinator.single_type_managers):
            raise ValueError(
                f"new_computed_blocks has {len(hits)} groups, this manager has "
                f"{len(self.coordinator.single_type_managers)}"
            )
        blocks = self.block_pool.blocks
        for group in hits:
            for block in group:
                if (
                    not isinstance(block, KVCacheBlock)
                    or not 0 <= block.block_id < len(blocks)
                    or blocks[block.block_id] is not block
                ):
                    raise ValueError(
                        f"new_computed_blocks holds {block!r}, which is not a block of this "
                        "manager's pool"
                    )

    def _check_hits_cover(
        self, request: Request, hits: Sequence[Sequence[KVCacheBlock]], total_computed: int
    ) -> None:
        """Prefix hits start a request's tables, so they must hold exactly the computed tokens:
        ceil(total_computed / block_size) blocks in every group (a window's skipped blocks are
        null blocks, a hit may end inside its last block), as `get_computed_blocks` returns
        them. A fresh block registered as computed would be served to the next request with
        the same prefix although nothing was written to it."""
        if request.request_id in self._requests:
            if any(hits):
                raise ValueError(
                    f"request {request.request_id!r} already holds blocks; "
                    "new_computed_blocks only start a request's first allocation"
                )
            return
        for gid, (manager, group) in enumerate(
            zip(self.coordinator.single_type_managers, hits)
        ):
            need = cdiv(total_computed, manager.block_size)
            if len(group) != need:
                raise ValueError(
                    f"new_computed_blocks holds {len(group)} blocks in group {gid} but "
                    f"{total_computed} computed tokens fill {need} blocks of "
                    f"{manager.block_size} tokens: pass the blocks and the hit length that "
                    "get_computed_blocks returned together"
                )

    def _check_request(self, request: Request) -> None:
        """A `Request`, and not a second one under the id of a request that holds blocks."""
        if self._requests.get(getattr(request, "request_id", None)) is request:
            return  # it holds blocks, so it passed these checks when it got them
        if not isinstance(request, Request):
            raise TypeError(
                "request must be a refimpl.hybrid.request.Request, got "
                f"{type(request).__name__}"
            )
        if request.hash_block_size != self.hash_block_size:
            raise ValueError(
                f"request {request.request_id!r} is hashed every {request.hash_block_size} "
                "tokens but this manager "
                f"hashes every {self.hash_block_size} (build it with make_request)"
            )
        holder = self._requests.get(request.request_id)
        if holder is not None and holder is not request:
            raise ValueError(
                f"request_id {request.request_id!r} already belongs to another request that "
                "holds blocks; "
                "request ids must be unique"
            )

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the hashes of the request's blocks that `num_computed_tokens` fill, if
        prefix caching is on (the async scheduler calls it once a step's sampled tokens are
        known)."""
        # (a request that holds blocks passed the check when it got them: the decode steps
        # skip the call)
        if self._requests.get(getattr(request, "request_id", None)) is not request:
            self._check_request(request)
        if type(num_computed_tokens) is not int or num_computed_tokens < 0:
            check_int_at_least("num_computed_tokens", num_computed_tokens, 0)
        if self.enable_caching and request.request_id in self._requests:
            num_tokens = request.num_tokens
            if num_computed_tokens < num_tokens:
                num_tokens = num_computed_tokens
            # most decode steps fill no block: vLLM's cache_blocks would register nothing
            if not self.coordinator.has_slots_for(request.request_id, 0, num_tokens):
                self.coordinator.cache_blocks(request, num_tokens)

    def take_kv_cache_block_copies(self) -> list[tuple[int, int, int]]:
        """Tell the allocator the worker ran the pending copy-on-write copies; returns them as
        (group id, source block id, copy block id)."""
        return self.coordinator.take_kv_cache_block_copies()

    def new_step_starts(self) -> None:
        """A scheduler step begins (vLLM's hook; Mamba groups forget which keys the previous
        step registered)."""
        self.coordinator.new_step_starts()

    def free(self, request: Request) -> None:
        """Give back all blocks of a finished or preempted request (tail first, per group)."""
        self._check_request(request)
        self.coordinator.free(request.request_id)
        self._requests.pop(request.request_id, None)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def get_max_num_blocks(self, num_tokens: int) -> int:
        """Blocks a new request of `num_tokens` tokens can hold at once: every block for a full
        group; for a sliding-window (chunked local) group, when `max_num_batched_tokens` bounds
        a step, only the window (chunk) plus one step's tokens (older blocks are freed).

        refimpl's own helper: an engine asks it once per request to refuse a request that could
        never fit the pool (vLLM makes the same check once, for `max_model_len`, at start-up).
        """
        check_positive_int("num_tokens", num_tokens)
        return self.coordinator.get_num_blocks_to_allocate(
            "<no request yet>", num_tokens, None, 0, apply_admission_cap=True
        )
