"""The memory common GPUs really report, for `plan --gpu-name` (a small data table).

A card sold as "80 GB" does not give vLLM 80 GiB: vLLM's worker reads the total that the CUDA
driver reports (`cudaMemGetInfo`, what `torch.cuda.mem_get_info()` returns, the same figure
`nvidia-smi` prints in MiB), and the driver keeps some memory for itself. `--gpu-memory`
overrides the table for a card that is not in it.

Sources: the totals are those recorded for these devices in
`tools/crosscheck/vllm_serve_defaults.py` (`GPUS`), where vLLM's own `get_batch_defaults` is
asked about each; in MiB, as `nvidia-smi` prints them: H100 80GB HBM3 81,559 MiB,
A100-SXM4-80GB 81,153 MiB, H200 143,157 MiB, B200 182,642 MiB, L4 22,488 MiB.

`peak_flops` (dense BF16 tensor-core FLOP/s, no sparsity) and `memory_bandwidth` (bytes/s)
are the vendors' datasheet figures; only `simulate`'s step-time estimate reads them
(`refimpl.sched.clock.RooflineStepTime`): H100 SXM 989 TFLOP/s and 3.35 TB/s, A100 80GB SXM
312 TFLOP/s and 2.04 TB/s, H200 989 TFLOP/s and 4.8 TB/s, B200 2.25 PFLOP/s and 8 TB/s,
L4 121 TFLOP/s and 300 GB/s.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class GPUInfo:
    """One GPU model: the name the driver reports and its total memory in bytes."""

    name: str
    total_memory: int
    aliases: tuple[str, ...] = ()
    peak_flops: float | None = None  # dense BF16, FLOP/s (datasheet)
    memory_bandwidth: float | None = None  # bytes/s (datasheet)


GPUS: tuple[GPUInfo, ...] = (
    GPUInfo(
        "NVIDIA H100 80GB HBM3",
        85_520_809_984,
        ("h100", "h100-80gb", "h100-sxm"),
        989e12,
        3.35e12,
    ),
    GPUInfo(
        "NVIDIA A100-SXM4-80GB",
        85_094_891_520,
        ("a100", "a100-80gb", "a100-sxm4-80gb"),
        312e12,
        2.039e12,
    ),
    GPUInfo("NVIDIA H200", 150_110_011_392, ("h200",), 989e12, 4.8e12),
    GPUInfo("NVIDIA B200", 191_514_607_616, ("b200",), 2250e12, 8e12),
    GPUInfo("NVIDIA L4", 23_580_639_232, ("l4",), 121e12, 300e9),
)
#: The GPU `plan` assumes when no memory flag is given (what `--help` names).
DEFAULT_GPU = GPUS[0]


def _key(text: str) -> str:
    return text.strip().lower().replace("_", "-").replace(" ", "-")


def find_gpu(name: str) -> GPUInfo:
    """The table's entry for `name` (the driver's name or a short one: "h100", "a100-80gb",
    any case); a one-line ValueError naming the nearest entry when there is none."""
    wanted = _key(name)
    for gpu in GPUS:
        if wanted in (_key(gpu.name), *gpu.aliases):
            return gpu
    names = [alias for gpu in GPUS for alias in (_key(gpu.name), *gpu.aliases)]
    near = difflib.get_close_matches(wanted, names, n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    known = ", ".join(gpu.aliases[0] for gpu in GPUS)
    raise ValueError(
        f"unknown GPU {name!r}; {hint}known: {known} (or give its memory with --gpu-memory)"
    )


# --- what vLLM takes from the GPU besides the weights, as a stated allowance

#: The largest batch vLLM captures a CUDA graph for on Hopper and earlier (its
#: `max_cudagraph_capture_size` default is min(2 x max_num_seqs, 512)).
MAX_CUDAGRAPH_CAPTURE_SIZE = 512


@dataclass(frozen=True)
class OverheadAllowance:
    """An allowance for what vLLM's startup profiling subtracts before the KV cache: the
    activation peak of its dummy forward pass (one layer's intermediates at
    max_num_batched_tokens, and the sampler's float32 logits for max_num_seqs requests) and
    the memory of its CUDA graphs (taken as the activations of the largest captured batch).
    An estimate from the config's sizes, not a measurement."""

    activation_bytes: int
    logits_bytes: int
    cudagraph_bytes: int

    @property
    def total(self) -> int:
        return self.activation_bytes + self.logits_bytes + self.cudagraph_bytes


def _activation_bytes_per_token(cfg, dtype_size: int, tensor_parallel_size: int) -> int:
    """One layer's live intermediates for one token: four hidden-state copies (residual,
    normed input, attention and MLP outputs), the q/k/v projections and the MLP's gate, up
    and activated rows (the routed experts' for a MoE layer), split over the TP ranks."""
    get = cfg.get
    hidden = int(get("hidden_size") or 0)
    heads = int(get("num_attention_heads") or 1)
    kv_heads = int(get("num_key_value_heads") or heads)
    head_dim = int(get("head_dim") or (hidden // heads if heads else 0))
    if get("num_experts_per_tok") and get("moe_intermediate_size"):
        mlp = int(get("moe_intermediate_size")) * int(get("num_experts_per_tok"))
    else:
        mlp = int(get("intermediate_size") or 4 * hidden)
    sharded = ((heads + 2 * kv_heads) * head_dim + 3 * mlp) // tensor_parallel_size
    return (4 * hidden + sharded) * dtype_size


def estimate_overhead(
    cfg,
    *,
    dtype_size: int,
    tensor_parallel_size: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
) -> OverheadAllowance:
    """The allowance for activations and CUDA graphs (see `OverheadAllowance`)."""
    per_token = _activation_bytes_per_token(cfg, dtype_size, tensor_parallel_size)
    vocab = int(cfg.get("vocab_size") or 0)
    captured = min(2 * max_num_seqs, MAX_CUDAGRAPH_CAPTURE_SIZE)
    return OverheadAllowance(
        activation_bytes=per_token * max_num_batched_tokens,
        logits_bytes=2 * 4 * vocab * min(max_num_seqs, max_num_batched_tokens),
        cudagraph_bytes=per_token * captured,
    )
