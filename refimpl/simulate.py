"""Replay a trace on the KV cache vLLM would plan: the typed API behind `python -m refimpl
simulate`.

    from refimpl.models import EngineArgs, plan_model
    from refimpl.sched.traces import SLICE_PATH, read_trace
    from refimpl.simulate import simulate
    plan = plan_model(EngineArgs("config.json", tensor_parallel_size=4))
    sim = simulate(plan, read_trace(SLICE_PATH))
    sim.summary()["hit_rate"], sim.summary()["upper_bound_rate"]

The plan's `KVCacheConfig` and resolved scheduler settings build vLLM v1's scheduler
(`refimpl.sched`), the trace runs through it (`refimpl.sched.replay`), and the clock places
arrivals on steps: by default a roofline estimate for the plan's model on a GPU from
`refimpl.models.gpus` (the table `plan` uses), or arrival order with no model at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from refimpl.hybrid.kv_cache_interface import MambaSpec, unwrap_spec
from refimpl.models.gpus import DEFAULT_GPU, GPUInfo, find_gpu
from refimpl.models.planning import ModelKVCachePlan
from refimpl.models.weights import count_parameters
from refimpl.sched import SchedulerConfig, make_scheduler
from refimpl.sched.clock import ArrivalOrderClock, MeasuredStepTime, RooflineStepTime
from refimpl.sched.replay import ReplayResult, replay
from refimpl.sched.scheduler import Scheduler
from refimpl.sched.traces import TraceRequest, prefix_hit_upper_bound

CLOCKS = ("roofline", "arrivals")
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "float8_e4m3fn": 1}


def scheduler_config(
    plan: ModelKVCachePlan,
    *,
    policy: str = "fcfs",
    long_prefill_token_threshold: int = 0,
    prefix_cache_retention_interval: int | None = 0,
) -> SchedulerConfig:
    """The scheduler `vllm serve` would run for this plan (its resolved settings), plus the
    scheduling flags the plan does not need (policy, long-prefill threshold, retention)."""
    c, s = plan.config, plan.config.scheduler
    args = c.engine_args
    caching = args.enable_prefix_caching
    mamba = [
        spec
        for group in plan.kv.kv_cache_config.kv_cache_groups
        if isinstance(spec := unwrap_spec(group), MambaSpec)
    ]
    if mamba:
        # the plan resolved it (vLLM: on by default, off for an all-Mamba model) into the
        # Mamba cache mode: "align" exactly when prefix caching is on
        caching = mamba[0].mamba_cache_mode == "align"
    return SchedulerConfig(
        max_num_batched_tokens=s.max_num_batched_tokens,
        max_num_seqs=s.max_num_seqs,
        max_model_len=plan.max_model_len,
        enable_chunked_prefill=s.enable_chunked_prefill,
        long_prefill_token_threshold=long_prefill_token_threshold,
        policy=policy,
        async_scheduling=s.async_scheduling,
        enable_prefix_caching=caching is not False,
        prefix_cache_retention_interval=prefix_cache_retention_interval,
    )


def make_plan_scheduler(plan: ModelKVCachePlan, **scheduling) -> Scheduler:
    """A fresh scheduler on the plan's KV cache (`scheduling`: `scheduler_config`'s
    keywords)."""
    return make_scheduler(scheduler_config(plan, **scheduling), plan.kv.kv_cache_config)


def roofline_step_time(plan: ModelKVCachePlan, gpu: GPUInfo | str | None = None):
    """The step-time estimate for the plan's model on one GPU of its tensor-parallel group
    (`RooflineStepTime`; see `refimpl.sched.clock` for what it leaves out).

    FLOPs per token: twice the parameters a token passes through on one GPU (routed experts
    counted by the share a token uses); weights read per step: the plan's weights estimate;
    KV bytes per token of context: every group's page bytes per token (a sliding window is
    counted as if it kept everything, an upper bound)."""
    gpu = DEFAULT_GPU if gpu is None else find_gpu(gpu) if isinstance(gpu, str) else gpu
    if gpu.peak_flops is None or gpu.memory_bandwidth is None:
        raise ValueError(f"{gpu.name} has no FLOP/s or bandwidth in refimpl.models.gpus")
    cfg, model = plan.config.hf_config, plan.config.model
    tp = model.tensor_parallel_size
    count = count_parameters(cfg)
    experts = count.experts
    routed = (
        cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts")
    )
    per_token = cfg.get("num_experts_per_tok")
    if routed and per_token:
        experts = experts * per_token / routed
    params = count.attention + count.mlp + count.router + experts + count.embeddings / 2
    dtype_bytes = _DTYPE_BYTES.get(str(model.model_dtype), 2)
    weight_bytes = plan.config.budget.weights_bytes
    if weight_bytes is None:
        weight_bytes = count.total * dtype_bytes / tp
    kv_per_token = sum(
        row.page_size_bytes * row.num_layers / row.block_size for row in plan.groups
    )
    heads = cfg.get_int("num_attention_heads", 1)
    hidden = cfg.get_int("hidden_size", 0)
    head_dim = cfg.get("head_dim") or (hidden // heads if heads else 0)
    attention_layers = sum(row.num_layers for row in plan.groups if "Mamba" not in row.kind)
    return RooflineStepTime(
        flops_per_token=2 * params / tp,
        attention_flops_per_token_context=4 * attention_layers * heads / tp * head_dim,
        weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_per_token,
        peak_flops=gpu.peak_flops,
        memory_bandwidth=gpu.memory_bandwidth,
        gpu_name=gpu.name,
    )


def make_clock(plan: ModelKVCachePlan, clock, gpu: GPUInfo | str | None = None):
    """ "roofline" (the default estimate), "arrivals" (no model), a list of (tokens, seconds)
    measured points, or a clock object as it is."""
    if clock == "roofline":
        return roofline_step_time(plan, gpu)
    if clock == "arrivals":
        return ArrivalOrderClock()
    if isinstance(clock, (list, tuple)):
        return MeasuredStepTime(tuple(tuple(p) for p in clock))
    if isinstance(clock, str):
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    return clock


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class Simulation:
    """One replay: the plan it ran on, the per-request and per-step counts, and the trace's
    infinite-cache upper bound per request. `refused` names the trace's requests that never
    reached the scheduler (see `simulate`)."""

    plan: ModelKVCachePlan
    result: ReplayResult
    upper_bound: tuple[int, ...]
    timed: bool
    refused: tuple[str, ...] = ()

    def summary(self, points: int = 10) -> dict:
        """The figures `simulate` prints, as plain data (`points`: KV usage samples)."""
        r, st = self.result, self.result.steps
        prompt = r.prompt_tokens or 1
        reqs = r.requests
        per_request = [x.hit_tokens / x.input_length for x in reqs]
        waits = [x.waiting_steps for x in reqs]
        wait_s = [x.first_seconds - x.arrival_seconds for x in reqs]
        n = r.num_steps or 1
        total_time = (st.seconds[-1] + st.duration[-1]) if self.timed and st.seconds else 0.0
        busy = [k for k in st.num_reqs if k]
        sampled = [
            {
                "step": i,
                "seconds": round(st.seconds[i], 3),
                "kv_usage": round(st.kv_usage[i], 4),
            }
            for i in sorted(
                {min(n - 1, round(j * (n - 1) / max(1, points - 1))) for j in range(points)}
            )
        ]
        return {
            "num_requests": len(reqs),
            "refused_requests": len(self.refused),
            "prompt_tokens": r.prompt_tokens,
            "hit_tokens": r.hit_tokens,
            "hit_rate": r.hit_tokens / prompt,
            "mean_request_hit_rate": sum(per_request) / max(1, len(reqs)),
            "requests_with_hit": sum(1 for x in reqs if x.hit_tokens),
            "upper_bound_tokens": sum(self.upper_bound),
            "upper_bound_rate": sum(self.upper_bound) / prompt,
            "preemptions": r.num_preemptions,
            "preempted_requests": sum(1 for x in reqs if x.num_preemptions),
            "recomputed_tokens": r.recomputed_tokens,
            "waiting_steps_mean": sum(waits) / max(1, len(waits)),
            "waiting_steps_p90": _percentile(waits, 0.9),
            "waiting_steps_max": max(waits, default=0),
            "waiting_seconds_mean": sum(wait_s) / max(1, len(wait_s)) if self.timed else None,
            "waiting_seconds_p90": _percentile(wait_s, 0.9) if self.timed else None,
            "num_steps": r.num_steps,
            "kv_usage_mean": sum(st.kv_usage) / n,
            "kv_usage_max": max(st.kv_usage, default=0.0),
            "kv_usage": sampled,
            "batch_requests_mean": sum(busy) / max(1, len(busy)),
            "batch_requests_max": max(st.num_reqs, default=0),
            "batch_tokens_mean": sum(st.num_tokens) / n,
            "batch_tokens_max": max(st.num_tokens, default=0),
            "simulated_seconds": total_time if self.timed else None,
            "tokens_per_second": sum(st.num_tokens) / total_time
            if self.timed and total_time
            else None,
            "clock": r.clock_label,
            "num_blocks": r.num_blocks,
            "block_size": r.block_size,
        }


def simulate(
    plan: ModelKVCachePlan,
    trace: Sequence[TraceRequest],
    *,
    clock="roofline",
    gpu: GPUInfo | str | None = None,
    progress: Callable[[int], None] | None = None,
    **scheduling,
) -> Simulation:
    """Replay `trace` on a fresh scheduler for `plan` (see the module doc); `scheduling`
    takes `scheduler_config`'s keywords (policy, long-prefill threshold, retention).

    A request whose prompt has `max_model_len` tokens or more is refused, as vLLM's input
    processor refuses it (the server answers with an error; the scheduler never sees it):
    it is left out of the replay, the hit rate and the upper bound, and counted apart."""
    step_clock = make_clock(plan, clock, gpu)
    served = [r for r in trace if r.input_length < plan.max_model_len]
    refused = tuple(r.request_id for r in trace if r.input_length >= plan.max_model_len)
    if not served:
        raise ValueError(
            f"every request's prompt has max_model_len ({plan.max_model_len:,}) tokens or "
            "more, so vLLM would refuse them all: raise --max-model-len"
        )
    scheduler = make_plan_scheduler(plan, **scheduling)
    result = replay(served, scheduler, step_clock, progress=progress)
    return Simulation(
        plan,
        result,
        tuple(prefix_hit_upper_bound(served)),
        step_clock.is_timed,
        refused,
    )
