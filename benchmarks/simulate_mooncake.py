"""Time `simulate` on the whole Mooncake conversation trace for Llama-3.1-70B at TP 4.

    python benchmarks/simulate_mooncake.py PATH/TO/conversation_trace.jsonl [--clock roofline]

The trace is not shipped (3 MB): download FAST25-release/traces/conversation_trace.jsonl from
github.com/kvcache-ai/Mooncake. Prints the wall time of the replay (planning and reading the
trace are timed apart), the steps and the headline figures.

Measured on the 2-core machine the project builds on, idle, roofline clock, 113,747 steps
(the machine's speed moves by up to 10% from hour to hour, so figures from one run differ):
- commit ad63f08 (a Mooncake prompt's filler ids are shared small ints; two fewer prompt
  copies): replay 57.6 s CPU unpinned and 56.7 s pinned to one core (`taskset -c 1`) in
  one slow hour, 51.7 s in a faster one (`simulate_vs_vllm.py`); the whole
  `python -m refimpl simulate` command 58.9, 58.2, 55.0 and 58.4 s wall in four runs
  (60.4 s before), with 1.18 GB peak memory (3.9 GB before); installed from the wheel in a
  fresh venv and run as an unprivileged user, 64.7 s in one slow run and 52.0 s in the next;
- commit 3f8af13: 61.9 s and 64.0 s pinned; the same code before those speed-ups took
  73.7 s and 77 to 80 s on the same day; 129.9 s wall / 123.8 s CPU before the first
  speed-ups (commit 57675d1).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from refimpl.models import EngineArgs, plan_model
from refimpl.sched.traces import read_trace
from refimpl.simulate import simulate

CONFIG = Path(__file__).parent / "configs" / "llama-3.1-70b-instruct"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--clock", default="roofline", choices=("roofline", "arrivals"))
    parser.add_argument("--limit", type=int, default=None, help="first N requests only")
    args = parser.parse_args()
    t0 = time.perf_counter()
    plan = plan_model(EngineArgs(CONFIG, tensor_parallel_size=4))
    t1 = time.perf_counter()
    trace = read_trace(args.trace, limit=args.limit)
    t2, c2 = time.perf_counter(), time.process_time()

    def progress(done: int) -> None:
        # a line per 500 requests finished: CPU seconds so far (the machine may be shared)
        if done // 500 > progress.last:
            progress.last = done // 500
            print(
                f"  {done:,} finished, {time.process_time() - c2:.0f} s CPU", file=sys.stderr
            )

    progress.last = 0
    sim = simulate(plan, trace, clock=args.clock, progress=progress)
    t3, c3 = time.perf_counter(), time.process_time()
    s = sim.summary()
    print(
        f"plan {t1 - t0:.2f} s, read {len(trace):,} requests {t2 - t1:.2f} s, "
        f"replay {t3 - t2:.1f} s ({s['num_steps']:,} steps, "
        f"{1e3 * (t3 - t2) / max(1, s['num_steps']):.2f} ms/step), {c3 - c2:.1f} s CPU"
    )
    for key in (
        "hit_rate",
        "upper_bound_rate",
        "preemptions",
        "recomputed_tokens",
        "waiting_seconds_mean",
        "kv_usage_mean",
        "batch_requests_mean",
        "simulated_seconds",
    ):
        print(f"  {key}: {s[key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
