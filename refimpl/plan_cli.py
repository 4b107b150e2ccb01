"""`python -m refimpl plan`: print the KV-cache plan vLLM will make, before renting a GPU.

    python -m refimpl plan --config path/to/config.json --max-model-len 32K
    python -m refimpl plan --config config.json --kv-cache-memory-bytes 20G -tp 2 --json
    python -m refimpl plan --config deepseek-v4-pro --kv-cache-memory-bytes 10GiB --layout B
    python -m refimpl plan -- vllm serve ./model-dir --max-model-len 8192 -tp 2

The flags, their syntax and defaults are `vllm serve`'s; any other flag vllm serve takes is
accepted and listed as having no effect on the KV plan. The command only parses and prints:
the settings are resolved once by `refimpl.models.EngineArgs`, planned by
`refimpl.models.plan_model`, and printed from the typed `ModelKVCachePlan` it returns. It
prints what vLLM logs at startup ("KV cache size: N tokens", "Maximum concurrency for L tokens
per request") with the groups, block size, pages and blocks behind them, and why. For a
DeepSeek V4 config (two ship with the package) `--grouping`, `--layout` and `--offsets` add
the views of its packed slab that the chapters use.
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
from refimpl.models.cpu_platform import CPU_ISAS
from refimpl.models.engine_args import (
    GPU_MEMORY_UTILIZATION,
    argparse_type,
    human_readable_int,
    human_readable_int_or_auto,
)
from refimpl.models.serve_flags import ESTIMATE_ONLY, NOT_PLANNED, VLLM_SERVE_FLAGS
from refimpl.plan_summary import summarize_groups

#: Printed lines fit this many columns unless --wide is given.
WIDTH = 100
GROUPINGS = ("grouped", "mla+swa")
LAYOUT_VERSIONS = ("B", "C")
#: vLLM's block ids are int32, so no block count past this can be planned.
MAX_NUM_BLOCKS = (1 << 31) - 1

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
            if "/" in number or "e" in number:
                raise ValueError("not a plain number")
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
    """argparse type: a byte count such as 10GiB, read exactly."""
    try:
        return parse_memory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def memory_flag(text: str) -> int:
    """argparse type for `--kv-cache-memory-bytes` and `--gpu-memory`: vLLM's syntax first
    (20G = 20 GiB, 20g = 20 GB, a plain byte count), then 20GiB / 20GB / 1.5GiB."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?[kKmMgGtT]|\d+", text):
        try:
            value = human_readable_int(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return memory_size(str(value))
    return memory_size(text)


def int_in_range(minimum: int, maximum: int, why: str):
    """argparse type: a plain whole number (digits only: no 1e3, no 1.0, no True) in
    [minimum, maximum], with `why` in the error."""

    def parse(text: str) -> int:
        if not re.fullmatch(r"-?\d+", text.strip()):
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
        value = int(text)
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"must be from {minimum:,} to {maximum:,} ({why}), got {value:,}"
            )
        return value

    return parse


def fraction_of_one(text: str) -> float:
    """argparse type for `--gpu-memory-utilization`: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number in (0, 1], got {text!r}"
        ) from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def json_object(text: str) -> dict:
    """argparse type for `--speculative-config`: a JSON object, as vLLM reads it."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


# --- the command line

