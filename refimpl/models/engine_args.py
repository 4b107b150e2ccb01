"""The `vllm serve` settings a KV cache plan depends on, resolved as vLLM 0.32 resolves them.

vLLM fills what the user leaves out in three places, in this order: `EngineArgs` picks the
batch defaults for the device (`get_batch_defaults`,
`_set_default_max_num_seqs_and_batched_tokens_args`), `VllmConfig` turns async scheduling on
unless something forbids it, and then the platform's `check_and_update_config` has the last
word: vLLM's CPU platform switches async scheduling off, and for an MLA model (without AMX
tiles) also chunked prefill, raising the batched tokens to at least the model length.
`ModelConfig` refuses a `--max-model-len` above what the config allows
(`_get_and_verify_max_len`). The flag syntax is vLLM's (`human_readable_int`).
`tests/data/vllm_serve_defaults_oracle.json` holds what vLLM's own code answers for these.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field

GIB = 1 << 30
#: `SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS`: what the CPU MLA path raises from.
SCHEDULER_DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
#: The GPU `plan` assumes when neither --gpu-memory nor --gpu-name says otherwise: an
#: 80 GB H100 (what vLLM would read from NVML there, as --gpu-memory would give it).
ASSUMED_GPU_MEMORY = 80 * GIB
ASSUMED_GPU_NAME = "NVIDIA H100 80GB HBM3"
#: The environment variable vLLM reads to allow a --max-model-len above the config's.
ALLOW_LONG_MAX_MODEL_LEN = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


# --- flag syntax (vLLM's argparse_utils)


def human_readable_int(value: str) -> int:
    """vLLM's integer flags: '8k' = 8,000 and '8K' = 8,192 (lower case decimal, upper case
    binary), '25.6k' = 25,600 (a decimal number only with a decimal suffix), else a plain
    integer."""
    value = value.strip()
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if found:
        number, suffix = found.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        if "." in number:
            raise ValueError(
                f"decimals are not allowed with binary suffixes like {suffix}; did you mean "
                f"{number}{suffix.lower()}?"
            )
        return int(number) * _BINARY[suffix]
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"expected a whole number such as 8192, 8k (8,000) or 8K (8,192), got {value!r}"
        ) from None


def human_readable_int_or_auto(value: str) -> int:
    """`--max-model-len`: as `human_readable_int`, and '-1' or 'auto' give -1 (fit the
    longest length the KV cache budget holds)."""
    value = value.strip()
    if value == "-1" or value.lower() == "auto":
        return -1
    return human_readable_int(value)


def argparse_type(parse, minimum: int, what: str):
    """An argparse type from `human_readable_int` or `human_readable_int_or_auto`, with a
    lower bound (-1 passes where 'auto' is meant)."""

    def parse_flag(text: str) -> int:
        try:
            value = parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if value == -1 and parse is human_readable_int_or_auto:
            return value
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"must be at least {minimum} ({what}), got {value}"
            )
        return value

    return parse_flag


# --- batch defaults (EngineArgs.get_batch_defaults, for `vllm serve`)


def get_batch_defaults(
    world_size: int, *, platform: str, device_memory: int, device_name: str
) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) `vllm serve` starts from on this device.

    CUDA: 16,384 / 1,024 from 160 GiB of device memory (B200, B300); 8,192 / 1,024 from
    70 GiB unless the device is an A100 (H100, H200); else 2,048 / 256. The CPU platform:
    2,048 / 128 per rank (x world size).
    """
    if platform == "cpu":
        return 2048 * world_size, 128 * world_size
    if device_memory >= 160 * GIB:
        return 16384, 1024
    if device_memory >= 70 * GIB and "a100" not in device_name.lower():
        return 8192, 1024
    return 2048, 256


