"""refimpl's scheduler against vLLM 0.32's own `Scheduler` on the Mooncake conversation trace,
replayed for Llama-3.1-70B at TP 4 as `simulate` replays it: the speed ratio, and whether every
step's output is equal.

    PYTHONPATH=$PWD nice -n 10 .venv-vllm/bin/python benchmarks/simulate_vs_vllm.py \\
        PATH/TO/conversation_trace.jsonl [--requests N] [--clock roofline|arrivals] [--check]

What is compared:
- The cache: refimpl's plan for benchmarks/configs/llama-3.1-70b-instruct at TP 4 (one
  full-attention group of 16-token blocks, the plan's number of blocks) and its resolved
  scheduler settings (`refimpl.simulate.scheduler_config`: 8,192 batched tokens, 1,024
  sequences, max_model_len 131,072, chunked prefill, async scheduling, prefix caching at
  retention 0, full-sequence admission). vLLM's side is the crosscheck's `VllmSide`
  (`tools.crosscheck.scheduler`): `EngineArgs(load_format="dummy")` on the same config.json,
  vLLM's planner on one full-attention spec of the plan's block size with
  `num_gpu_blocks_override` set to the plan's blocks (the 70B's own layers are not built: on
  vLLM's CPU platform they would ask for 128-token blocks; the scheduler reads only the block
  size and count, which are asserted equal), vLLM's `AsyncScheduler`, requests hashed with
  vLLM's default sha256.
- The driving: `drive` below is `refimpl.sched.replay`'s loop without its statistics, run
  for each side alike: arrivals whose time has come are added before each step, the clock
  (refimpl's roofline estimate for the plan, or arrival order) advances by the step's
  estimate from that side's own output, every request whose chunk reaches its end samples
  token 1 (never EOS: requests stop at the trace's output length), and each step's output
  is handed back after the next step is scheduled (async scheduling's batch queue of two).
- The time: CPU seconds of each side's whole `drive`, request building and hashing included
  (the trace's token ids are built alike on both sides), one run each, refimpl first.
- Equality: with `--check`, a second, untimed run of each side digests every step's
  `SchedulerOutput` (requests, tokens, computed tokens, new block ids per group, resumed,
  preempted and finished ids) and the two digest lists must be equal step for step.

Measured (one run, the 2-core machine the project builds on, idle; `--check`, roofline
clock, the whole trace: 12,031 requests, 113,747 steps): at commit 22764c5 refimpl 71.7 s
CPU, vLLM 129.9 s CPU (ratio 1.81); after the per-request-step speed-ups (the commit after
3f8af13) refimpl 64.9 s CPU (65.0 s wall), vLLM 143.0 s CPU (143.1 s wall): vLLM / refimpl
= 2.20, and every step equal; at commit ad63f08 (new made-up prompt ids, the same block
structure) refimpl 51.7 s CPU, vLLM 130.9 s CPU: vLLM / refimpl = 2.53, every step equal.
Where refimpl's time goes: about 40% is work per block or
per prompt token (building and hashing the prompts; evicting, registering, freeing and
looking up about 10 million 16-token blocks), the rest the scheduler's bookkeeping on ~4
million request-steps.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path

from refimpl.models import EngineArgs, plan_model
from refimpl.sched.traces import read_trace
from refimpl.simulate import make_clock, make_plan_scheduler, scheduler_config
from tools.crosscheck import scheduler as crosscheck
from tools.crosscheck.sched_streams import RefimplSide, Setting, normalize_output
from tools.crosscheck.scheduler import VllmSide

CONFIG = Path(__file__).resolve().parent / "configs" / "llama-3.1-70b-instruct"


def setting_for(plan) -> Setting:
    """The crosscheck setting with the plan's cache (one full-attention group: its block size,
    its number of blocks) and resolved scheduler settings."""
    sc = scheduler_config(plan)
    (group,) = plan.kv.kv_cache_config.kv_cache_groups
    if not sc.scheduler_reserve_full_isl or sc.long_prefill_token_threshold:
        raise AssertionError("the crosscheck's Setting assumes vLLM's defaults here")
    return Setting(
        name="mooncake-llama-3.1-70b-tp4",
        num_blocks=plan.kv.kv_cache_config.num_blocks,
        max_model_len=sc.max_model_len,
        max_num_seqs=sc.max_num_seqs,
        max_num_batched_tokens=sc.max_num_batched_tokens,
        enable_chunked_prefill=sc.enable_chunked_prefill,
        policy=sc.policy,
        async_scheduling=sc.async_scheduling,
        retention=sc.prefix_cache_retention_interval,
        groups=(("full", group.kv_cache_spec.block_size),),
    )


class PlanSide(RefimplSide):
    """refimpl's side as `simulate` builds it: the plan's scheduler (`make_plan_scheduler`),
    driven through the crosscheck's `RefimplSide` methods."""

    def __init__(self, plan) -> None:
        self.s = make_plan_scheduler(plan)


