"""`python -m refimpl plan`: print the KV-cache plan of a DeepSeek V4 model.

    python -m refimpl plan --model deepseek-v4-pro --memory 10GiB
    python -m refimpl plan --model deepseek-v4-flash --indexer fp4 --json
    python -m refimpl plan --layout B        # the planner the vLLM KV-cache article describes

Shows the groups (kind, block size, layers, width in bytes), the block stride, how many blocks
fit in the memory budget, and the byte offsets of the packed slab.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from fractions import Fraction

from refimpl.cli import DefaultsHelpFormatter
from refimpl.hybrid import deepseek_v4, older_planners
from refimpl.hybrid.kv_cache_planning import (
    approximate_gcd,
    get_kv_cache_bytes_per_block,
    get_kv_cache_config,
    get_kv_cache_groups,
)
from refimpl.plan_summary import summarize_groups

MODELS = {"deepseek-v4-pro": "pro", "deepseek-v4-flash": "flash"}
GROUPINGS = ("grouped", "mla+swa")
LAYOUT_VERSIONS = ("B", "C")
CACHE_DTYPE_ALIASES = {
    "fp8": "fp8_ds_mla",
    "fp8_ds_mla": "fp8_ds_mla",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}


# Python parameter names in library errors -> the flags a command-line user typed.
FLAG_FOR_PARAMETER = {
    "available_memory": "--memory",
    "num_blocks_override": "--num-blocks",
    "block_size": "--block-size",
}


#: The largest budget `parse_memory` accepts: 1 PiB, more memory than any single accelerator
# has.
MAX_MEMORY_BYTES = 1 << 50
_MEMORY_UNITS = {
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "b": 1,
    "": 1,
}


def parse_memory(text: str | int) -> int:
    """'10GiB' -> 10737418240; also KiB/MiB/TiB, KB/MB/GB/TB and plain byte counts.

    The number is read exactly (as a fraction, never through a float), so '1.5GiB' is exact and
    a size that is not a whole number of bytes, negative, or above 1 PiB is a ValueError.
    """
    if isinstance(text, bool):
        raise ValueError(
            f"memory size must be a number of bytes or a string such as '10GiB', got {text!r}"
        )
    if isinstance(text, int):
        value = Fraction(text)
    else:
        s = str(text).strip().lower().replace("_", "").replace(",", "")
        number = s.rstrip("kmgtib")
        unit = s[len(number) :]
        try:
            if "/" in number:
                raise ValueError("a fraction")
            value = Fraction(number) * _MEMORY_UNITS[unit]
        except (ValueError, ZeroDivisionError, KeyError):
            raise ValueError(
                f"cannot read memory size {text!r}; use e.g. 10GiB, 512MiB, 4GB or 123456"
            ) from None
    if value < 0:
        raise ValueError(f"memory size must not be negative, got {text!r}")
    if value.denominator != 1:
        raise ValueError(
            f"memory size {text!r} is not a whole number of bytes ({float(value):,.2f} B)"
        )
    if value > MAX_MEMORY_BYTES:
        raise ValueError(
            f"memory size {text!r} is more than 1 PiB ({MAX_MEMORY_BYTES:,} B); no device has "
            "that much"
        )
    return int(value)


def memory_size(text: str) -> int:
    """argparse type for `--memory`: a byte count such as 10GiB, read exactly."""
    try:
        return parse_memory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def int_at_least(minimum: int, why: str):
    """argparse type: an integer >= `minimum`, with `why` in the error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a whole number, got {text!r}"
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"must be at least {minimum} ({why}), got {value}"
            )
        return value

    return parse


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "plan",
        help="plan a DeepSeek V4 KV cache (groups, stride, blocks, offsets)",
        description=(
            "Print the KV-cache plan of a DeepSeek V4 model: its groups, block stride, "
            "how many blocks fit in the memory budget, and the byte offsets in one block."
        ),
        formatter_class=DefaultsHelpFormatter,
    )
    parser.add_argument(
        "--model", choices=sorted(MODELS), default="deepseek-v4-pro", help="which model"
    )
    parser.add_argument(
        "--memory",
        type=memory_size,
        default="10GiB",
        help="KV-cache budget, e.g. 10GiB, 512MiB, 4GB or a byte count",
    )
    parser.add_argument(
        "--cache-dtype",
        choices=sorted(CACHE_DTYPE_ALIASES),
        default="fp8_ds_mla",
        help="fp8 (= fp8_ds_mla, 584 B rows) or bfloat16",
    )
    parser.add_argument(
        "--indexer",
        choices=deepseek_v4.INDEXER_DTYPES,
        default="fp8",
        help="format of the indexer's key cache",
    )
    parser.add_argument(
        "--mtp", action="store_true", help="add the MTP layer (speculative decoding)"
    )
    parser.add_argument(
        "--block-size",
        type=int_at_least(1, "tokens per block"),
        default=256,
        help="logical block size in tokens (a multiple of 128)",
    )
    parser.add_argument(
        "--num-blocks",
        type=int_at_least(2, "block 0 is the null block, so 1 block leaves none usable"),
        default=None,
        help="use this many blocks instead of filling --memory",
    )
    parser.add_argument(
        "--grouping",
        choices=GROUPINGS,
        default="grouped",
        help="grouped: the real grouping; mla+swa: the vLLM KV-cache article's hypothetical "
        "two-group plan (MLA + one unsplit SWA group)",
    )
    parser.add_argument(
        "--layout",
        choices=LAYOUT_VERSIONS,
        default="C",
        help="planner version: C is what vLLM 0.32/0.33 run (sliding-window groups first, "
        "one tensor per group and spec run); B is the version the vLLM KV-cache article "
        "describes (MLA group first, one tensor per byte offset)",
    )
    parser.add_argument(
        "--offsets",
        type=int_at_least(-1, "-1 prints all"),
        default=10,
        help="offset rows to print (-1 for all)",
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.set_defaults(func=run_plan, parser_error=parser.error)
    return parser


def with_flag_names(message: str) -> str:
    """A library error reworded for the command line: parameter names become flags."""
    for parameter, flag in FLAG_FOR_PARAMETER.items():
        message = re.sub(rf"\b{parameter}\b", flag, message)
    return message


def build_plan(args: argparse.Namespace) -> dict:
    """Everything the plan prints, as plain data."""
    specs = deepseek_v4.kv_cache_specs(
        MODELS[args.model],
        cache_dtype=CACHE_DTYPE_ALIASES[args.cache_dtype],
        indexer=args.indexer,
        mtp=args.mtp,
        block_size=args.block_size,
    )
    memory = args.memory
    planner_b = args.layout == "B"
    if args.grouping == "grouped":
        groups = (older_planners.get_kv_cache_groups_b if planner_b else get_kv_cache_groups)(
            specs, use_eagle=args.mtp
        )
    else:
        groups = older_planners.two_group_layout(specs)
    # what each block id costs, the divisor of --memory
    stride = (older_planners.bytes_per_block_b if planner_b else get_kv_cache_bytes_per_block)(
        groups
    )
    if args.num_blocks is None and memory < 2 * stride:
        raise ValueError(
            f"--memory {memory:,} B leaves no usable block: one block takes {stride:,} B and "
            f"block 0 is the null block, so give at least {2 * stride:,} B"
        )
    if args.num_blocks is not None and args.num_blocks * stride > MAX_MEMORY_BYTES:
        raise ValueError(
            f"--num-blocks {args.num_blocks:,} needs {args.num_blocks * stride:,} B, more "
            "than 1 PiB"
        )
    config = (older_planners.get_kv_cache_config_b if planner_b else get_kv_cache_config)(
        groups, memory, num_blocks_override=args.num_blocks
    )
    tuples = [
        b.get_num_layer_tuples() for b in older_planners.group_and_unify_kv_cache_specs(specs)
    ]
    summary = summarize_groups(groups)
    return {
        "model": args.model,
        "cache_dtype": CACHE_DTYPE_ALIASES[args.cache_dtype],
        "indexer": args.indexer,
        "mtp": args.mtp,
        "block_size": args.block_size,
        "grouping": args.grouping,
        "layout": args.layout,
        "num_cache_layers": len(specs),
        "layer_tuples_per_bucket": tuples,
        "approximate_gcd": approximate_gcd(tuples, lower_bound=tuples[0]),
        "groups": [
            {
                "index": row.index,
                "kind": row.kind,
                "block_size": row.block_size,
                "num_layers": row.num_layers,
                "width_bytes": row.width_bytes,
                "unused_tail_bytes": row.unused_tail_bytes,
                "padding_bytes": row.padding_bytes,
                "is_eagle_group": groups[row.index].is_eagle_group,
                "layer_names": list(groups[row.index].layer_names),
            }
            for row in summary
        ],
        "block_stride": config.block_stride,
        "available_memory": memory,
        "num_blocks": config.num_blocks,
        "num_usable_blocks": config.num_usable_blocks,
        "slab_bytes": config.block_stride * config.num_blocks,
        "offsets": [
            {
                "offset": t.offset,
                "shared_by": list(t.shared_by),
                "layer_stride": t.layer_stride,
            }
            for t in config.kv_cache_tensors
        ],
    }


def format_plan(plan: dict, max_offsets: int = 10) -> str:
    lines = [
        f"{plan['model']}: cache {plan['cache_dtype']}, indexer {plan['indexer']}, "
        f"mtp {'on' if plan['mtp'] else 'off'}, block size {plan['block_size']}, grouping "
        f"{plan['grouping']}, "
        f"planner {plan['layout']}",
        f"{plan['num_cache_layers']} cache layers; layer tuples per bucket (planner B's "
        "buckets) "
        f"{plan['layer_tuples_per_bucket']}, approximate gcd d = {plan['approximate_gcd']}",
    ]
    planned = sum(g["num_layers"] for g in plan["groups"])
    if planned != plan["num_cache_layers"]:
        lines.append(
            f"this layout plans {planned} of them; {plan['num_cache_layers'] - planned} "
            "caches "
            f"(the compressor states) are left out, as in the article's example"
        )
    lines += [
        "",
        f"{'group':>5}  {'kind':<17}{'block':>6}{'layers':>8}{'width B':>12}"
        f"{'unused B':>11}{'padding B':>11}",
    ]
    for g in plan["groups"]:
        eagle = "  (eagle)" if g["is_eagle_group"] else ""
        lines.append(
            f"{g['index']:>5}  {g['kind']:<17}{g['block_size']:>6}{g['num_layers']:>8}"
            f"{g['width_bytes']:>12,}{g['unused_tail_bytes']:>11,}{g['padding_bytes']:>11,}{eagle}"
        )
    lines += [
        "",
        f"block stride: {plan['block_stride']:,} B (the widest group)",
        f"memory {plan['available_memory']:,} B -> {plan['num_blocks']:,} blocks "
        f"({plan['num_usable_blocks']:,} usable; block 0 is the null block), slab "
        f"{plan['slab_bytes']:,} B",
        f"{len(plan['offsets'])} distinct byte offsets in a block:"
        if plan["layout"] == "B"
        else f"{len(plan['offsets'])} tensors (one per group and spec run; "
        "layer i of a run starts at offset + i x layer stride):",
    ]
    shown = plan["offsets"] if max_offsets < 0 else plan["offsets"][:max_offsets]
    for row in shown:
        if row["layer_stride"] is None:
            lines.append(f"  {row['offset']:>10,}  {', '.join(row['shared_by'])}")
        else:
            names = row["shared_by"]
            listed = (
                ", ".join(names)
                if len(names) <= 3
                else f"{names[0]}, {names[1]}, ... {names[-1]}"
            )
            lines.append(
                f"  {row['offset']:>10,}  {len(names)} x {row['layer_stride']:,} B: {listed}"
            )
    if len(shown) < len(plan["offsets"]):
        lines.append(
            f"  ... {len(plan['offsets']) - len(shown)} more (--offsets -1 prints all)"
        )
    return "\n".join(lines)


def run_plan(args: argparse.Namespace) -> int:
    try:
        plan = build_plan(args)
    except ValueError as exc:
        args.parser_error(with_flag_names(str(exc)))
    try:
        print(
            json.dumps(plan, indent=2) if args.json else format_plan(plan, args.offsets),
            flush=True,
        )
    except BrokenPipeError:  # the reader stopped early (`| head`): quietly drop the rest
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0