#: EngineArgs fields set from this command's own flags (argparse dest -> EngineArgs name).
ENGINE_ARGS = {
    "config": "model",
    "tensor_parallel_size": "tensor_parallel_size",
    "pipeline_parallel_size": "pipeline_parallel_size",
    "decode_context_parallel_size": "decode_context_parallel_size",
    "dtype": "dtype",
    "kv_cache_dtype": "kv_cache_dtype",
    "mamba_ssm_cache_dtype": "mamba_ssm_cache_dtype",
    "mamba_cache_mode": "mamba_cache_mode",
    "block_size": "block_size",
    "max_model_len": "max_model_len",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "max_num_seqs": "max_num_seqs",
    "async_scheduling": "async_scheduling",
    "enable_chunked_prefill": "enable_chunked_prefill",
    "enable_prefix_caching": "enable_prefix_caching",
    "disable_hybrid_kv_cache_manager": "disable_hybrid_kv_cache_manager",
    "num_gpu_blocks_override": "num_gpu_blocks_override",
    "kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "attention_backend": "attention_backend",
    "speculative_config": "speculative_config",
    "cpu_isa": "cpu_isa",
    "gpu_memory": "gpu_memory",
    "gpu_name": "gpu_name",
    "weights_memory": "weights_memory",
}
#: The prefix of the namespace entries of flags that do not change the plan.
_IGNORED = "ignored__"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "plan",
        help="plan a model's KV cache as vLLM will (tokens, concurrency, groups, blocks)",
        description=(
            "Print the KV-cache plan vLLM 0.32 makes for a Hugging Face config.json: groups, "
            "block size, pages, blocks, the KV cache size in tokens and the maximum "
            "concurrency, and why. Flags, short forms, syntax (8k = 8,000, 8K = 8,192, "
            "20G = 20 GiB) and defaults are vllm serve's; its other flags are accepted and "
            "listed as having no effect on the KV plan, or refused by name where they change "
            "it in a way refimpl does not plan yet."
        ),
        usage="%(prog)s --config CONFIG [vllm serve flags]\n"
        "       %(prog)s -- vllm serve MODEL [vllm serve flags]",
        epilog="A pasted serve command works too: plan -- vllm serve ./model-dir [flags]",
        formatter_class=DefaultsHelpFormatter,
    )
    parser.refuse_unknown_options = True  # OneLineErrorParser: suggest the nearest flag
    model = parser.add_argument_group("model and budget")
    model.add_argument(
        "--config",
        "--model",
        help="a local Hugging Face config.json, its directory, or a packaged config "
        "(deepseek-v4-pro, deepseek-v4-flash)",
    )
    model.add_argument(
        "--kv-cache-memory-bytes",
        type=memory_flag,
        metavar="SIZE",
        help="the KV cache budget per GPU, exact (e.g. 20G, 20GiB); else estimated from the "
        "GPU's memory",
    )
    model.add_argument(
        "--gpu-name",
        metavar="NAME",
        help="the GPU planned for, from refimpl.models.gpus (h100, a100-80gb, h200, b200, "
        "l4): its reported memory and vllm serve's batch default for it (default: "
        "NVIDIA H100 80GB HBM3)",
    )
    model.add_argument(
        "--gpu-memory",
        type=memory_flag,
        metavar="SIZE",
        help="the memory of one GPU that is not in the table (e.g. 79.6GiB)",
    )
    model.add_argument(
        "--gpu-memory-utilization",
        type=fraction_of_one,
        metavar="SHARE",
        default=GPU_MEMORY_UTILIZATION,
        help="share of the GPU vLLM may use",
    )
    model.add_argument(
        "--weights-memory",
        type=memory_flag,
        metavar="SIZE",
        help="bytes of weights per GPU (default: estimated from the config, quantisation "
        "included)",
    )
    model.add_argument(
        "--num-gpu-blocks-override",
        type=int_in_range(2, MAX_NUM_BLOCKS, "block 0 is the null block; ids are int32"),
        metavar="N",
        help="use this many blocks instead of filling the budget",
    )
    serve = parser.add_argument_group("vllm serve's settings")
    serve.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=int_in_range(1, 1 << 16, "GPUs"),
        metavar="N",
        default=1,
        help="GPUs one model is split over",
    )
    serve.add_argument(
        "--pipeline-parallel-size",
        "-pp",
        type=int_in_range(1, 1 << 16, "stages"),
        metavar="N",
        default=1,
        help="pipeline stages: each plans its own layers in the whole budget, and all keep "
        "the smallest block count",
    )
    serve.add_argument(
        "--decode-context-parallel-size",
        "-dcp",
        type=int_in_range(1, 1 << 16, "ranks"),
        metavar="N",
        default=1,
        help="decode context parallel ranks (MLA, or GQA with TP above the KV heads): each "
        "holds every Nth token of a request",
    )
    serve.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "half", "float16", "bfloat16", "float", "float32"),
        help="model dtype (auto: the checkpoint's, float32 served as bfloat16)",
    )
    serve.add_argument(
        "--kv-cache-dtype",
        metavar="DTYPE",
        default="auto",
        help="auto (the model dtype), fp8, fp8_e4m3, fp8_e5m2, bfloat16, float16",
    )
    serve.add_argument(
        "--mamba-ssm-cache-dtype",
        default="auto",
        choices=("auto", "float32", "float16", "bfloat16"),
        help="the Mamba SSM state's dtype (auto: the model's, or vLLM's CPU platform's "
        "float32 on AVX512-BF16)",
    )
    serve.add_argument(
        "--mamba-cache-mode",
        choices=("align", "none"),
        help="Mamba hybrids: 'align' (a state block per attention block) or 'none' (one "
        "state per request); vLLM 0.32 sets it from prefix caching whatever is given: "
        "align with prefix caching, none without",
    )
    serve.add_argument(
        "--block-size",
        type=int_in_range(1, 1 << 20, "tokens per block"),
        metavar="TOKENS",
        help="tokens per block (default: vLLM's choice for the backend)",
    )
    serve.add_argument(
        "--max-model-len",
        type=argparse_type(human_readable_int_or_auto, 1, "tokens"),
        metavar="TOKENS",
        help="tokens per request (e.g. 32768, 32K = 32,768, 32k = 32,000); -1 or auto: the "
        "longest that fits the KV budget (default: the config's)",
    )
    serve.add_argument(
        "--max-num-batched-tokens",
        type=argparse_type(human_readable_int, 1, "tokens per step"),
        metavar="TOKENS",
        help="tokens scheduled per step (default: vllm serve's for the device: 8,192 on an "
        "H100/H200, 2,048 on an A100 or under 70 GiB, 16,384 from 160 GiB, 2,048 x ranks "
        "on the CPU platform)",
    )
    serve.add_argument(
        "--max-num-seqs",
        type=argparse_type(human_readable_int, 1, "requests"),
        metavar="N",
        help="requests scheduled at once (default: vllm serve's for the device)",
    )
    for flag, default, text in (
        (
            "--async-scheduling",
            None,
            "two batches in flight: sliding windows reserve twice the batched tokens "
            "(default: on; vLLM's CPU platform turns it off)",
        ),
        (
            "--enable-chunked-prefill",
            None,
            "split long prompts over steps (default: on); off raises the default batch to "
            "the model length",
        ),
        (
            "--enable-prefix-caching",
            None,
            "for Mamba hybrids: one state block per attention block ('align') or one per "
            "request (default: on)",
        ),
        (
            "--disable-hybrid-kv-cache-manager",
            False,
            "one group for every layer: sliding-window layers keep every token",
        ),
    ):
        serve.add_argument(
            flag, action=argparse.BooleanOptionalAction, default=default, help=text
        )
    serve.add_argument(
        "--attention-backend",
        "--backend",
        metavar="NAME",
        help="flash_attn, flashinfer, triton_attn, flash_attn_mla, flashmla, triton_mla, "
        "cpu_attn (vLLM's CPU platform) (default: vLLM's Hopper choice for the cache dtype)",
    )
    serve.add_argument(
        "--speculative-config",
        "-sc",
        type=json_object,
        metavar="JSON",
        help="speculative decoding, as JSON: method mtp (the model's own MTP layers), or "
        'eagle / eagle3 / draft_model with "model": the drafter\'s config path (its layers '
        'are planned with the target\'s), and "num_speculative_tokens"',
    )
    serve.add_argument(
        "--cpu-isa",
        choices=("auto", *CPU_ISAS),
        help="with --attention-backend cpu_attn: the CPU vLLM's CPU platform runs on (its "
        "float32 Mamba states on AVX512-BF16, its AMX MLA kernels) (default: auto, this host)",
    )
    v4 = parser.add_argument_group("DeepSeek V4 configs: views of the packed slab")
    v4.add_argument(
        "--grouping",
        choices=GROUPINGS,
        help="grouped: the real grouping; mla+swa: the vLLM KV-cache article's hypothetical "
        "two-group plan (MLA + one unsplit SWA group)",
    )
    v4.add_argument(
        "--layout",
        choices=LAYOUT_VERSIONS,
        help="planner version: C is what vLLM 0.32/0.33 run (sliding-window groups first, "
        "one tensor per group and spec run); B is the article's (MLA group first, one tensor "
        "per byte offset)",
    )
    v4.add_argument(
        "--offsets",
        type=int_in_range(-1, 1 << 20, "-1 prints all"),
        metavar="ROWS",
        help="byte-offset rows to print, -1 for all (default: 10 when a view is asked)",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print machine-readable JSON")
    out.add_argument("--wide", action="store_true", help=f"lines past {WIDTH} columns")
    add_no_effect_flags(parser)
    parser.set_defaults(func=run_plan, parser_error=parser.error)
    return parser


class _RecordFlag(argparse.Action):
    """Keeps only which spelling of a flag was typed (`--port`, `--no-enable-log-requests`);
    its values are read and dropped."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, option_string)


def add_no_effect_flags(parser: argparse.ArgumentParser) -> None:
    """Every other `vllm serve` flag, hidden from --help: accepted, and listed once as having
    no effect on the KV plan."""
    taken = set(parser._option_string_actions)
    nargs = {"switch": 0, "value": None, "values": "+", "optional": "?"}
    for dest, (options, arity) in VLLM_SERVE_FLAGS.items():
        free = [o for o in options if o not in taken]
        if len(free) != len(options):
            continue  # planned here (or vLLM's --config, a YAML file: refused in a paste)
        parser.add_argument(
            *free,
            action=_RecordFlag,
            nargs=nargs[arity],
            dest=_IGNORED + dest,
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )


def plan_argv(argv: list[str]) -> list[str]:
    """`plan`'s arguments as its parser takes them: a serve command pasted after a lone `--`
    becomes flags (`serve_command_argv`), and every flag is spelt as vLLM's parser reads it
    (`vllm_spelling`). A one-line ValueError when the paste is not a serve command or comes
    with --config too."""
    if "--" not in argv:
        return vllm_spelling(argv)
    at = argv.index("--")
    before, pasted = vllm_spelling(argv[:at]), serve_command_argv(argv[at + 1 :])
    if pasted[:1] == ["--config"] and any(
        a.split("=", 1)[0] in ("--config", "--model") for a in before
    ):
        raise ValueError("give --config or a pasted serve command's model, not both")
    return before + pasted


def vllm_spelling(argv: list[str]) -> list[str]:
    """Flags as vLLM's parser reads them (`FlexibleArgumentParser`): underscores in a flag's
    name are dashes (`--max_model_len`), and `-O3`, `-O=3` or `-O 3` is
    `--optimization-level 3`."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            key, sep, value = arg.partition("=")
            name, dot, rest = key[2:].partition(".")
            out.append(f"--{name.replace('_', '-')}{dot}{rest}{sep}{value}")
        elif arg.startswith("-O") and arg != "-O":
            out += ["--optimization-level", arg[3:] if arg[2:3] == "=" else arg[2:]]
        elif arg == "-O" and argv[i + 1 : i + 2] and argv[i + 1] in ("0", "1", "2", "3"):
            out.append("--optimization-level")
        else:
            out.append(arg)
    return out


def serve_command_argv(words: list[str]) -> list[str]:
    """`vllm serve MODEL [flags]` (pasted after --) as this command's flags."""
    rest = list(words)
    if rest[:2] == ["vllm", "serve"]:
        rest = rest[2:]
    elif rest[:1] == ["serve"]:
        rest = rest[1:]
    else:
        raise ValueError(
            "after -- give a vllm serve command (vllm serve MODEL [flags]), got "
            f"{' '.join(words[:2])!r}"
        )
    if "--config" in rest:
        raise ValueError(
            "vllm serve's --config (a YAML file of flags) is not read; paste the flags instead"
        )
    if rest and not rest[0].startswith("-"):
        rest = ["--config", rest[0], *rest[1:]]
    return vllm_spelling(rest)


def engine_args(args: argparse.Namespace):
    """The typed settings for these flags (`refimpl.models.EngineArgs`); a serve flag that
    changes the plan in a way refimpl does not plan yet is refused by name."""
    from refimpl.models import EngineArgs

    refused = dict(NOT_PLANNED)
    if args.kv_cache_memory_bytes is None:  # the budget is estimated from GPU memory
        refused.update(ESTIMATE_ONLY)
    for name in vars(args):
        dest = name.removeprefix(_IGNORED)
        if name.startswith(_IGNORED) and dest in refused:
            flag = getattr(args, name)
            fix = "" if dest in NOT_PLANNED else " or give --kv-cache-memory-bytes"
            raise ValueError(
                f"{flag} changes the plan ({refused[dest]}) in a way refimpl does not plan "
                f"yet; plan without it{fix}"
            )

    if args.config is None:
        raise ValueError(
            "give --config (a config.json, its directory, or deepseek-v4-pro / "
            "deepseek-v4-flash), or paste a serve command after --"
        )
    return EngineArgs(**{field: getattr(args, dest) for dest, field in ENGINE_ARGS.items()})


def no_effect_flags(args: argparse.Namespace) -> list[str]:
    """The vllm serve flags given that do not change the KV plan, as typed."""
    return sorted(typed for name, typed in vars(args).items() if name.startswith(_IGNORED))


def run_plan(args: argparse.Namespace) -> int:
    from refimpl.hybrid.kv_cache_utils import NotEnoughKVCacheMemoryError
    from refimpl.models import plan_model

    try:
        config = None
        config = engine_args(args).create_engine_config()
        plan = plan_model(config)
        view = v4_view(plan, args) if is_deepseek_v4(plan) else None
        if view is None and any(
            getattr(args, a) is not None for a in ("grouping", "layout", "offsets")
        ):
            raise ValueError(
                "--grouping, --layout and --offsets are views of a DeepSeek V4 plan; "
                f"{plan.config.model.architecture} has none (try --config deepseek-v4-pro)"
            )
    except NotEnoughKVCacheMemoryError as exc:
        splits = config is not None and not config.model.backend.is_mla
        args.parser_error(out_of_memory_message(exc, args, tp_helps=splits))
    except ValueError as exc:
        args.parser_error(str(exc))
    ignored = no_effect_flags(args)
    if args.json:
        data = plan.to_dict()
        data["no_effect_flags"] = ignored
        if view is not None:
            data["deepseek_v4"] = view
        text = json.dumps(data, indent=2)
    else:
        text = format_model_plan(plan, ignored, width=None if args.wide else WIDTH)
        if view is not None:
            offsets = 10 if args.offsets is None else args.offsets
            text += "\n\n" + format_v4_view(view, offsets, width=None if args.wide else WIDTH)
    try:
        print(text, flush=True)
    except BrokenPipeError:  # the reader stopped early (`| head`): quietly drop the rest
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


def out_of_memory_message(exc, args: argparse.Namespace, *, tp_helps: bool) -> str:
    """vLLM's refusal to start, in flags: its figures with separators and what to change
    (`tp_helps`: more tensor-parallel ranks split the KV heads, which an MLA latent is not)."""
    budget = (
        "--kv-cache-memory-bytes"
        if args.kv_cache_memory_bytes is not None
        else "--gpu-memory-utilization"
    )
    if exc.needed_bytes is None:
        return (
            "the budget leaves no memory for KV cache blocks "
            f"({exc.available_bytes:,} B after the null block); raise {budget}"
            + (" or --tensor-parallel-size" if tp_helps else "")
        )
    longest = exc.estimated_max_model_len
    fits = (
        f"; the longest --max-model-len that fits is {longest:,}"
        if longest
        else "; no --max-model-len fits"
    )
    split = (
        ", or split the KV heads with --tensor-parallel-size "
        f"(now {args.tensor_parallel_size})"
        if tp_helps
        else ""
    )
    return (
        f"one request at --max-model-len {exc.max_model_len:,} needs "
        f"{exc.needed_bytes / (1 << 30):,.2f} GiB of KV cache, more than the "
        f"{exc.available_bytes / (1 << 30):,.2f} GiB available{fits}. Raise {budget} or "
        f"lower --max-model-len{split}"
    )


# --- printing


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.2f} GiB"


