"""vLLM v1's `AsyncScheduler`: step N+1 is scheduled while step N runs.

A decode step's sampled token is not known when the next step is scheduled, so the scheduler
counts it as an output placeholder: `num_computed_tokens` already includes it, the next step
schedules the token after it, and when the output arrives the placeholder is replaced by the
real token and the blocks it completed are cached (`KVCacheManager.cache_blocks`).
"""

from __future__ import annotations

from refimpl.sched.output import SchedulerOutput
from refimpl.sched.request import Request, RequestStatus
from refimpl.sched.scheduler import Scheduler


class AsyncScheduler(Scheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._spec_token_placeholders: list[int] = [-1] * self.num_spec_tokens

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        super()._update_after_schedule(scheduler_output)
        spec_decode_tokens = scheduler_output.scheduled_spec_decode_tokens
        self._spec_token_placeholders = [-1] * scheduler_output.num_spec_tokens_to_schedule
        for rid in scheduler_output.num_scheduled_tokens:
            request = self.requests[rid]
            if request.is_prefill_chunk:
                continue
            # this step samples one token plus its accepted drafts: not known yet
            request.num_output_placeholders += self.num_sampled_tokens_per_step
            if spec_decode_tokens:
                request.num_output_placeholders += len(spec_decode_tokens.get(rid, ()))
            # the drafter's next proposals, filled in on the worker
            request.spec_token_ids = self._spec_token_placeholders

    def _update_request_with_output(
        self, request: Request, new_token_ids: list[int], is_stale: bool = False
    ) -> tuple[list[int], bool]:
        status_before = request.status
        # the base class named, not super(): Python 3.11 builds a super object per call, and
        # this runs for every request in every step
        new_token_ids, stopped = Scheduler._update_request_with_output(
            self, request, new_token_ids
        )
        if not is_stale:
            # placeholders were zeroed at preemption; stale output must not go below zero
            request.num_output_placeholders -= len(new_token_ids)
        if status_before == RequestStatus.RUNNING:
            self.kv_cache_manager.cache_blocks(
                request, request.num_computed_tokens - request.num_output_placeholders
            )
        return new_token_ids, stopped
