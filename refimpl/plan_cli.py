"""`python -m refimpl plan`: print the KV-cache plan vLLM will make, before renting a GPU.

    python -m refimpl plan --config path/to/config.json --gpu-memory 80GiB --max-model-len 8192
    python -m refimpl plan --config config.json --kv-cache-memory-bytes 20GiB --json
    python -m refimpl plan --model deepseek-v4-pro --memory 10GiB
    python -m refimpl plan --model deepseek-v4-flash --indexer fp4 --json
    python -m refimpl plan --layout B        # the planner the vLLM KV-cache article describes

With `--config` (any Hugging Face config.json that `refimpl.models` can read; nothing is
downloaded) it prints what vLLM logs at startup, "KV cache size: N tokens" and "Maximum
concurrency for L tokens per request", with the groups, block size, page sizes and blocks
behind them and why (padding layers, the sliding-window reservation, a hybrid's aligned
block). The flags and defaults are `vllm serve`'s. With `--model` it shows DeepSeek V4's
groups, block stride, blocks and the byte offsets of the packed slab.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap
from fractions import Fraction

from refimpl.cli import DefaultsHelpFormatter
from refimpl.hybrid import deepseek_v4, older_planners
from refimpl.hybrid.kv_cache_planning import (
    approximate_gcd,
    get_kv_cache_bytes_per_block,
    get_kv_cache_config,
    get_kv_cache_groups,
)
from refimpl.models.engine_args import (
    argparse_type,
    human_readable_int,
    human_readable_int_or_auto,
)
from refimpl.plan_summary import summarize_groups

MODELS = {"deepseek-v4-pro": "pro", "deepseek-v4-flash": "flash"}
V4_BLOCK_SIZE = 256  # --model's default block size
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
    "num_gpu_blocks_override": "--num-gpu-blocks-override",
    "block_size": "--block-size",
    "max_model_len": "--max-model-len",
    "gpu_memory_utilization": "--gpu-memory-utilization",
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
        help="plan a model's KV cache as vLLM will (tokens, concurrency, groups, blocks)",
        description=(
            "Print the KV-cache plan vLLM 0.32 makes for a Hugging Face config.json "
            "(--config): groups, block size, pages, blocks, the KV cache size in tokens and "
            "the maximum concurrency, and why. With --model: a DeepSeek V4 model's groups, "
            "block stride, blocks and byte offsets."
        ),
        formatter_class=DefaultsHelpFormatter,
    )
    v4 = parser.add_argument_group(
        "DeepSeek V4 (--model); refused with --config, which takes vllm serve's flags below"
    )
    v4.add_argument(
        "--model",
        choices=sorted(MODELS),
        default=None,
        help="which model (default: deepseek-v4-pro)",
    )
    v4.add_argument(
        "--memory",
        type=memory_size,
        default=None,
        help="KV-cache budget, e.g. 10GiB, 512MiB, 4GB or a byte count (default: 10GiB)",
    )
    v4.add_argument(
        "--cache-dtype",
        choices=sorted(CACHE_DTYPE_ALIASES),
        default=None,
        help="fp8 (= fp8_ds_mla, 584 B rows) or bfloat16 (default: fp8_ds_mla)",
    )
    v4.add_argument(
        "--indexer",
        choices=deepseek_v4.INDEXER_DTYPES,
        default=None,
        help="format of the indexer's key cache (default: fp8)",
    )
    v4.add_argument(
        "--mtp", action="store_true", help="add the MTP layer (speculative decoding)"
    )
    parser.add_argument(
        "--block-size",
        type=int_at_least(1, "tokens per block"),
        help="tokens per block (DeepSeek V4: a multiple of 128, 256 by default; --config: "
        "vLLM's choice for the backend by default)",
    )
    v4.add_argument(
        "--num-blocks",
        type=int_at_least(2, "block 0 is the null block, so 1 block leaves none usable"),
        default=None,
        help="use this many blocks instead of filling --memory (with --config: "
        "--num-gpu-blocks-override)",
    )
    v4.add_argument(
        "--grouping",
        choices=GROUPINGS,
        default=None,
        help="grouped (default): the real grouping; mla+swa: the vLLM KV-cache article's "
        "hypothetical two-group plan (MLA + one unsplit SWA group)",
    )
    v4.add_argument(
        "--layout",
        choices=LAYOUT_VERSIONS,
        default=None,
        help="planner version: C (default) is what vLLM 0.32/0.33 run (sliding-window groups "
        "first, one tensor per group and spec run); B is the version the vLLM KV-cache "
        "article describes (MLA group first, one tensor per byte offset)",
    )
    v4.add_argument(
        "--offsets",
        type=int_at_least(-1, "-1 prints all"),
        default=None,
        help="offset rows to print, -1 for all (default: 10)",
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    add_model_arguments(parser)
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
        f"mtp {'on' if plan['mtp'] else 'off'}, block size {plan['block_size']}",
        f"  grouping {plan['grouping']}, planner {plan['layout']}",
        f"{plan['num_cache_layers']} cache layers; approximate gcd d = "
        f"{plan['approximate_gcd']} of the layer tuples per bucket (planner B's buckets)",
        f"  {plan['layer_tuples_per_bucket']}",
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
            f"{g['width_bytes']:>12,}{g['unused_tail_bytes']:>11,}"
            f"{g['padding_bytes']:>11,}{eagle}"
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
    return "\n".join(folded(lines))


def folded(lines: list[str]) -> list[str]:
    """Every line longer than TEXT_WIDTH broken between words, its continuation indented four
    columns deeper than the line itself."""
    out: list[str] = []
    for line in lines:
        if len(line) <= TEXT_WIDTH:
            out.append(line)
        else:
            indent = line[: len(line) - len(line.lstrip())]
            out += _wrapped(line.lstrip(), indent, indent + "    ")
    return out


#: DeepSeek V4's flags (`--model`'s), with their defaults; --config refuses them.
V4_ONLY_DEFAULTS = {
    "model": "deepseek-v4-pro",
    "memory": 10 << 30,
    "cache_dtype": "fp8_ds_mla",
    "indexer": "fp8",
    "mtp": False,
    "num_blocks": None,
    "grouping": "grouped",
    "layout": "C",
    "offsets": 10,
}
#: What --config offers instead of a V4-only flag, where vLLM has one.
CONFIG_EQUIVALENT = {
    "num_blocks": "--num-gpu-blocks-override",
    "memory": "--kv-cache-memory-bytes",
    "cache_dtype": "--kv-cache-dtype",
}


def refuse_v4_flags_with_config(args: argparse.Namespace) -> None:
    """--config takes vllm serve's flags; a DeepSeek V4 flag given with it would be silently
    ignored, so it is an error naming the flag (and vLLM's equivalent, if any)."""
    given = [
        name
        for name, default in V4_ONLY_DEFAULTS.items()
        if getattr(args, name, default) not in (None, False)
    ]
    if given:
        flags = ", ".join(
            "--"
            + name.replace("_", "-")
            + (f" (use {CONFIG_EQUIVALENT[name]})" if name in CONFIG_EQUIVALENT else "")
            for name in given
        )
        raise ValueError(f"--config plans with vllm serve's flags; not with {flags}")


def run_plan(args: argparse.Namespace) -> int:
    try:
        if args.config is not None:
            refuse_v4_flags_with_config(args)
            plan = build_model_plan(args)
            text = None if args.json else format_model_plan(plan)
        else:
            for name, default in V4_ONLY_DEFAULTS.items():
                if getattr(args, name, None) is None:
                    setattr(args, name, default)
            if args.block_size is None:
                args.block_size = V4_BLOCK_SIZE
            plan = build_plan(args)
            text = None if args.json else format_plan(plan, args.offsets)
    except ValueError as exc:
        args.parser_error(with_flag_names(str(exc)))
    try:
        print(
            json.dumps(plan, indent=2) if text is None else text,
            flush=True,
        )
    except BrokenPipeError:  # the reader stopped early (`| head`): quietly drop the rest
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


# --- `--config`: any Hugging Face config.json, the engineer's command

#: `vllm serve`'s default (vLLM 0.32 CacheConfig)
GPU_MEMORY_UTILIZATION = 0.9


def memory_flag(text: str) -> int:
    """argparse type for `--kv-cache-memory-bytes` and `--gpu-memory`: vLLM's syntax first
    (20G = 20 GiB, 20g = 20 GB, a plain byte count), then 20GiB / 20GB / 1.5GiB as `--memory`
    reads them."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?[kKmMgGtT]|\d+", text):
        try:
            value = human_readable_int(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return memory_size(str(value))
    return memory_size(text)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "any model (--config), with vllm serve's flag names, syntax and defaults "
        "(8k = 8,000, 8K = 8,192, 20G = 20 GiB)"
    )
    group.add_argument("--config", help="a local Hugging Face config.json (or its directory)")
    group.add_argument(
        "--kv-cache-memory-bytes",
        type=memory_flag,
        help="the KV cache budget per GPU, exact (e.g. 20G, 20GiB); else --gpu-memory is used",
    )
    group.add_argument(
        "--gpu-memory",
        type=memory_flag,
        help="memory of one GPU (e.g. 80GiB): the budget is then estimated as utilisation x "
        "this, less the weights; it also picks vllm serve's default batched tokens "
        "(from 160 GiB: 16,384; from 70 GiB: 8,192 unless --gpu-name is an A100; else 2,048)",
    )
    group.add_argument(
        "--gpu-name",
        help="the GPU's name as NVML reports it (e.g. 'NVIDIA A100-SXM4-80GB'): vllm serve "
        "gives an A100 the small batch default (default: an 80 GB H100 when neither this nor "
        "--gpu-memory is given)",
    )
    group.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=GPU_MEMORY_UTILIZATION,
        help="share of --gpu-memory vLLM may use",
    )
    group.add_argument(
        "--weights-memory",
        type=memory_flag,
        help="bytes of weights per GPU (default: estimated from the config, quantisation "
        "included)",
    )
    group.add_argument(
        "--max-model-len",
        type=argparse_type(human_readable_int_or_auto, 1, "tokens"),
        help="tokens per request (e.g. 32768, 32K = 32,768, 32k = 32,000); -1 or auto: the "
        "longest that fits the KV budget (default: the config's)",
    )
    group.add_argument(
        "--max-num-batched-tokens",
        type=argparse_type(human_readable_int, 1, "tokens per step"),
        help="tokens scheduled per step (default: vllm serve's for the device: 8,192 on an "
        "H100/H200, 2,048 on an A100 or a GPU under 70 GiB, 16,384 from 160 GiB, 2,048 x TP "
        "on the CPU platform)",
    )
    group.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="two batches in flight: sliding windows reserve twice the batched tokens "
        "(default: on; vLLM's CPU platform always turns it off)",
    )
    group.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="for Mamba hybrids: one state block per attention block ('align') or one per "
        "request",
    )
    group.add_argument(
        "--disable-hybrid-kv-cache-manager",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one group for every layer: sliding-window layers keep every token, as full "
        "attention does (default: the hybrid manager, off)",
    )
    group.add_argument(
        "--num-gpu-blocks-override",
        type=int_at_least(2, "block 0 is the null block, so 1 block leaves none usable"),
        help="use this many blocks instead of filling the budget",
    )
    group.add_argument(
        "--tensor-parallel-size", type=int_at_least(1, "GPUs"), default=1, help="GPUs"
    )
    group.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help="auto (the model dtype), fp8, fp8_e4m3, fp8_e5m2, bfloat16, float16",
    )
    group.add_argument(
        "--backend",
        help="attention backend: flash_attn, flashinfer, triton_attn, flash_attn_mla, "
        "flashmla, triton_mla, cpu_attn (vLLM's CPU platform: its block size, batch default "
        "and scheduling); default: vLLM's Hopper choice for the kv cache dtype (flash_attn, "
        "or flash_attn_mla; flashmla for fp8 MLA caches)",
    )


def group_row(group, blocks_per_request: int) -> dict:
    from refimpl.hybrid.kv_cache_interface import unwrap_spec

    spec = unwrap_spec(group)
    real = sum(group.layer_spec(n).real_page_size_bytes for n in group.layer_names)
    return {
        "kind": type(spec).__name__,
        "block_size": group.block_size,
        "num_layers": len(group.layer_names),
        "page_size_bytes": group.layer_spec(group.layer_names[0]).page_size_bytes,
        "padding_bytes": group.width_bytes - real,
        "sliding_window": getattr(spec, "sliding_window", None),
        "blocks_per_request": blocks_per_request,
        "layer_names": list(group.layer_names),
    }


def model_plan(*argv) -> dict:
    """`plan --config ...`'s data for these flags, in this process (for notebooks and
    figures): `model_plan("--config", path, "--kv-cache-memory-bytes", "20G")`."""
    from refimpl.cli import OneLineErrorParser

    parser = OneLineErrorParser(prog="plan")
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["plan", *(str(a) for a in argv)])
    if args.config is None:
        raise ValueError("model_plan plans a --config")
    refuse_v4_flags_with_config(args)
    return build_model_plan(args)


def derived_max_model_len(cfg) -> int:
    """The length vLLM's ModelConfig derives from the config (with the family's defaults for
    keys the file leaves out, as transformers fills them in)."""
    from refimpl.models.registry import resolve_family

    family = resolve_family(cfg.architecture)
    if hasattr(family, "with_defaults"):
        cfg = family.with_defaults(cfg)
    return cfg.derived_max_model_len()


def build_model_plan(args: argparse.Namespace) -> dict:
    """Everything the --config plan prints, as plain data.

    The settings are resolved in vLLM's order: the model length (`verify_max_model_len`),
    the scheduler's batch and async scheduling (`resolve_scheduler_settings`, for the
    backend's platform and the GPU), the budget, then the plan (`plan_capacity`, which
    auto-fits the length for --max-model-len -1).
    """
    from refimpl.models import HFConfig, get_kv_cache_spec
    from refimpl.models.engine_args import resolve_scheduler_settings, verify_max_model_len
    from refimpl.models.weights import describe_quantization, estimate_weight_bytes

    if not 0 < args.gpu_memory_utilization <= 1:
        raise ValueError(
            f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}"
        )
    cfg = HFConfig.load(args.config)
    requested_len = args.max_model_len
    auto_fit = requested_len == -1
    length_notes: list[str] = []
    if requested_len is not None and not auto_fit:
        _, length_notes = verify_max_model_len(
            requested_len, derived_max_model_len(cfg), cfg.get("model_max_length")
        )
    model = get_kv_cache_spec(
        cfg,
        tensor_parallel_size=args.tensor_parallel_size,
        kv_cache_dtype=args.kv_cache_dtype,
        backend=args.backend,
        block_size=args.block_size,
        max_model_len=None if auto_fit else requested_len,
        enable_prefix_caching=args.enable_prefix_caching,
    )
    max_len = model.max_model_len
    platform = model.backend.platform
    scheduler = resolve_scheduler_settings(
        platform=platform,
        max_model_len=max_len,
        use_mla=model.backend.is_mla,
        tensor_parallel_size=args.tensor_parallel_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        async_scheduling=args.async_scheduling,
        device_memory=getattr(args, "gpu_memory", None),
        device_name=getattr(args, "gpu_name", None),
    )
    batched = scheduler.max_num_batched_tokens
    in_flight = batched * (2 if scheduler.async_scheduling else 1)
    weights, weights_estimated = None, False
    if args.kv_cache_memory_bytes is not None:
        memory, exact = args.kv_cache_memory_bytes, True
    elif args.gpu_memory is not None:
        weights = args.weights_memory
        weights_estimated = weights is None
        if weights is None:
            weights = estimate_weight_bytes(cfg, model.model_dtype, args.tensor_parallel_size)
        memory = int(args.gpu_memory * args.gpu_memory_utilization) - weights
        exact = False
        if memory <= 0:
            raise ValueError(
                f"--gpu-memory x --gpu-memory-utilization leaves nothing for the KV cache "
                f"after {weights:,} B of weights"
            )
    else:
        raise ValueError("give --kv-cache-memory-bytes, or --gpu-memory (and the utilisation)")
    budget_flag = "--kv-cache-memory-bytes" if exact else "--gpu-memory-utilization"
    try:
        capacity = plan_capacity(
            model.specs,
            memory,
            max_len,
            in_flight,
            kv_cache_layout=model.backend.layouts_first,
            auto_fit=auto_fit,
            disable_hybrid_kv_cache_manager=bool(
                getattr(args, "disable_hybrid_kv_cache_manager", None)
            ),
            num_gpu_blocks_override=getattr(args, "num_gpu_blocks_override", None),
        )
    except ValueError as exc:  # vLLM's hint names its utilisation; name the flag used here
        raise ValueError(
            str(exc)
            .replace("gpu_memory_utilization or the KV cache budget", budget_flag)
            .replace("gpu_memory_utilization", budget_flag)
        ) from None
    return {
        "config": cfg.source,
        "architecture": model.architecture,
        "num_cache_layers": len(model.specs),
        "model_dtype": model.model_dtype,
        "kv_cache_dtype": args.kv_cache_dtype,
        "kv_dtype": model.kv_dtype,
        "tensor_parallel_size": args.tensor_parallel_size,
        "backend": model.backend.name,
        "platform": platform,
        "block_size": model.block_size,
        "max_model_len": capacity["max_model_len"],
        "max_model_len_requested": requested_len,
        "derived_max_model_len": max_len,
        "max_num_batched_tokens": batched,
        "async_scheduling": scheduler.async_scheduling,
        "max_in_flight_tokens": in_flight,
        "disable_hybrid_kv_cache_manager": bool(
            getattr(args, "disable_hybrid_kv_cache_manager", None)
        ),
        "num_gpu_blocks_override": getattr(args, "num_gpu_blocks_override", None),
        "available_memory": memory,
        "available_memory_is_estimate": not exact,
        "weights_bytes": weights,
        "weights_is_estimate": weights is not None and weights_estimated,
        "weights_quantization": describe_quantization(cfg),
        **capacity,
        "notes": model.notes + length_notes + scheduler.notes,
    }


def plan_capacity(
    specs: dict,
    memory: int,
    max_model_len: int,
    in_flight: int,
    kv_cache_layout: str | None = None,
    *,
    auto_fit: bool = False,
    disable_hybrid_kv_cache_manager: bool = False,
    num_gpu_blocks_override: int | None = None,
) -> dict:
    """Groups, blocks, and vLLM's two startup figures for `specs` in `memory` bytes
    (`kv_cache_utils.plan_kv_cache`, vLLM 0.32's planner and capacity functions).

    A request at max_model_len holds, in every group, the blocks its spec reserves (all its
    tokens for full attention, the window plus the tokens in flight for a sliding window, two
    or three states for an aligned Mamba layer); the groups draw from one pool, so concurrency
    = blocks / the sum, and the KV cache size in tokens = int(concurrency x max_model_len).
    `in_flight` is max_num_batched_tokens x the batches in flight. `auto_fit` (vLLM's
    `--max-model-len -1`): `max_model_len` is the config's, and the plan takes the longest
    length up to it that fits; the length used is returned as "max_model_len".
    """
    from refimpl.hybrid.kv_cache_utils import plan_kv_cache

    result = plan_kv_cache(
        specs,
        max_model_len=max_model_len,
        max_num_batched_tokens=in_flight,
        async_scheduling=False,
        kv_cache_memory_bytes=memory,
        kv_cache_layout=kv_cache_layout,
        auto_fit=auto_fit,
        disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager,
        num_gpu_blocks_override=num_gpu_blocks_override,
    )
    rows = [
        group_row(g, per_request)
        for g, per_request in zip(result.groups, result.blocks_per_request, strict=True)
    ]
    return {
        "kv_cache_layout": result.kv_cache_layout,
        "max_model_len": result.max_model_len,
        "groups": rows,
        "bytes_per_block": result.bytes_per_block,
        "num_blocks": result.num_blocks,
        "blocks_per_request": sum(result.blocks_per_request),
        "num_padding_layers": result.num_padding_layers,
        "kv_cache_size_tokens": result.num_tokens,
        "max_concurrency": result.max_concurrency,
        "planner_notes": [note.text for note in result.notes],
    }


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def merge_group_notes(notes: list[str]) -> list[str]:
    """The planner's notes with "group i: same text" lines merged into "groups 0, 1: text"."""
    import re

    merged: dict[str, list[str]] = {}
    for note in notes:
        found = re.match(r"group (\d+): (.*)", note)
        key, group = (found.group(2), found.group(1)) if found else (note, None)
        merged.setdefault(key, [])
        if group is not None:
            merged[key].append(group)
    return [
        (f"group{'s' if len(gs) > 1 else ''} {', '.join(gs)}: {text}" if gs else text)
        for text, gs in merged.items()
    ]


def weights_source(plan: dict) -> str:
    """Where the weights figure came from, with the quantisation the estimate counted."""
    if not plan["weights_is_estimate"]:
        return "given"
    quant = plan.get("weights_quantization")
    return "estimated from the config" + (f": {quant}" if quant else "")


def format_model_plan(plan: dict) -> str:
    approx = "~" if plan["available_memory_is_estimate"] else ""
    # the header on short lines: a terminal or a notebook column never wraps them
    lines = [
        f"{plan['architecture']}: {plan['num_cache_layers']} cache layers, "
        f"{plan['model_dtype']} weights",
        f"  config {plan['config']}",
        f"  KV cache {plan['kv_cache_dtype']} ({plan['kv_dtype']}), "
        f"TP {plan['tensor_parallel_size']}, backend {plan['backend']}",
        f"block size {plan['block_size']} tokens; max model len {plan['max_model_len']:,}"
        + (" (auto-fit)" if plan["max_model_len_requested"] == -1 else ""),
        f"{plan['max_in_flight_tokens']:,} tokens in flight "
        f"({plan['max_num_batched_tokens']:,} batched x "
        f"{2 if plan['async_scheduling'] else 1} "
        f"{'(async scheduling)' if plan['async_scheduling'] else 'batch'})",
    ]
    if plan["available_memory_is_estimate"]:
        w = plan["weights_bytes"]
        lines += _wrapped(
            f"KV budget {approx}{plan['available_memory']:,} B "
            f"({_gib(plan['available_memory'])}) = GPU x utilisation - weights {w:,} B "
            f"({weights_source(plan)}); "
            "an ESTIMATE: vLLM also subtracts the activation peak it measures at startup",
            "",
            "  ",
        )
    else:
        lines.append(
            f"KV budget {plan['available_memory']:,} B "
            f"({_gib(plan['available_memory'])}), exact"
        )
    lines += [
        "",
        f"{'group':>5}  {'kind':<22}{'block':>6}{'layers':>7}{'page B':>12}{'padding B':>11}"
        f"{'blocks/request':>16}",
    ]
    for i, g in enumerate(plan["groups"]):
        lines.append(
            f"{i:>5}  {g['kind']:<22}{g['block_size']:>6}{g['num_layers']:>7}"
            f"{g['page_size_bytes']:>12,}{g['padding_bytes']:>11,}"
            f"{g['blocks_per_request']:>16,}"
        )
    if plan.get("disable_hybrid_kv_cache_manager"):
        lines.append(
            "hybrid KV cache manager disabled: one group, every layer keeps every token"
        )
    lines += [
        "",
        f"one block id costs {plan['bytes_per_block']:,} B (the widest group); "
        f"{approx}{plan['num_blocks']:,} blocks",
        f"a request at {plan['max_model_len']:,} tokens holds {plan['blocks_per_request']:,} "
        "blocks (summed over the groups)",
        f"KV cache size: {approx}{plan['kv_cache_size_tokens']:,} tokens",
        f"Maximum concurrency for {plan['max_model_len']:,} tokens per request: "
        f"{approx}{plan['max_concurrency']:.2f}x",
        "",
        "why:",
    ]
    why = list(plan["notes"]) + merge_group_notes(plan["planner_notes"])
    if all(g["kind"] in ("FullAttentionSpec", "MLAAttentionSpec") for g in plan["groups"]):
        why.insert(0, "every layer keeps every token (no windows, no recurrent states)")
    for w in why:
        lines += _wrapped(w, "  - ", "    ")
    return "\n".join(lines)


#: The widest line `plan` prints: a laptop's terminal or notebook column shows it unwrapped.
TEXT_WIDTH = 95


def _wrapped(text: str, first: str, then: str) -> list[str]:
    """`text` in lines of at most TEXT_WIDTH columns, broken between words, the first line
    starting with `first` and the others with `then`."""
    return textwrap.wrap(
        text,
        TEXT_WIDTH,
        initial_indent=first,
        subsequent_indent=then,
        break_long_words=False,
        break_on_hyphens=False,
    )