def merge_group_notes(notes: list[str]) -> list[str]:
    """The planner's notes with "group i: same text" lines merged into "groups 0, 1: text"."""
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


def _bullets(items: list[str], width: int | None) -> list[str]:
    if width is None:
        return [f"  - {item}" for item in items]
    lines = []
    for item in items:
        lines += textwrap.wrap(
            item,
            width,
            initial_indent="  - ",
            subsequent_indent="    ",
            break_on_hyphens=False,
        )
    return lines


def _wrap(text: str, width: int | None) -> list[str]:
    if width is None:
        return [text]
    return textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False)


def budget_lines(plan, width: int | None) -> list[str]:
    """Where the budget came from; for an estimate, the range and the flag that pins it."""
    b = plan.config.budget
    if not b.is_estimate:
        exact = b.kv_cache_memory_bytes
        return [f"KV budget {exact:,} B ({_gib(exact)}), exact"]
    a, top = b.allowance, plan.no_overhead
    quant = f": {b.weights_quantization}" if b.weights_quantization else ""
    weights = "given" if not b.weights_is_estimate else f"estimated from the config{quant}"
    gpu = f"{b.gpu_name} " if b.gpu_name else ""
    lines = _wrap(
        f"KV budget ESTIMATED from {gpu}{_gib(b.gpu_memory)} x {b.gpu_memory_utilization} - "
        f"weights {_gib(b.weights_bytes)} ({weights})",
        width,
    )
    lines += _wrap(
        f"  no overhead: {_gib(top.available_memory)} -> ~{top.num_tokens:,} tokens, "
        f"~{top.max_concurrency:,.2f}x (an estimate: vLLM always takes more)",
        width,
    )
    lines += _wrap(
        f"  with an allowance of {_gib(a.total)} (activations {_gib(a.activation_bytes)} at "
        f"{plan.config.scheduler.max_num_batched_tokens:,} batched tokens, sampler logits "
        f"{_gib(a.logits_bytes)}, CUDA graphs {_gib(a.cudagraph_bytes)}): "
        f"{_gib(plan.kv.available_memory)} -> ~{plan.num_tokens:,} tokens, "
        f"~{plan.max_concurrency:,.2f}x (an estimate; planned below)",
        width,
    )
    lines += _wrap(
        f"  to get exactly the plan below, serve with --kv-cache-memory-bytes "
        f"{plan.kv.available_memory}",
        width,
    )
    return lines


