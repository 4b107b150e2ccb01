"""How long a scheduling step takes: what places a trace's millisecond arrivals on steps.

The scheduler's decisions are exact given which requests have arrived before each step; the
clock only decides that. Three clocks:

- `ArrivalOrderClock`: no time at all. Each distinct arrival time of the trace opens the next
  step ("as fast as arrivals allow": the requests come back to back, in their order). Needs
  no model and no GPU; waiting is counted in steps only.
- `RooflineStepTime`: an ESTIMATE. A step costs the larger of its compute time (FLOPs over
  the GPU's peak) and its memory time (bytes read over the GPU's bandwidth): the weights once
  per step plus the KV cache each scheduled request attends over. Kernel launches, the
  sampler, communication between tensor-parallel GPUs and the CPU's own time are left out,
  so real steps are slower; use it to compare settings, not to promise latencies.
- `MeasuredStepTime`: step times you measured on your deployment, as (batched tokens,
  seconds) points; a step's time is interpolated linearly in its scheduled tokens.

A clock's `step_seconds(scheduled)` gets, per scheduled request, (new tokens this step,
tokens its attention reads: its computed tokens plus the new ones).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass


class ArrivalOrderClock:
    """No step-time model: arrivals are placed by order only (see the module doc)."""

    is_timed = False
    label = "arrival order (no step-time model)"

    def step_seconds(
        self,
        scheduled: Sequence[tuple[int, int]],  # noqa: ARG002 (every clock's signature)
    ) -> float:
        return 0.0


@dataclass(frozen=True)
class RooflineStepTime:
    """max(FLOPs / peak_flops, bytes / memory_bandwidth) per step, per GPU (an estimate).

    - `flops_per_token`: 2 x the parameters one token passes through (on one GPU).
    - `attention_flops_per_token_context`: FLOPs one token spends per token it attends to
      (4 x attention layers x query heads x head size on one GPU: QK^T and PV).
    - `weight_bytes`: the weights one GPU reads every step.
    - `kv_bytes_per_token`: KV cache bytes one GPU reads per token of context.
    """

    flops_per_token: float
    attention_flops_per_token_context: float
    weight_bytes: float
    kv_bytes_per_token: float
    peak_flops: float
    memory_bandwidth: float
    gpu_name: str = ""

    is_timed = True

    @property
    def label(self) -> str:
        return f"roofline estimate on {self.gpu_name or 'the given GPU'}"

    def __post_init__(self) -> None:
        for name in ("peak_flops", "memory_bandwidth"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise ValueError(f"{name} must be a positive number, got {v!r}")

    def step_seconds(self, scheduled: Sequence[tuple[int, int]]) -> float:
        num_tokens = context = attended = 0  # one pass: a step schedules many requests
        for new, ctx in scheduled:
            num_tokens += new
            context += ctx
            attended += new * ctx
        # every new token attends over at most its request's whole context
        flops = num_tokens * self.flops_per_token
        flops += self.attention_flops_per_token_context * attended
        memory = self.weight_bytes + self.kv_bytes_per_token * context
        return max(flops / self.peak_flops, memory / self.memory_bandwidth)


@dataclass(frozen=True)
class MeasuredStepTime:
    """Measured step times: `points` are (scheduled tokens, seconds), interpolated linearly
    and held flat past the ends."""

    points: tuple[tuple[int, float], ...]

    is_timed = True
    label = "measured step times"

    def __post_init__(self) -> None:
        pts = tuple(sorted((int(t), float(s)) for t, s in self.points))
        if not pts or any(t < 0 or s <= 0 for t, s in pts):
            raise ValueError(
                "measured step times need at least one (tokens >= 0, seconds > 0) point"
            )
        if len({t for t, _ in pts}) != len(pts):
            raise ValueError("measured step times give one time per token count")
        object.__setattr__(self, "points", pts)

    def step_seconds(self, scheduled: Sequence[tuple[int, int]]) -> float:
        num_tokens = sum(new for new, _ in scheduled)
        xs = [t for t, _ in self.points]
        i = bisect.bisect_left(xs, num_tokens)
        if i == 0:
            return self.points[0][1]
        if i == len(xs):
            return self.points[-1][1]
        (x0, y0), (x1, y1) = self.points[i - 1], self.points[i]
        return y0 + (y1 - y0) * (num_tokens - x0) / (x1 - x0)
