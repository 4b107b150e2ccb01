"""Replay a trace through vLLM v1's scheduler, step by step, and count what the traffic got.

The loop is vLLM's engine core with a made-up model runner: requests that have arrived by
the step's start are added, `schedule()` runs, every request whose scheduled chunk reaches
the end of its tokens samples one token (never EOS: a request stops at its trace's
`output_length`), and `update_from_output` takes the step back. Under async scheduling the
output of a step comes back after the next step is scheduled, as the engine core's batch
queue of two does. Which request arrives before which step comes from a clock
(`refimpl.sched.clock`); everything else is the scheduler's own decision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from refimpl.sched.output import ModelRunnerOutput
from refimpl.sched.request import RequestStatus
from refimpl.sched.scheduler import Scheduler
from refimpl.sched.traces import TraceRequest

#: The token every made-up step samples (any id: prompts and outputs are never compared).
SAMPLED_TOKEN = 1


@dataclass
class RequestStats:
    """What one request got."""

    request_id: str
    arrival_step: int
    input_length: int
    first_step: int = -1  # the step it was first scheduled in
    finish_step: int = -1
    hit_tokens: int = 0  # prompt tokens the prefix cache served when it was first scheduled
    num_preemptions: int = 0
    recomputed_tokens: int = 0  # computed tokens lost to preemption and computed again
    arrival_seconds: float = 0.0
    first_seconds: float = 0.0

    @property
    def waiting_steps(self) -> int:
        return self.first_step - self.arrival_step


@dataclass
class StepStats:
    """One value per step, in step order."""

    seconds: list[float] = field(default_factory=list)  # clock time at the step's start
    num_reqs: list[int] = field(default_factory=list)  # requests scheduled
    num_tokens: list[int] = field(default_factory=list)  # tokens scheduled
    num_waiting: list[int] = field(default_factory=list)  # after scheduling
    kv_usage: list[float] = field(default_factory=list)  # after scheduling, 0..1
    num_preempted: list[int] = field(default_factory=list)
    duration: list[float] = field(default_factory=list)  # the clock's step time


@dataclass
class ReplayResult:
    requests: list[RequestStats]
    steps: StepStats
    clock_label: str
    num_blocks: int
    block_size: int

    @property
    def num_steps(self) -> int:
        return len(self.steps.num_tokens)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.input_length for r in self.requests)

    @property
    def hit_tokens(self) -> int:
        return sum(r.hit_tokens for r in self.requests)

    @property
    def num_preemptions(self) -> int:
        return sum(r.num_preemptions for r in self.requests)

    @property
    def recomputed_tokens(self) -> int:
        return sum(r.recomputed_tokens for r in self.requests)


def _arrival_steps(trace: Sequence[TraceRequest], timed: bool) -> list[float]:
    """The key each request is released by: its time in seconds (a timed clock) or the rank
    of its arrival time among the trace's distinct times (arrival order)."""
    if timed:
        return [r.arrival_ms / 1000 for r in trace]
    ranks, last, rank = [], None, -1
    for r in trace:
        if r.arrival_ms != last:
            rank, last = rank + 1, r.arrival_ms
        ranks.append(float(rank))
    return ranks