def format_model_plan(plan, no_effect: list[str] = (), width: int | None = WIDTH) -> str:
    """The plan as text, lines within `width` columns (None: no limit)."""
    c, m, s = plan.config, plan.config.model, plan.config.scheduler
    args = c.engine_args
    approx = "~" if c.budget.is_estimate else ""
    name = c.hf_config.source
    lines = _wrap(f"{m.architecture} ({name})", width)
    lines += _wrap(
        f"{len(m.specs)} cache layers, {m.model_dtype} weights, KV cache "
        f"{args.kv_cache_dtype} ({m.kv_dtype}), TP {m.tensor_parallel_size}, "
        f"backend {m.backend.name}",
        width,
    )
    in_flight = plan.kv.max_in_flight_tokens
    lines.append(
        f"block size {m.block_size} tokens; max model len {plan.max_model_len:,}"
        + (" (auto-fit)" if c.auto_fit else "")
    )
    lines.append(
        f"{in_flight:,} tokens in flight ({s.max_num_batched_tokens:,} batched x "
        + ("2 (async scheduling))" if s.async_scheduling else "1 batch)")
    )
    lines += budget_lines(plan, width)
    lines += [
        "",
        f"{'group':>5}  {'kind':<22}{'block':>6}{'layers':>7}{'page B':>12}{'padding B':>11}"
        f"{'blocks/request':>16}",
    ]
    for i, g in enumerate(plan.groups):
        lines.append(
            f"{i:>5}  {g.kind:<22}{g.block_size:>6}{g.num_layers:>7}"
            f"{g.page_size_bytes:>12,}{g.padding_bytes:>11,}{g.blocks_per_request:>16,}"
        )
    if args.disable_hybrid_kv_cache_manager:
        lines.append(
            "hybrid KV cache manager disabled: one group, every layer keeps every token"
        )
    lines += [
        "",
        f"one block id costs {plan.kv.bytes_per_block:,} B (the widest group); "
        f"{approx}{plan.num_blocks:,} blocks",
        f"a request at {plan.max_model_len:,} tokens holds {plan.blocks_per_request:,} "
        "blocks (summed over the groups)",
        f"KV cache size: {approx}{plan.num_tokens:,} tokens",
        f"Maximum concurrency for {plan.max_model_len:,} tokens per request: "
        f"{approx}{plan.max_concurrency:.2f}x",
        "",
        "why:",
    ]
    why = list(m.notes) + list(c.notes) + list(s.notes)
    why += merge_group_notes([n.text for n in plan.kv.notes])
    if all(g.kind in ("FullAttentionSpec", "MLAAttentionSpec") for g in plan.groups):
        why.insert(0, "every layer keeps every token (no windows, no recurrent states)")
    lines += _bullets(why, width)
    if no_effect:
        lines += ["", *_wrap("no effect on the KV plan: " + ", ".join(no_effect), width)]
    return "\n".join(lines)


