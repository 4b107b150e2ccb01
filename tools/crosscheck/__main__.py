"""`python -m tools.crosscheck [--streams N] [--configs M] [--retention none,0,2x]` inside
`.venv-vllm` (`make crosscheck`): run the allocator crosscheck at each retention setting and
the planner crosscheck against the installed vLLM, and print the figures by cause.

`python -m tools.crosscheck record` (`make crosscheck-record`): write vLLM's answers for a
fixed set of streams and configurations to tests/data/vllm_oracle.json, which
tests/test_hybrid_vllm_oracle.py replays through refimpl without vLLM (and the V4 engine's
retention case, `engine_case.py`, which tests/test_v4_retention.py replays).
`python -m tools.crosscheck record --group-sets A,B` records only those group sets and merges
them into tests/data/vllm_oracle.json, leaving every other recorded stream as it was.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from tools.crosscheck.streams import GROUP_SETS, RETENTION_SETTINGS

ORACLE = Path(__file__).resolve().parents[2] / "tests" / "data" / "vllm_oracle.json"
# vLLM 0.32's general planner and capacity figures (tests/test_hybrid_vllm_planner_oracle.py)
PLANNER_ORACLE = ORACLE.with_name("vllm_planner_oracle.json")
# (with kv sharing and budgets that mostly fit: about 310 of them plan, the rest are refused)
RECORDED_GENERAL_CASES = 360
# one stream per group set, at each retention setting
RECORDED_STREAMS = range(len(GROUP_SETS))
RECORDED_CONFIGS = range(24)
# The two small cases, recorded as they are: one eagle group (vLLM's unitary
# coordinator hits 4 tokens, the hybrid loop would hit 8) and a flagged 8-token full group over
# 4-token hashes (vLLM registers the prompt's partial tail block).
RECORDED_CASES = [
    (
        "full-eagle",
        [
            ("new", "r0", list(range(12))),
            ("schedule", "r0", 12, 0, False, False, 0, False),
            ("finish", "r0"),
            ("new", "r1", list(range(12))),
            ("schedule", "r1", 12, 0, False, False, 0, False),
        ],
    ),
    (
        "full8-flagged+swa4",
        [
            ("new", "r0", list(range(12))),
            ("schedule", "r0", 12, 0, False, False, 0, False),
            ("finish", "r0"),
            ("new", "r1", list(range(16))),
            ("schedule", "r1", 16, 0, False, False, 0, False),
        ],
    ),
]
# Issue 30's two retention-0 cases, found by an outside fuzzer that drives vLLM's
# KVCacheManager directly and ignores the junction get_computed_blocks reports (the last field
# of each lookup, False: nobody pins it). vLLM hashes [6, 14, 15, 19, 20] and
# [1, 5, 6, 7, 13, 14, 21, 22, 23]; a manager that pins the junction itself keeps more.
RETENTION_CASES = [
    (
        "swa9+full16",
        [
            ("new", "r1", list(range(60))),
            ("schedule", "r1", 19, 0, True, True, 1, False, False),
            ("new", "r5", list(range(31)) + list(range(500, 511))),
            ("schedule", "r5", 42, 0, False, False, 0, False, False),
        ],
    ),
    (
        "full16+2swa12",
        [
            ("new", "r0", list(range(40))),
            ("schedule", "r0", 1, 0, False, False, 0, False, False),
            ("schedule", "r0", 23, 0, False, False, 0, False, False),
            ("preempt", "r0"),
            ("schedule", "r0", 40, 1, False, True, 0, False, False),
        ],
    ),
]
# Llama 4's admission cap, which random streams rarely reach: the full-sequence check asks a
# chunked group for one chunk plus the tokens in flight (5 blocks of 4 here, not 10), so r1's
# 40 tokens (15 blocks) fit beside r0 (17 free); without the cap they would not (20).
CHUNKED_CASES = [
    (
        "chunk12+full-cap",
        [
            ("new", "r0", list(range(24))),
            ("schedule", "r0", 24, 0, False, False, 0, False),
            ("new", "r1", list(range(100, 140))),
            ("schedule", "r1", 8, 0, True, True, 0, False),
        ],
    )
]
# streams per group set when only some group sets are recorded (`record --group-sets`)
RECORDED_PER_NEW_SET = 4
# DeepSeek V4's real block sizes: long tables; a prefix of the stream
RECORDED_REAL_SIZE_OPS = 30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.crosscheck",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", nargs="?", choices=["run", "record"], default="run")
    parser.add_argument(
        "--streams",
        type=int,
        default=1000,
        help="allocator streams to compare per retention setting",
    )
    parser.add_argument(
        "--configs", type=int, default=300, help="planner configurations to compare"
    )
    parser.add_argument(
        "--general",
        type=int,
        default=500,
        help="general-planner fuzzed cases (every spec kind, layouts, budgets, KV sharing) to "
        "compare; about 85%% of them plan, the rest are refused",
    )
    parser.add_argument(
        "--retention",
        default=",".join(RETENTION_SETTINGS),
        help="prefix_cache_retention_interval settings: none (dense), 0 (vLLM's default), "
        "Nx (N times the scheduler block size); comma-separated",
    )
    parser.add_argument(
        "--group-sets",
        default="",
        help="run: the allocator streams of these group sets only (comma-separated), and no "
        "planner check; record: only these group sets, RECORDED_PER_NEW_SET streams each at "
        "every retention, merged into the oracle in place of their old entries",
    )
    args = parser.parse_args(argv)

    import vllm

    from tools.crosscheck.allocator import crosscheck_allocator, run_stream, stream_for
    from tools.crosscheck.engine_case import ENGINE_GROUPS, RETENTIONS, trace_engine_case
    from tools.crosscheck.planner import plan_causes, plan_refimpl, random_config
    from tools.crosscheck.vllm_planner import plan_vllm
    from tools.crosscheck.vllm_side import VllmAllocator

    settings = args.retention.split(",")
    if args.command == "record" and args.group_sets:
        return record_group_sets(args.group_sets.split(","), vllm.__version__)
    if args.command == "record":
        streams = []
        for retention in RETENTION_SETTINGS:
            for seed in RECORDED_STREAMS:
                gs, ops = stream_for(seed)
                # keep the file small
                ops = ops[:RECORDED_REAL_SIZE_OPS] if gs.unit > 1 else ops
                record, at, _ = run_stream(gs, ops, VllmAllocator, retention)
                streams.append(
                    {
                        "seed": seed,
                        "group_set": gs.name,
                        "retention": retention,
                        "ops": ops,
                        "observations": record,
                    }
                )
        # seed -1: the eagle / partial-tail cases; -2: issue 30's retention-0 cases; -3: the
        # chunked admission cap
        cases = [(-1, *c) for c in RECORDED_CASES] + [(-2, *c) for c in RETENTION_CASES]
        cases += [(-3, *c) for c in CHUNKED_CASES]
        for seed, name, ops in cases:
            record, _, _ = run_stream(GROUP_SETS[name], ops, VllmAllocator, "0")
            streams.append(
                {
                    "seed": seed,
                    "group_set": name,
                    "retention": "0",
                    "ops": ops,
                    "observations": record,
                }
            )
        engine = []
        for setting, retention in RETENTIONS.items():
            ops = trace_engine_case(retention)
            record, at, _ = run_stream(ENGINE_GROUPS, ops, VllmAllocator, setting)
            if at is not None:
                raise SystemExit(f"engine case, retention {setting}: refimpl diverges at {at}")
            engine.append({"retention": setting, "ops": ops, "observations": record})
        planner = [
            {"seed": s, "case": random_config(s), "plan": plan_vllm(random_config(s))}
            for s in RECORDED_CONFIGS
        ]
        from tools.crosscheck.general_vllm import record_general

        general = record_general(RECORDED_GENERAL_CASES)
        PLANNER_ORACLE.write_text(
            json.dumps({"vllm_version": vllm.__version__, **general}, separators=(",", ":"))
            + "\n"
        )
        print(
            f"wrote {PLANNER_ORACLE} ({PLANNER_ORACLE.stat().st_size:,} bytes): "
            f"{len(general['named'])} named and {len(general['fuzzed'])} fuzzed cases"
        )
        ORACLE.parent.mkdir(parents=True, exist_ok=True)
        ORACLE.write_text(
            json.dumps(
                {
                    "vllm_version": vllm.__version__,
                    "streams": streams,
                    "engine": engine,
                    "planner": planner,
                },
                separators=(",", ":"),
            )
            + "\n"
        )
        print(
            f"wrote {ORACLE} ({ORACLE.stat().st_size:,} bytes): {len(streams)} streams, "
            f"{len(planner)} "
            f"planner configurations, answered by vLLM {vllm.__version__}"
        )
        return 0

    print(f"crosscheck against vLLM {vllm.__version__}", flush=True)
    failed = False
    names = [n for n in args.group_sets.split(",") if n]
    ops = sum(len(stream_for(seed, names)[1]) for seed in range(args.streams))
    for retention in settings:
        agreed, failures, by_cause = crosscheck_allocator(
            args.streams, VllmAllocator, retention, names=names
        )
        failed |= bool(failures)
        print(
            f"allocator, retention {retention}: {agreed} of {args.streams} streams agree "
            f"({ops:,} operations; "
            f"every output and the pool state compared after each)",
            flush=True,
        )
        for cause, n in sorted(by_cause.items()):
            print(f"    {n:5d} agreeing streams exercised: {cause}")
    if names:
        return 1 if failed else 0
    plan_failures, plan_by_cause = [], Counter()
    for seed in range(args.configs):
        case = random_config(seed)
        theirs, ours = plan_vllm(case), plan_refimpl(case)
        if theirs != ours:
            keys = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
            plan_failures.append(
                f"configuration {seed} {case}: differs in {keys}\n"
                f"    vLLM:    { {k: theirs.get(k) for k in keys} }\n"
                f"    refimpl: { {k: ours.get(k) for k in keys} }"
            )
            print(plan_failures[-1])
        else:
            plan_by_cause.update(plan_causes(case, theirs))
    print(
        f"planner C: {args.configs - len(plan_failures)} of {args.configs} configurations "
        "agree "
        "(vLLM's side built from vLLM's own DeepSeek V4 layers and backends; groups, order, "
        "eagle flag, "
        f"block count, stride, every tensor's layers, offset and layer stride)"
    )
    for cause, n in sorted(plan_by_cause.items()):
        print(f"    {n:5d} agreeing configurations: {cause}")
    from tools.crosscheck.general_planner import NAMED_CASES
    from tools.crosscheck.general_vllm import crosscheck_general

    agreed, general_failures, general_causes = crosscheck_general(args.general)
    for report in general_failures:
        print(report)
    planned = general_causes.pop("fuzzed, planned", 0)
    refused = general_causes.pop("fuzzed, refused", 0)
    print(
        f"general planner: {agreed} of {args.general} fuzzed + {len(NAMED_CASES)} named "
        "cases agree (vLLM's "
        "own spec classes, platform block alignment, get_kv_cache_configs, "
        "get_kv_cache_capacity and the model runner's KV sharing step; every group, page, "
        "block size, block count, tensor, token and concurrency figure, or the same refusal "
        "with the same figures)\n"
        f"    fuzzed cases vLLM planned: {planned}; refused: {refused}"
    )
    for cause, n in sorted(general_causes.items()):
        print(f"    {n:5d} agreeing cases: {cause}")
    from tools.crosscheck.general_vllm import mutation_figures

    print("general planner, each rule undone in refimpl (cases that then disagree):")
    for rule, n in mutation_figures(args.general).items():
        print(f"    {n:5d} disagree without the {rule}")
        general_failures += [] if n else [f"undoing the {rule} changes nothing"]
    return 1 if failed or plan_failures or general_failures else 0


def record_group_sets(names: list[str], vllm_version: str) -> int:
    """Record vLLM's answers for a few group sets only (the first `RECORDED_PER_NEW_SET`
    seeds of each, at every retention, and their `CHUNKED_CASES`) and merge them into the
    oracle, keeping every other
    entry as it was: adding a group set does not re-record the others."""
    from tools.crosscheck.allocator import run_stream, stream_for
    from tools.crosscheck.vllm_side import VllmAllocator

    unknown = sorted(set(names) - set(GROUP_SETS))
    if unknown:
        raise SystemExit(f"unknown group sets {unknown}; known: {sorted(GROUP_SETS)}")
    oracle = json.loads(ORACLE.read_text())
    if oracle["vllm_version"] != vllm_version:
        raise SystemExit(f"the oracle is vLLM {oracle['vllm_version']}'s, not {vllm_version}")
    seeds = {name: [] for name in names}
    seed = 0
    while any(len(found) < RECORDED_PER_NEW_SET for found in seeds.values()):
        name = stream_for(seed)[0].name
        if name in seeds and len(seeds[name]) < RECORDED_PER_NEW_SET:
            seeds[name].append(seed)
        seed += 1
    streams = [s for s in oracle["streams"] if s["group_set"] not in seeds]
    for retention in RETENTION_SETTINGS:
        for name in names:
            for seed in seeds[name]:
                gs, ops = stream_for(seed)
                record, at, _ = run_stream(gs, ops, VllmAllocator, retention)
                if at is not None:
                    raise SystemExit(f"stream {seed} ({name}, {retention}): diverges at {at}")
                streams.append(
                    {
                        "seed": seed,
                        "group_set": name,
                        "retention": retention,
                        "ops": ops,
                        "observations": record,
                    }
                )
    for name, ops in CHUNKED_CASES:
        if name in seeds:
            record, _, _ = run_stream(GROUP_SETS[name], ops, VllmAllocator, "0")
            streams.append(
                {
                    "seed": -3,
                    "group_set": name,
                    "retention": "0",
                    "ops": ops,
                    "observations": record,
                }
            )
    oracle["streams"] = streams
    ORACLE.write_text(json.dumps(oracle, separators=(",", ":")) + "\n")
    print(f"wrote {ORACLE} ({ORACLE.stat().st_size:,} bytes): {len(streams)} streams")
    return 0


if __name__ == "__main__":
    sys.exit(main())