def replay(
    trace: Sequence[TraceRequest],
    scheduler: Scheduler,
    clock,
    *,
    max_steps: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Run every request of `trace` to its end on `scheduler` (a fresh one) and return the
    per-request and per-step counts. `progress(n)` is called with the number of requests
    finished so far, now and then."""
    if scheduler.has_requests() or scheduler.current_step:
        raise ValueError("replay needs a fresh scheduler (this one has already run)")
    for r in trace:
        if r.input_length >= scheduler.max_model_len:
            raise ValueError(
                f"request {r.request_id} has {r.input_length} prompt tokens; max_model_len "
                f"is {scheduler.max_model_len}: raise --max-model-len or drop the request"
            )
    timed = clock.is_timed
    release = _arrival_steps(trace, timed)
    stats = {r.request_id: RequestStats(r.request_id, -1, r.input_length) for r in trace}
    steps = StepStats()
    depth = scheduler.scheduler_config.max_concurrent_batches
    pending: list = []
    computed: dict[str, int] = {}  # request id -> computed tokens after the last update
    now = 0.0  # seconds (timed) or arrival rank (arrival order)
    nxt = 0
    step = 0
    finished = 0
    while nxt < len(trace) or scheduler.has_requests() or pending:
        if not timed:
            if nxt < len(trace):
                now = release[nxt]
        elif not scheduler.has_requests() and not pending and nxt < len(trace):
            now = max(now, release[nxt])  # idle: jump to the next arrival
        while nxt < len(trace) and release[nxt] <= now:
            r = trace[nxt]
            req = scheduler.make_request(
                r.request_id,
                r.prompt_token_ids,
                max_tokens=r.output_length,
                arrival_time=r.arrival_ms / 1000,
            )
            scheduler.add_request(req)
            s = stats[r.request_id]
            s.arrival_step, s.arrival_seconds = step, now if timed else 0.0
            nxt += 1
        out = scheduler.schedule()
        for new in out.scheduled_new_reqs:
            s = stats[new.req_id]
            if s.first_step < 0:
                s.first_step, s.first_seconds = step, now if timed else 0.0
                s.hit_tokens = new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        resumed = cached.resumed_req_ids  # empty on most steps: then nothing to count
        if resumed:
            for rid, nc in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
                if rid in resumed:
                    lost = computed.get(rid, 0) - nc
                    stats[rid].recomputed_tokens += max(0, lost)
        for rid in out.preempted_req_ids:
            stats[rid].num_preemptions += 1
        reqs = scheduler.requests
        # per scheduled request (one pass): (new tokens, computed tokens) for the clock, and
        # what it samples: one token if its chunk reaches the end of its tokens, else none
        ids, scheduled, sampled = [], [], []
        for rid, n in out.num_scheduled_tokens.items():
            req = reqs[rid]
            ids.append(rid)
            scheduled.append((n, req.num_computed_tokens))
            sampled.append([] if req.is_prefill_chunk else [SAMPLED_TOKEN])
        dt = clock.step_seconds(scheduled)
        steps.seconds.append(now if timed else 0.0)
        steps.num_reqs.append(len(scheduled))
        steps.num_tokens.append(out.total_num_scheduled_tokens)
        steps.num_waiting.append(len(scheduler.waiting))
        steps.kv_usage.append(scheduler.get_kv_cache_usage())
        steps.num_preempted.append(len(out.preempted_req_ids))
        steps.duration.append(dt)
        if out.total_num_scheduled_tokens:
            runner_output = ModelRunnerOutput(ids, dict(zip(ids, range(len(ids)))), sampled)
            pending.append((out, runner_output))
        if pending and (len(pending) >= depth or not out.total_num_scheduled_tokens):
            o, runner_output = pending.pop(0)
            ids = runner_output.req_ids
            outputs = scheduler.update_from_output(o, runner_output)
            for eco in outputs:
                if eco.finish_reason is not None:
                    stats[eco.request_id].finish_step = step
                    computed.pop(eco.request_id, None)
                    finished += 1
            running = RequestStatus.RUNNING
            for rid in ids:
                req = reqs.get(rid)
                # a request preempted since this step was scheduled keeps its count from
                # before the preemption (its own is back at 0)
                if req is not None and req.status == running:
                    computed[rid] = req.num_computed_tokens
        if timed:
            now += dt
        step += 1
        if progress is not None and step % 256 == 0:
            progress(finished)
        if max_steps is not None and step >= max_steps:
            raise RuntimeError(f"the trace did not finish in {max_steps} steps")
    if progress is not None:
        progress(finished)
    return ReplayResult(
        list(stats.values()),
        steps,
        clock.label,
        scheduler.kv_cache_manager.num_gpu_blocks,
        scheduler.block_size,
    )
