"""The Mooncake trace slice as scheduler crosscheck settings (issue 38: "and on the public
trace").

The stream is the shipped slice (`refimpl.sched.traces.SLICE_PATH`), all 100 requests, each
hash id 512 token ids as `read_trace` makes them. Arrivals are placed on steps by the
arrival-order clock (`refimpl.sched.clock.ArrivalOrderClock`): each distinct timestamp opens
the next step, so the 100 requests arrive over the first 96 steps, back to back, on both
sides. A request runs for exactly the trace's `output_length` tokens: the made-up runner's
EOS token is replaced by another token, so nothing but `max_tokens` finishes a request (and
no request is aborted). All requests get priority 0 and FCFS.

Settings: dense (one group of 16-token blocks), sliding window (16-token full group beside a
window of 32) and DeepSeek V4's real caches (tiny config), at retention None, 0 and k (k only
where a window exists), chunked or not, sync or async; FCFS, 32 sequences, chunks of 2,048
tokens with `long_prefill_token_threshold` 512 (or, unchunked, a budget of max_model_len).
Pools are the smallest vLLM's planner accepts for one request of max_model_len (131,072; the
longest request is 122,530 tokens) plus 8 spare blocks (none for V4). Every setting gets
prefix hits (91k to 226k prompt tokens). Preemptions: 54 in every chunked dense setting, 53
to 84 in chunked swa, 0 to 3 on V4; unchunked, dense 5, swa and V4 none (a budget of
max_model_len sizes vLLM's smallest pool for a whole max_model_len step of window blocks,
far more than 32 running windows need). The Mamba hybrid (tiny-granite-h, 128-token blocks):
prefix caching on (vLLM's "align", chunked only) at retention None, 0 and 512, and off
("none"), chunked or not; its pool is one request of max_model_len plus 8 spare blocks; hits
108k to 184k tokens with caching on, preemptions 45 to 81 chunked, 2 unchunked. Llama 4's
caches as vLLM's own model makes them for tiny-llama4 (3 chunked local groups of 256-token
chunks beside a full one, 128-token blocks), retention None and 0, chunked or not, sync or
async; pool: vLLM's per-request admission cap plus 8 spare blocks; hits 199k to 205k tokens,
preemptions 43 to 57 chunked, none unchunked.

Nothing here imports vLLM; `python -m tools.crosscheck.sched_trace` (vLLM's venv) checks both
sides step for step and records `tests/data/vllm_sched_trace_oracle.json`.
"""

from __future__ import annotations

from refimpl.sched.traces import SLICE_PATH, read_trace
from tools.crosscheck.sched_streams import (
    EOS,
    LLAMA4_CONFIG,
    LLAMA4_GROUPS,
    MAMBA_CONFIG,
    VOCAB,
    RefimplSide,
    Setting,
    digest,
    drive,
    min_blocks_per_request,
    summary,
)

#: covers the slice's longest request (122,530 prompt + output tokens)
TRACE_MAX_MODEL_LEN = 1 << 17
#: a chunk of this many tokens per step when chunked; max_model_len otherwise
TRACE_CHUNK = 2048
#: smallest pool vLLM 0.32's planner accepts for the tiny DeepSeek V4 at TRACE_MAX_MODEL_LEN,
#: by (chunked, async); measured with `python -m tools.crosscheck.sched_trace --min-blocks`
TRACE_V4_MIN_BLOCKS = {
    (True, False): 1371,
    (True, True): 2203,
    (False, False): 53765,
    (False, True): 53765,
}


def trace_stream() -> list[list[dict]]:
    """The slice's arrivals per step, one step per distinct arrival time."""
    steps: list[list[dict]] = []
    last = None
    for r in read_trace(SLICE_PATH):
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


