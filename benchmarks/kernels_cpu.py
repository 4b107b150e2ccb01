"""Benchmark: refimpl's Triton kernels in Triton's CPU interpreter next to their torch twins.

    python benchmarks/kernels_cpu.py [--repeats N]

Chapters 07 and 11 run these same calls and print only the conclusion (the interpreter is much
slower), because elapsed times change from run to run and committed notebook outputs must not.
This script prints the times themselves: best of N calls, in milliseconds, on the chapters'
shapes. Interpreted times say nothing about a GPU; `benchmarks/kernels_gpu.py` measures that.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from refimpl.kernels import deepseek_v4 as triton_v4
from refimpl.kernels import (
    paged_decode_attention,
    reference,
    reference_v4,
    store_kvcache,
    triton_setup,
)


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    """Fastest of `repeats` calls in milliseconds (the one least disturbed by other load)."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times) * 1e3


def chapter_inputs(device: str = "cpu") -> dict[str, tuple]:
    """The arguments chapters 07 and 11 time (a 2-sequence paged decode and a 5-token SWA
    batch), on `device`."""
    with torch.device("cpu"):  # drawn on the CPU: the same numbers on every machine
        inputs = _chapter_inputs()
    return {
        name: (
            kernel,
            twin,
            tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args),
        )
        for name, (kernel, twin, args) in inputs.items()
    }


def _chapter_inputs() -> dict[str, tuple]:
    torch.manual_seed(0)
    num_blocks, block_size, num_kv_heads, num_heads, head_dim = 8, 4, 2, 4, 8
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim)
    block_table = torch.tensor([[5, 2, 7], [1, 3, -1]], dtype=torch.int32)
    cache_seqlens = torch.tensor([10, 6], dtype=torch.int32)
    q = torch.randn(2, num_heads, head_dim)
    key = torch.randn(17, num_kv_heads, head_dim)
    slot_mapping = torch.arange(17)
    swa = (
        # query_start_loc: request 0 has 3 new tokens, request 1 one
        torch.tensor([0, 3, 4], dtype=torch.int32),
        torch.tensor([10, 7], dtype=torch.int32),  # seq_lens after this step
        torch.tensor([0, 0, 0, 1, 0], dtype=torch.int32),  # token_to_req_indices
        torch.tensor([True] * 4 + [False]),  # is_valid_token: the last row is padding
        torch.tensor([[5, 6, 7], [8, 9, 0]], dtype=torch.int32),  # block_table
        4,  # block_size
        6,  # window_size
    )
    return {
        "store_kvcache, 17 tokens": (
            store_kvcache,
            reference.store_kvcache,
            (key, key, k_cache.clone(), v_cache.clone(), slot_mapping),
        ),
        "paged_decode_attention, 2 sequences": (
            paged_decode_attention,
            reference.paged_decode_attention,
            (q, k_cache, v_cache, cache_seqlens, block_table),
        ),
        "compute_swa_indices_and_lens, 5 tokens": (
            triton_v4.compute_swa_indices_and_lens,
            reference_v4.compute_swa_indices_and_lens,
            swa,
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="calls timed per kernel; the best is shown (default: 5)",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    device = triton_setup.TRITON_DEVICE
    if device is None:
        print(
            "The Triton kernels cannot run here (Triton is not installed, or compiled mode "
            "without CUDA); "
            "nothing to time."
        )
        return 0
    mode = "interpreter" if triton_setup.INTERPRET else "compiled (GPU)"
    print(
        f"Triton {mode} vs torch twin on {device} tensors, best of {args.repeats} calls, "
        "milliseconds"
    )
    print(f"{'kernel':40s} {'Triton':>9s} {'twin':>9s} {'ratio':>7s}")
    for name, (kernel, twin, kernel_args) in chapter_inputs(device).items():
        # warm-up: first calls pay for lazy initialisation
        kernel(*kernel_args), twin(*kernel_args)
        t_kernel = best_ms(lambda: kernel(*kernel_args), args.repeats)
        t_twin = best_ms(lambda: twin(*kernel_args), args.repeats)
        print(f"{name:40s} {t_kernel:9.2f} {t_twin:9.3f} {t_kernel / t_twin:6.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
