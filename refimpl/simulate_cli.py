"""`python -m refimpl simulate`: what your traffic gets from vLLM's scheduler and KV cache.

    python -m refimpl simulate --config config.json -tp 4 --trace conversation_trace.jsonl
    python -m refimpl simulate --config config.json --trace my.jsonl --clock arrivals --json
    python -m refimpl simulate --config config.json --trace slice \\
        --sweep kv-cache-memory-bytes=10G,20G,40G --plot sweep.png

The model and serve flags are `plan`'s own (the same parser: `python -m refimpl plan --help`
lists them); the plan they give is replayed with the trace through vLLM v1's scheduler
(`refimpl.simulate`). `--trace slice` is the slice of Mooncake's conversation trace that ships
with refimpl. The command only parses and prints; everything is computed before the first
line is printed, so an error leaves no half-written output.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

from refimpl import plan_cli
from refimpl.cli import DefaultsHelpFormatter, OneLineErrorParser

WIDTH = plan_cli.WIDTH
_SPARK = " ▁▂▃▄▅▆▇█"


def _retention(text: str) -> int | None:
    if text.lower() in ("none", "dense"):
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"a retention interval is a token count >= 0 or 'none', got {text!r}"
        )
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    # plan's parser, built apart, lends simulate every model and serve flag it has
    plan_parser = plan_cli.add_parser(OneLineErrorParser(prog="plan").add_subparsers())
    parser = subparsers.add_parser(
        "simulate",
        help="replay a request trace through vLLM's scheduler on the plan's KV cache",
        description=(
            "Replay a trace (Mooncake's JSONL or refimpl's) through vLLM v1's scheduler on "
            "the KV cache vLLM 0.32 plans for these serve flags, and print prefix-cache hits "
            "next to the trace's upper bound, preemptions, waiting, KV cache usage and "
            "batches. Model and serve flags are plan's (see plan --help)."
        ),
        usage="%(prog)s --config CONFIG --trace TRACE [vllm serve flags] [options]",
        formatter_class=DefaultsHelpFormatter,
        parents=[plan_parser],
        add_help=False,
        conflict_handler="resolve",
    )
    parser.refuse_unknown_options = True
    sim = parser.add_argument_group("the trace and the clock")
    sim.add_argument(
        "--trace",
        required=True,
        help="a Mooncake trace (timestamp, input_length, output_length, hash_ids), a refimpl "
        "JSONL trace, or 'slice' for the shipped Mooncake conversation slice",
    )
    sim.add_argument("--limit", type=_non_negative, metavar="N", help="first N requests only")
    sim.add_argument(
        "--clock",
        choices=("roofline", "arrivals"),
        default="roofline",
        help="roofline: an estimated step time on --gpu-name; arrivals: one arrival time per "
        "step, no time model",
    )
    sim.add_argument(
        "--step-times",
        metavar="FILE",
        help="measured step times, a JSON list of [batched tokens, seconds] (replaces the "
        "roofline estimate)",
    )
    sim.add_argument(
        "--scheduling-policy",
        choices=("fcfs", "priority"),
        default="fcfs",
        help="vllm serve's scheduling policy",
    )
    sim.add_argument(
        "--long-prefill-token-threshold",
        type=_non_negative,
        default=0,
        metavar="N",
        help="the most tokens one prefill gets per step while others wait (0: no limit)",
    )
    sim.add_argument(
        "--prefix-cache-retention-interval",
        type=_retention,
        default=0,
        metavar="N",
        help="sliding-window checkpoints every N tokens; 0 keeps none, 'none' keeps all",
    )
    sim.add_argument(
        "--sweep",
        metavar="FLAG=V1,V2,...",
        help="rerun for each value of one flag (e.g. kv-cache-memory-bytes=10G,20G,40G) and "
        "print a table",
    )
    sim.add_argument("--plot", metavar="PNG", help="with --sweep: write the hit-rate plot")
    parser.set_defaults(
        func=run_simulate,
        parser_error=parser.error,
        plan_parser=plan_parser,
        simulate_parser=parser,
    )
    return parser


# --- running


def _clock(args: argparse.Namespace):
    if args.step_times is None:
        return args.clock
    try:
        with open(args.step_times) as f:
            points = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--step-times {args.step_times}: {exc}") from None
    if not isinstance(points, list) or not all(
        isinstance(p, list) and len(p) == 2 for p in points
    ):
        raise ValueError("--step-times holds a JSON list of [batched tokens, seconds] pairs")
    return points


def _trace(args: argparse.Namespace):
    from refimpl.sched.traces import SLICE_PATH, read_trace

    path = SLICE_PATH if args.trace == "slice" else args.trace
    return read_trace(path, limit=args.limit)


def _progress(total: int):
    """A tqdm bar on stderr when it is a terminal; else no bar (a callback, or None)."""
    if not sys.stderr.isatty():
        return None, None
    from tqdm import tqdm

    bar = tqdm(total=total, unit="req", file=sys.stderr, desc="requests finished")

    def update(done: int) -> None:
        bar.update(done - bar.n)

    return bar, update


def _simulate_one(args: argparse.Namespace, trace):
    from refimpl.models import plan_model
    from refimpl.simulate import simulate

    plan = plan_model(plan_cli.engine_args(args).create_engine_config())
    bar, update = _progress(len(trace))
    try:
        return simulate(
            plan,
            trace,
            clock=_clock(args),
            gpu=args.gpu_name,
            progress=update,
            policy=args.scheduling_policy,
            long_prefill_token_threshold=args.long_prefill_token_threshold,
            prefix_cache_retention_interval=args.prefix_cache_retention_interval,
        )
    finally:
        if bar is not None:
            bar.close()


def sweep_settings(args: argparse.Namespace, parser) -> tuple[str, list[tuple[str, object]]]:
    """(flag, [(value as typed, namespace)]) for `--sweep FLAG=V1,V2`: each value goes
    through the flag's own parser type."""
    flag, sep, values = args.sweep.partition("=")
    flag = "--" + flag.lstrip("-")
    action = parser._option_string_actions.get(flag)
    if not sep or not values or action is None or action.nargs == 0:
        raise ValueError(
            f"--sweep takes FLAG=V1,V2,... with a flag that takes a value "
            f"(e.g. kv-cache-memory-bytes=10G,20G), got {args.sweep!r}"
        )
    out = []
    for text in values.split(","):
        ns = copy.copy(args)
        try:
            value = action.type(text) if action.type else text
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise ValueError(f"--sweep {flag} {text}: {exc}") from None
        if action.choices is not None and value not in action.choices:
            raise ValueError(f"--sweep {flag} {text}: choose from {list(action.choices)}")
        setattr(ns, action.dest, value)
        out.append((text, ns))
    return flag, out