# --- DeepSeek V4: the packed slab's views


def is_deepseek_v4(plan) -> bool:
    return plan.config.hf_config.text_model_type == "deepseek_v4"


def v4_view(plan, args: argparse.Namespace) -> dict:
    """Grouping, layer tuples, block stride and byte offsets of a DeepSeek V4 plan, by planner
    C (vLLM's) or B (the article's), with the real grouping or the article's two groups."""
    from refimpl.hybrid import older_planners
    from refimpl.hybrid.kv_cache_planning import (
        approximate_gcd,
        get_kv_cache_bytes_per_block,
        get_kv_cache_config,
        get_kv_cache_groups,
    )

    specs = plan.config.model.specs
    grouping, layout = args.grouping or "grouped", args.layout or "C"
    planner_b = layout == "B"
    if grouping == "grouped":
        groups = (older_planners.get_kv_cache_groups_b if planner_b else get_kv_cache_groups)(
            specs, use_eagle=plan.config.use_eagle
        )
    else:
        groups = older_planners.two_group_layout(specs)
    stride = (older_planners.bytes_per_block_b if planner_b else get_kv_cache_bytes_per_block)(
        groups
    )
    memory = plan.kv.available_memory
    if memory < 2 * stride:
        raise ValueError(
            f"the budget {memory:,} B leaves no usable block in this view: one block takes "
            f"{stride:,} B and block 0 is the null block; raise --kv-cache-memory-bytes to at "
            f"least {2 * stride:,}"
        )
    config = (older_planners.get_kv_cache_config_b if planner_b else get_kv_cache_config)(
        groups, memory, num_blocks_override=plan.config.engine_args.num_gpu_blocks_override
    )
    tuples = [
        b.get_num_layer_tuples() for b in older_planners.group_and_unify_kv_cache_specs(specs)
    ]
    return {
        "grouping": grouping,
        "layout": layout,
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
            for row in summarize_groups(groups)
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


def format_v4_view(view: dict, max_offsets: int = 10, width: int | None = WIDTH) -> str:
    lines = _wrap(
        f"DeepSeek V4 slab, grouping {view['grouping']}, planner {view['layout']}: "
        f"{view['num_cache_layers']} cache layers; layer tuples per bucket "
        f"{view['layer_tuples_per_bucket']}, approximate gcd d = {view['approximate_gcd']}",
        width,
    )
    planned = sum(g["num_layers"] for g in view["groups"])
    if planned != view["num_cache_layers"]:
        lines += _wrap(
            f"this layout plans {planned} of them; "
            f"{view['num_cache_layers'] - planned} caches (the compressor states) are left "
            "out, as in the article's example",
            width,
        )
    lines += [
        "",
        f"{'group':>5}  {'kind':<17}{'block':>6}{'layers':>8}{'width B':>12}"
        f"{'unused B':>11}{'padding B':>11}",
    ]
    for g in view["groups"]:
        eagle = "  (eagle)" if g["is_eagle_group"] else ""
        lines.append(
            f"{g['index']:>5}  {g['kind']:<17}{g['block_size']:>6}{g['num_layers']:>8}"
            f"{g['width_bytes']:>12,}{g['unused_tail_bytes']:>11,}"
            f"{g['padding_bytes']:>11,}{eagle}"
        )
    lines += [
        "",
        f"block stride: {view['block_stride']:,} B (the widest group)",
        *_wrap(
            f"memory {view['available_memory']:,} B -> {view['num_blocks']:,} blocks "
            f"({view['num_usable_blocks']:,} usable; block 0 is the null block), slab "
            f"{view['slab_bytes']:,} B",
            width,
        ),
        f"{len(view['offsets'])} distinct byte offsets in a block:"
        if view["layout"] == "B"
        else f"{len(view['offsets'])} tensors (one per group and spec run; "
        "layer i of a run starts at offset + i x layer stride):",
    ]
    shown = view["offsets"] if max_offsets < 0 else view["offsets"][:max_offsets]
    for row in shown:
        names = row["shared_by"]
        if row["layer_stride"] is None:
            text = f"{row['offset']:>10,}  {', '.join(names)}"
        else:
            listed = (
                ", ".join(names)
                if len(names) <= 3
                else f"{names[0]}, {names[1]}, ... {names[-1]}"
            )
            text = f"{row['offset']:>10,}  {len(names)} x {row['layer_stride']:,} B: {listed}"
        if width is None:
            lines.append("  " + text)
        else:
            lines += textwrap.wrap(
                text, width, initial_indent="  ", subsequent_indent=" " * 14
            )
    if len(shown) < len(view["offsets"]):
        lines.append(
            f"  ... {len(view['offsets']) - len(shown)} more (--offsets -1 prints all)"
        )
    return "\n".join(lines)