def _pool(groups: tuple[tuple, ...], batch: int, asy: bool, spare: int) -> int:
    """One request of max_model_len (a window keeps only its span plus a step's tokens in
    flight), plus `spare` blocks."""
    mml = TRACE_MAX_MODEL_LEN
    in_flight = batch * (2 if asy else 1)
    return spare + sum(
        -(-mml // g[1])
        if g[0] == "full"
        else min(-(-mml // g[1]), -(-(g[2] - 1 + in_flight) // g[1]) + 1)
        for g in groups
    )


def trace_settings() -> list[Setting]:
    out = []
    layouts = [
        ("dense", (("full", 16),), 8, (None, 0)),
        ("swa", (("full", 16), ("swa", 16, 32)), 8, (None, 0, 32)),
        ("dsv4", (), 0, (None, 0, 512)),
    ]
    for name, groups, spare, retentions in layouts:
        for retention in retentions:
            for chunked in (True, False):
                for asy in (False, True):
                    batch = TRACE_CHUNK if chunked else TRACE_MAX_MODEL_LEN
                    nb = (
                        TRACE_V4_MIN_BLOCKS.get((chunked, asy), 0)
                        if not groups
                        else _pool(groups, batch, asy, spare)
                    )
                    mode = f"{'chunk' if chunked else 'nochunk'}-{'async' if asy else 'sync'}"
                    out.append(
                        Setting(
                            name=f"trace-{name}-ret{retention}-{mode}",
                            groups=groups,
                            num_blocks=nb,
                            max_model_len=TRACE_MAX_MODEL_LEN,
                            max_num_seqs=32,
                            max_num_batched_tokens=batch,
                            enable_chunked_prefill=chunked,
                            long_prefill_token_threshold=512 if chunked else 0,
                            async_scheduling=asy,
                            retention=retention,
                            model="" if groups else "tiny-deepseek-v4",
                        )
                    )
    # the Mamba hybrid: prefix caching on ("align", chunked only, as vLLM requires) at
    # retention None, 0 and k, and off ("none"), chunked or not
    per_request = -(-TRACE_MAX_MODEL_LEN // 128)  # attention blocks, + 1 null block
    for caching, retentions in ((True, (None, 0, 512)), (False, (0,))):
        for retention in retentions:
            for chunked in (True, False) if not caching else (True,):
                for asy in (False, True):
                    mode = f"{'chunk' if chunked else 'nochunk'}-{'async' if asy else 'sync'}"
                    label = f"ret{retention}" if caching else "nocache"
                    out.append(
                        Setting(
                            name=f"trace-mamba-{label}-{mode}",
                            groups=(),
                            # 3 Mamba groups: 2 state blocks and a checkpoint each when
                            # aligned, one state each otherwise; plus 8 spare
                            num_blocks=per_request + 1 + (9 if caching else 3) + 8,
                            max_model_len=TRACE_MAX_MODEL_LEN,
                            max_num_seqs=32,
                            max_num_batched_tokens=(
                                TRACE_CHUNK if chunked else TRACE_MAX_MODEL_LEN
                            ),
                            enable_chunked_prefill=chunked,
                            long_prefill_token_threshold=512 if chunked else 0,
                            async_scheduling=asy,
                            retention=retention,
                            model=MAMBA_CONFIG,
                            enable_prefix_caching=caching,
                        )
                    )
    # Llama 4's caches as vLLM's own model makes them for the tiny config (3 chunked local
    # groups of 256-token chunks and a full one, 128-token blocks): retention None and 0
    # (vLLM refuses k without a window), chunked or not, sync or async
    for retention in (None, 0):
        for chunked in (True, False):
            for asy in (False, True):
                batch = TRACE_CHUNK if chunked else TRACE_MAX_MODEL_LEN
                in_flight = batch * (2 if asy else 1)
                mode = f"{'chunk' if chunked else 'nochunk'}-{'async' if asy else 'sync'}"
                out.append(
                    Setting(
                        name=f"trace-llama4-ret{retention}-{mode}",
                        groups=(),
                        num_blocks=8
                        + sum(
                            min_blocks_per_request(g, TRACE_MAX_MODEL_LEN, in_flight)
                            for g in LLAMA4_GROUPS
                        ),
                        max_model_len=TRACE_MAX_MODEL_LEN,
                        max_num_seqs=32,
                        max_num_batched_tokens=batch,
                        enable_chunked_prefill=chunked,
                        long_prefill_token_threshold=512 if chunked else 0,
                        async_scheduling=asy,
                        retention=retention,
                        model=LLAMA4_CONFIG,
                    )
                )
    return out


def no_eos(sampled: dict[str, list[int]]) -> dict[str, list[int]]:
    """The runner's tokens with EOS replaced: a trace request runs to its output length."""
    return {r: [VOCAB if t == EOS else t for t in ts] for r, ts in sampled.items()}


class RefimplTraceSide(RefimplSide):
    def update(self, out, sampled: dict[str, list[int]]) -> None:
        super().update(out, no_eos(sampled))


def check_setting(setting: Setting, stream: list[list[dict]]) -> tuple[list[dict], float]:
    """Both schedulers through the trace; the step log (equal on both sides) and the
    seconds the pair took."""
    import time

    from tools.crosscheck.scheduler import VllmSide

    class VllmTraceSide(VllmSide):
        def update(self, out, sampled: dict[str, list[int]]) -> None:
            super().update(out, no_eos(sampled))

    t0 = time.time()
    theirs = VllmTraceSide(setting)
    ours = RefimplTraceSide(setting)
    if ours.s.kv_cache_manager.num_gpu_blocks != theirs.num_blocks:
        raise AssertionError(f"{setting.name}: num_blocks differ")
    a = drive(theirs, stream, setting.async_scheduling, max_steps=10**6)
    b = drive(ours, stream, setting.async_scheduling, max_steps=10**6)
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            raise AssertionError(f"{setting.name} step {i}:\n vLLM    {x}\n refimpl {y}")
    if len(a) != len(b):
        raise AssertionError(f"{setting.name}: {len(a)} vs {len(b)} steps")
    return a, time.time() - t0


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import logging
    from dataclasses import replace
    from pathlib import Path

    p = argparse.ArgumentParser()
    p.add_argument("--only", default="", help="substrings of setting names, comma-separated")
    p.add_argument("--record", default="")
    p.add_argument("--min-blocks", action="store_true")
    args = p.parse_args(argv)
    logging.getLogger("vllm").setLevel(logging.ERROR)
    if args.min_blocks:
        from tools.crosscheck.scheduler import _build

        found = {}
        for s in trace_settings():
            key = (s.enable_chunked_prefill, s.async_scheduling)
            if s.model and key not in found:
                lo, hi = 1, 1 << 17
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    try:
                        _build(replace(s, num_blocks=mid))
                        hi = mid
                    except ValueError:
                        lo = mid
                found[key] = hi
                print(key, hi, flush=True)
        return 0
    stream = trace_stream()
    path = Path(args.record) if args.record else None
    old = json.loads(path.read_text())["settings"] if path and path.exists() else []
    entries = {e["setting"]["name"]: e for e in old}
    for setting in trace_settings():
        if args.only and not any(o in setting.name for o in args.only.split(",")):
            continue
        log, seconds = check_setting(setting, stream)
        entries[setting.name] = {
            "setting": setting.to_json(),
            "digest": digest(log),
            "totals": summary(log),
            "seconds_vllm_and_refimpl": round(seconds, 1),
        }
        print(f"{setting.name}: equal {summary(log)} {seconds:.1f}s", flush=True)
        if path:
            order = [s.name for s in trace_settings()]
            path.write_text(
                json.dumps(
                    {
                        "generator": "tools/crosscheck/sched_trace.py (the Mooncake slice)",
                        "settings": sorted(
                            entries.values(), key=lambda e: order.index(e["setting"]["name"])
                        ),
                    },
                    indent=1,
                )
                + "\n"
            )
    return 0


if __name__ == "__main__":
    import os
    import sys

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # tiny-llama's config says 4,096 positions; the slice needs 131,072 (the scheduler does
    # not care, vLLM's config check does)
    os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    sys.exit(main())
