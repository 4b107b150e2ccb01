"""refimpl's scheduler against vLLM 0.32's own `Scheduler`, driven the same way on Mooncake
requests: the speed ratio, and whether every step's output is equal.

    PYTHONPATH=$PWD .venv-vllm/bin/python benchmarks/simulate_vs_vllm.py TRACE [--requests N]

Both sides are the crosscheck's (`tools.crosscheck.scheduler`): the same shared driver, the
same made-up model runner (about one token in 12 is EOS, so requests end early), one
cache group of 16-token blocks on tiny-llama's config (so the
prompts are the trace's requests under 3,500 tokens, placed one arrival time per step). The
time is each side's whole replay, request building and hashing included.
"""

from __future__ import annotations

import argparse
import sys
import time

from refimpl.sched.traces import read_trace
from tools.crosscheck.sched_streams import RefimplSide, Setting, digest, drive
from tools.crosscheck.scheduler import VllmSide


def stream_from_trace(trace, limit: int) -> list[list[dict]]:
    steps: list[list[dict]] = []
    last = None
    for r in [r for r in trace if r.input_length < 3500][:limit]:
        if r.arrival_ms != last:
            steps.append([])
            last = r.arrival_ms
        steps[-1].append(
            {
                "id": r.request_id,
                "prompt": r.prompt_token_ids,
                "max_tokens": r.output_length,
                "priority": 0,
            }
        )
    return steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--blocks", type=int, default=2000)
    args = parser.parse_args()
    stream = stream_from_trace(read_trace(args.trace), args.requests)
    setting = Setting(
        name="mooncake",
        groups=(("full", 16),),
        num_blocks=args.blocks,
        max_model_len=4096,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        retention=0,
    )
    logs, times = {}, {}
    for name, side_cls in (("refimpl", RefimplSide), ("vllm", VllmSide)):
        side = side_cls(setting)
        t0 = time.process_time()
        logs[name] = drive(side, stream, asynchronous=False, max_steps=10**7)
        times[name] = time.process_time() - t0
    n = sum(len(s) for s in stream)
    ratio = times["vllm"] / times["refimpl"]
    print(
        f"{n} requests, {len(logs['refimpl'])} steps: refimpl {times['refimpl']:.1f} s CPU, "
        f"vLLM {times['vllm']:.1f} s CPU, ratio vLLM / refimpl {ratio:.2f}"
    )
    equal = digest(logs["refimpl"]) == digest(logs["vllm"])
    print("every step equal:", equal)
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