@dataclass
class SchedulerSettings:
    """What the scheduler runs with, and why (`notes`, for the plan's "why" list)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    async_scheduling: bool
    enable_chunked_prefill: bool
    notes: list[str] = field(default_factory=list)


def resolve_scheduler_settings(
    *,
    platform: str,
    max_model_len: int,
    use_mla: bool,
    tensor_parallel_size: int = 1,
    max_num_batched_tokens: int | None = None,
    async_scheduling: bool | None = None,
    device_memory: int | None = None,
    device_name: str | None = None,
) -> SchedulerSettings:
    """The scheduler settings `vllm serve` ends with: the user's values, else the device's
    defaults (`_set_default_max_num_seqs_and_batched_tokens_args`), then what the platform
    forces (`CpuPlatform.check_and_update_config`). `max_model_len` is the length the
    ModelConfig settled (the derived one when the user asked for auto-fit)."""
    notes: list[str] = []
    memory = ASSUMED_GPU_MEMORY if device_memory is None else device_memory
    name = ASSUMED_GPU_NAME if device_name is None else device_name
    batched, seqs = get_batch_defaults(
        tensor_parallel_size, platform=platform, device_memory=memory, device_name=name
    )
    chunked_prefill = True  # every generative decoder model supports it
    if max_num_batched_tokens is None:
        # vLLM caps a default at max_num_seqs x max_model_len (a tiny context gets less)
        batched = min(seqs * max_model_len, batched)
        if platform == "cpu":
            why = f"vLLM's CPU platform (2,048 per rank x TP {tensor_parallel_size})"
        elif device_memory is None and device_name is None:
            why = "an H100/H200 (from 70 GiB of GPU memory, not an A100)"
        else:
            why = f"a GPU of {memory / GIB:.0f} GiB" + (f" ({name})" if device_name else "")
        notes.append(f"--max-num-batched-tokens {batched:,}: vllm serve's default on {why}")
    else:
        batched = max_num_batched_tokens
    seqs = min(seqs, batched)
    asynchronous = True if async_scheduling is None else async_scheduling
    if platform == "cpu":
        if async_scheduling is not False:
            notes.append(
                "vLLM's CPU platform turns async scheduling off (one batch in flight)"
            )
        asynchronous = False
        if use_mla:
            chunked_prefill = False
            raised = max(max_model_len, SCHEDULER_DEFAULT_MAX_NUM_BATCHED_TOKENS)
            if raised != batched:
                notes.append(
                    f"MLA on vLLM's CPU platform disables chunked prefill and sets "
                    f"--max-num-batched-tokens to max(max model len, 2,048) = {raised:,}"
                )
            batched = raised
    return SchedulerSettings(batched, seqs, asynchronous, chunked_prefill, notes)


# --- the model length (ModelConfig's _get_and_verify_max_len)


def allow_long_max_model_len() -> bool:
    """vLLM's `VLLM_ALLOW_LONG_MAX_MODEL_LEN`: "1" or "true" (any case) allows it."""
    return os.environ.get(ALLOW_LONG_MAX_MODEL_LEN, "0").strip().lower() in ("1", "true")


def verify_max_model_len(
    max_model_len: int | None, derived: int, model_max_length: int | None = None
) -> tuple[int, list[str]]:
    """The length vLLM's ModelConfig settles on: the config's (`derived`) when none or -1 is
    given, the user's when it is no longer; a longer one is refused unless the config's
    `model_max_length` allows it or VLLM_ALLOW_LONG_MAX_MODEL_LEN is set."""
    if max_model_len is None or max_model_len == -1:
        return derived, []
    if max_model_len > derived and (
        model_max_length is None or max_model_len > model_max_length
    ):
        if not allow_long_max_model_len():
            raise ValueError(
                f"--max-model-len {max_model_len:,} is greater than the length the config "
                f"allows ({derived:,}); vLLM refuses it unless the environment variable "
                f"{ALLOW_LONG_MAX_MODEL_LEN}=1 is set (positions past the trained length "
                "give NaNs with RoPE, or out-of-bounds reads with absolute positions)"
            )
        return max_model_len, [
            f"--max-model-len {max_model_len:,} exceeds the config's {derived:,}, allowed by "
            f"{ALLOW_LONG_MAX_MODEL_LEN}"
        ]
    return max_model_len, []