def run_simulate(args: argparse.Namespace) -> int:
    from refimpl.hybrid.kv_cache_utils import NotEnoughKVCacheMemoryError

    try:
        if args.plot and not args.sweep:
            raise ValueError("--plot draws a --sweep; give --sweep FLAG=V1,V2,...")
        trace = _trace(args)
        if args.sweep:
            flag, runs = sweep_settings(args, args.simulate_parser)
            sims = [(text, _simulate_one(ns, trace)) for text, ns in runs]
        else:
            sims = [(None, _simulate_one(args, trace))]
    except NotEnoughKVCacheMemoryError as exc:
        args.parser_error(str(exc).splitlines()[0])
    except ValueError as exc:
        args.parser_error(str(exc))
    if args.json:
        data = [{"value": text, "trace": args.trace, **sim.summary()} for text, sim in sims]
        text = json.dumps(
            data[0] if not args.sweep else {"flag": flag, "runs": data}, indent=2
        )
    elif args.sweep:
        text = format_sweep(flag, sims)
    else:
        text = format_simulation(sims[0][1], args.trace)
    if args.plot:
        from refimpl.viz.traffic import draw_sweep

        fig = draw_sweep(flag, [(t, s.summary()) for t, s in sims])
        fig.savefig(args.plot, dpi=150)
    print(text, flush=True)
    return 0


# --- printing


