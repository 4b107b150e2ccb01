"""Scheduler: which requests compute how many tokens this step, on Part II's `KVCacheManager`.

Part I's pattern (`add`, `schedule`, `postprocess`, `preempt`, `is_finished`) with vLLM v1's
policy, since the hybrid cache is vLLM's: each step hands a token budget first to running
requests (a decode token or the next prefill chunk), then to waiting ones after a prefix-cache
lookup (`get_computed_blocks`); every request gets its blocks from `allocate_slots`. When the
pool runs dry the last running request is preempted (its blocks freed, recomputed later). The
scheduler talks to the cache only through `KVCacheManager`'s public methods, and holds its
callers to Part I's contract (`refimpl.validation.StepContract`): a request is added once and
only if it can ever fit the pool, and each step's chunks are postprocessed once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from refimpl.hybrid.kv_cache_manager import KVCacheManager
from refimpl.hybrid.request import Request, RequestStatus
from refimpl.paged.sequence import SamplingParams, checked_token_ids
from refimpl.validation import StepContract, check_instance


@dataclass
class V4Request:
    """A request plus what the engine needs besides the allocator's view of it."""

    request: Request
    sampling_params: SamplingParams
    # behind each sampled token, only when recorded
    logits: list[torch.Tensor] = field(default_factory=list)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_completion_tokens(self) -> int:
        return len(self.request.output_token_ids)


@dataclass
class ScheduledChunk:
    """One request's share of a step: `num_tokens` tokens from position `first_position` on."""

    req: V4Request
    num_tokens: int
    # tokens of the request already in the cache (computed or a prefix hit)
    first_position: int
    # the request's block table per cache group after allocation
    block_ids: tuple[list[int], ...]
    num_cached_tokens: int = 0  # prefix-cache hit adopted when this chunk admitted the request

    @property
    def samples(self) -> bool:
        """Whether the chunk reaches the request's last token, so the step samples its next
        one."""
        return self.first_position + self.num_tokens == self.req.request.num_tokens


class Scheduler:
    """vLLM v1's scheduling over the hybrid `KVCacheManager`, with Part I's method names."""

    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        eos: int = -1,
    ) -> None:
        self.kv_cache_manager = kv_cache_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.eos = eos
        self.waiting: deque[V4Request] = deque()
        self.running: list[V4Request] = []
        self.num_preemptions = 0
        self._contract = StepContract("request")

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def add(self, req: V4Request) -> None:
        """Queue a new request; refuse one already queued, one that ran before, and one
        that could never fit the pool."""
        self.check_request(req)
        self._contract.added(req.request_id, req)
        self.waiting.append(req)

    def check_request(self, req: V4Request) -> None:
        """What `add` checks, without queueing (an engine checks a whole batch first)."""
        check_instance("req", req, V4Request)
        r = req.request
        if r.status != RequestStatus.WAITING or r.num_computed_tokens or r.output_token_ids:
            raise ValueError(
                f"request {req.request_id} is {r.status.name} with "
                f"{r.num_computed_tokens} computed tokens and cannot be added again"
            )
        longest = r.num_prompt_tokens + req.sampling_params.max_tokens
        self._contract.check_add(
            req.request_id,
            (self.waiting, self.running),
            self.max_blocks_needed(longest),
            self.kv_cache_manager.num_gpu_blocks - 1,  # block 0 is the null block
            f"up to {longest} tokens: {r.num_prompt_tokens} prompt tokens + "
            f"max_tokens={req.sampling_params.max_tokens}",
        )

    def max_blocks_needed(self, num_tokens: int) -> int:
        """Blocks a request of `num_tokens` tokens holds at most at once (windows freeing as it
        goes)."""
        return self.kv_cache_manager.get_max_num_blocks(num_tokens)

    def preempt(self, req: V4Request) -> None:
        """Free all of a running request's blocks and put it first in line; it is recomputed
        later."""
        self.running.remove(req)
        self.kv_cache_manager.free(req.request)
        req.request.num_computed_tokens = 0
        req.request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(req)
        self.num_preemptions += 1

    def _chunk(
        self, req: V4Request, num_tokens: int, num_cached_tokens: int = 0
    ) -> ScheduledChunk:
        block_ids = tuple(list(t) for t in self.kv_cache_manager.get_block_ids(req.request_id))
        return ScheduledChunk(
            req, num_tokens, req.request.num_computed_tokens, block_ids, num_cached_tokens
        )

    def schedule(self) -> list[ScheduledChunk]:
        """Pick this step's chunks: running requests first, then waiting ones while budget
        lasts."""
        manager = self.kv_cache_manager
        budget = self.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted = False
        for req in list(self.running):
            if budget == 0 or req not in self.running:
                continue
            r = req.request
            n = min(r.num_tokens - r.num_computed_tokens, budget)
            while manager.allocate_slots(r, n) is None:
                victim = self.running[-1]
                self.preempt(victim)
                preempted = True
                if victim is req:
                    n = 0
                    break
            if n:
                chunks.append(self._chunk(req, n))
                budget -= n
        while (
            self.waiting
            and budget > 0
            and not preempted
            and len(self.running) < self.max_num_seqs
        ):
            req = self.waiting[0]
            r = req.request
            hits, num_hit = manager.get_computed_blocks(r)
            n = min(r.num_tokens - num_hit, budget)
            if (
                manager.allocate_slots(
                    r,
                    n,
                    num_new_computed_tokens=num_hit,
                    new_computed_blocks=hits if num_hit else None,
                    has_scheduled_reqs=bool(chunks),
                )
                is None
            ):
                break
            self.waiting.popleft()
            r.num_computed_tokens = num_hit
            r.status = RequestStatus.RUNNING
            self.running.append(req)
            chunks.append(self._chunk(req, n, num_hit))
            budget -= n
        self._contract.hand_out(chunks)
        return chunks

    def postprocess(
        self, chunks: list[ScheduledChunk], token_ids: list[int]
    ) -> list[V4Request]:
        """Record a step: tokens computed, one sampled token per chunk that `samples` (in
        order); finish requests at max_tokens or EOS and free their blocks. Returns the
        finished ones.

        Only the chunks of the latest `schedule()`, once, with one valid token per chunk that
        samples: anything else is refused before a request changes.
        """
        if not self._contract.is_latest(chunks):
            raise ValueError(
                "chunks are not the step awaiting postprocess(): pass the chunks of the "
                "latest schedule(), once"
            )
        token_ids, _ = checked_token_ids(token_ids, "token_ids")
        num_sampling = sum(c.samples for c in chunks)
        if len(token_ids) != num_sampling:
            raise ValueError(
                f"got {len(token_ids)} sampled tokens for {num_sampling} chunks that sample"
            )
        self._contract.take()
        sampled = iter(token_ids)
        finished = []
        for c in chunks:
            r = c.req.request
            samples = c.samples
            r.num_computed_tokens += c.num_tokens
            if not samples:
                continue  # a prefill chunk that has not reached the end yet
            token = next(sampled)
            r.append_output_token_ids([token])
            params = c.req.sampling_params
            if c.req.num_completion_tokens >= params.max_tokens or (
                not params.ignore_eos and token == self.eos
            ):
                self.running.remove(c.req)
                self.kv_cache_manager.free(r)
                r.status = RequestStatus.FINISHED
                self._contract.finished(r.request_id)
                finished.append(c.req)
        return finished