def drive(side, trace, clock, depth: int, check: bool) -> tuple[int, list[str]]:
    """`refimpl.sched.replay`'s loop for one side; returns (steps, per-step digests)."""
    timed = clock.is_timed
    if timed:
        release = [r.arrival_ms / 1000 for r in trace]
    else:  # the rank of each distinct arrival time, as replay's arrival order
        release, last, rank = [], None, -1
        for r in trace:
            if r.arrival_ms != last:
                rank, last = rank + 1, r.arrival_ms
            release.append(float(rank))
    requests = side.s.requests
    pending: list = []
    digests: list[str] = []
    now, nxt, step = 0.0, 0, 0
    while nxt < len(trace) or side.has_requests() or pending:
        if not timed:
            if nxt < len(trace):
                now = release[nxt]
        elif not side.has_requests() and not pending and nxt < len(trace):
            now = max(now, release[nxt])
        while nxt < len(trace) and release[nxt] <= now:
            r = trace[nxt]
            arrival = {
                "id": r.request_id,
                "prompt": r.prompt_token_ids,
                "max_tokens": r.output_length,
                "priority": 0,
            }
            side.add(arrival, step)
            nxt += 1
        out = side.schedule()
        scheduled = [
            (n, requests[rid].num_computed_tokens)
            for rid, n in out.num_scheduled_tokens.items()
        ]
        dt = clock.step_seconds(scheduled)
        if check:
            record = json.dumps(normalize_output(out), sort_keys=True).encode()
            digests.append(hashlib.sha256(record).hexdigest()[:16])
        if out.total_num_scheduled_tokens:
            pending.append(
                (out, {rid for rid in out.num_scheduled_tokens if side.samples(rid)})
            )
        if pending and (len(pending) >= depth or not out.total_num_scheduled_tokens):
            o, samplers = pending.pop(0)
            side.update(
                o, {rid: [1] if rid in samplers else [] for rid in o.num_scheduled_tokens}
            )
        if timed:
            now += dt
        step += 1
    return step, digests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--requests", type=int, default=None, help="first N requests only")
    parser.add_argument("--clock", default="roofline", choices=("roofline", "arrivals"))
    parser.add_argument("--check", action="store_true", help="also compare every step")
    args = parser.parse_args()
    logging.getLogger("vllm").setLevel(logging.ERROR)
    plan = plan_model(EngineArgs(CONFIG, tensor_parallel_size=4))
    trace = read_trace(args.trace, limit=args.requests)
    clock = make_clock(plan, args.clock)
    setting = setting_for(plan)
    # the crosscheck reads its config.json from CONFIG_DIR when a setting names no model (it
    # then takes the specs from the setting's groups): the 70B's config.json, not tiny-llama's
    crosscheck.CONFIG_DIR = CONFIG
    depth = 2 if setting.async_scheduling else 1
    sides = (("refimpl", lambda: PlanSide(plan)), ("vllm", lambda: VllmSide(setting)))
    built = {name: make() for name, make in sides}  # vLLM's config parse, untimed
    theirs = built["vllm"]
    block_size = setting.groups[0][1]
    if theirs.num_blocks != setting.num_blocks or theirs.s.block_size != block_size:
        raise AssertionError(
            f"vLLM planned {theirs.num_blocks} blocks of {theirs.s.block_size} tokens, the "
            f"plan {setting.num_blocks} of {block_size}"
        )
    times, steps = {}, {}
    for name, _ in sides:
        side = built.pop(name)
        gc.collect()
        t0, w0 = time.process_time(), time.perf_counter()
        steps[name], _ = drive(side, trace, clock, depth, check=False)
        times[name] = (time.process_time() - t0, time.perf_counter() - w0)
        del side
        print(
            f"{name}: {steps[name]:,} steps, {times[name][0]:.1f} s CPU, "
            f"{times[name][1]:.1f} s wall",
            flush=True,
        )
    print(
        f"{len(trace):,} requests, clock {args.clock}: vLLM / refimpl = "
        f"{times['vllm'][0] / times['refimpl'][0]:.2f} (CPU), "
        f"{times['vllm'][1] / times['refimpl'][1]:.2f} (wall)"
    )
    if not args.check:
        return 0 if steps["vllm"] == steps["refimpl"] else 1
    digests = {}
    for name, make in sides:
        gc.collect()
        _, digests[name] = drive(make(), trace, clock, depth, check=True)
    a, b = digests["vllm"], digests["refimpl"]
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None and len(a) == len(b):
        print(f"every step equal ({len(a):,} steps)")
        return 0
    print(f"steps differ from step {first} ({len(a):,} vLLM steps, {len(b):,} refimpl steps)")
    return 1


if __name__ == "__main__":
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    sys.exit(main())