def sparkline(values: list[float], width: int) -> str:
    """`values` (0..1) averaged into `width` cells of block characters."""
    if not values:
        return ""
    n = len(values)
    cells = []
    for i in range(min(width, n)):
        lo, hi = i * n // min(width, n), (i + 1) * n // min(width, n)
        chunk = values[lo:hi]
        mean = sum(chunk) / len(chunk)
        cells.append(_SPARK[min(len(_SPARK) - 1, round(mean * (len(_SPARK) - 1)))])
    return "".join(cells)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def format_simulation(sim, trace_name: str) -> str:
    """The report `simulate` prints, at most 100 columns wide."""
    s = sim.summary()
    c = sim.plan.config
    sc = c.scheduler
    r = sim.result
    est = " est." if sim.timed else ""
    lines = [
        f"Trace      {Path(trace_name).name[:40]}: "
        + (f"{s['num_requests'] + len(sim.refused):,} requests, " if sim.refused else "")
        + f"{s['num_requests']:,} {'served' if sim.refused else 'requests'}, "
        f"{s['prompt_tokens']:,} prompt tokens",
        f"Plan       {c.model.architecture}, TP {c.model.tensor_parallel_size}: "
        f"{s['num_blocks']:,} blocks of {c.model.block_size:,} tokens "
        f"({sim.plan.num_tokens:,} tokens of KV cache)",
        f"Scheduler  max-num-seqs {sc.max_num_seqs:,}, max-num-batched-tokens "
        f"{sc.max_num_batched_tokens:,}, chunked prefill "
        f"{'on' if sc.enable_chunked_prefill else 'off'}, async "
        f"{'on' if sc.async_scheduling else 'off'}",
        f"Clock      {s['clock']}"
        + (": times are estimates" if sim.timed and "roofline" in s["clock"] else ""),
    ]
    if sim.refused:
        lines += [
            f"Refused    {len(sim.refused):,} requests with prompts of max-model-len "
            f"({sim.plan.max_model_len:,}) tokens or more,",
            f"{'':11}as vLLM's server refuses them; the figures below leave them out",
        ]
    lines += [
        "",
        f"Prefix-cache hits  {s['hit_tokens']:,} prompt tokens ({_pct(s['hit_rate'])})",
        f"{'':19}{s['requests_with_hit']:,} of {s['num_requests']:,} requests hit, "
        f"{_pct(s['mean_request_hit_rate'])} per request on average",
        f"Upper bound        {s['upper_bound_tokens']:,} tokens "
        f"({_pct(s['upper_bound_rate'])}): an infinite cache, from the trace itself",
        f"Preemptions        {s['preemptions']:,} ({s['preempted_requests']:,} requests), "
        f"{s['recomputed_tokens']:,} tokens recomputed",
    ]
    wait = (
        f"Waiting            mean {s['waiting_steps_mean']:,.1f} steps, p90 "
        f"{s['waiting_steps_p90']:,} steps, max {s['waiting_steps_max']:,} steps"
    )
    lines.append(wait)
    if sim.timed:
        lines.append(
            f"                   mean {s['waiting_seconds_mean']:,.2f} s{est}, p90 "
            f"{s['waiting_seconds_p90']:,.2f} s{est}"
        )
    lines.append(
        f"KV cache usage     mean {_pct(s['kv_usage_mean'])}, max {_pct(s['kv_usage_max'])}"
    )
    span = (
        f"0 .. {s['simulated_seconds']:,.1f} s{est}" if sim.timed else f"{r.num_steps:,} steps"
    )
    lines.append(f"  over time        |{sparkline(r.steps.kv_usage, 60)}| {span}")
    lines.append(
        f"Batches            mean {s['batch_requests_mean']:,.1f} requests (max "
        f"{s['batch_requests_max']:,}), mean {s['batch_tokens_mean']:,.0f} tokens (max "
        f"{s['batch_tokens_max']:,}) per step"
    )
    if sim.timed:
        throughput = (
            f"Throughput         {r.num_steps:,} steps in {s['simulated_seconds']:,.1f} s"
            f"{est}: {s['tokens_per_second']:,.0f} tokens/s{est}"
        )
    else:
        throughput = (
            f"Throughput         {r.num_steps:,} steps; no step-time model, so no seconds "
            "(--clock roofline)"
        )
    lines.append(throughput)
    return "\n".join(lines)


def format_sweep(flag: str, sims) -> str:
    """One row per value of the swept flag."""
    head = (
        f"{flag:>24}  {'hits':>6}  {'bound':>6}  {'preempt':>7}  {'recomputed':>11}  "
        f"{'wait s':>7}  {'KV mean':>7}  {'tokens/s':>9}"
    )
    rows = [head, "-" * len(head)]
    for text, sim in sims:
        s = sim.summary()
        wait = "-" if s["waiting_seconds_mean"] is None else f"{s['waiting_seconds_mean']:.2f}"
        tps = "-" if s["tokens_per_second"] is None else f"{s['tokens_per_second']:,.0f}"
        rows.append(
            f"{text:>24}  {_pct(s['hit_rate']):>6}  {_pct(s['upper_bound_rate']):>6}  "
            f"{s['preemptions']:>7,}  {s['recomputed_tokens']:>11,}  {wait:>7}  "
            f"{_pct(s['kv_usage_mean']):>7}  {tps:>9}"
        )
    return "\n".join(rows)
