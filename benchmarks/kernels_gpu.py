"""GPU check for refimpl's Triton kernels: correctness against the torch twins, then speed.

Run on a machine with a CUDA device:  python benchmarks/kernels_gpu.py
It (1) runs every kernel compiled and compares it with its pure-torch twin on realistic
shapes in fp16, bf16 and fp32 (paged decode with one chunk, split automatically and into 4
chunks), (2) measures store_kvcache's bandwidth as a fraction of a plain device-to-device copy
of the same bytes, and (3) times paged decode attention, with one chunk per (sequence, KV head)
and split into chunks (flash-decoding), against torch's scaled_dot_product_attention on the
same K/V already gathered into contiguous tensors (the work a paged kernel saves the caller),
on the shapes of the H200 measurements in the course, and sweeps the number of chunks.
It records the decode timings in ``benchmarks/results/kernels_gpu.json`` and draws
``figures/07_split_kv_gpu.png``, which chapter 07 shows. Takes well under 3 minutes.

Without CUDA it says so and exits with status 0. ``--smoke`` runs the same code on tiny shapes
wherever the kernels run (Triton's interpreter on a CPU), only to show the script itself works
(timings meaningless, nothing recorded unless ``--json`` / ``--figure`` name a file).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "results" / "kernels_gpu.json"
FIGURE = ROOT / "figures" / "07_split_kv_gpu.png"
DEVICE = "cuda"
SMALL = False  # tiny shapes for --smoke
#: The decode shapes of the H200 measurements the course quotes: (batch, context).
DECODE_SHAPES = ((32, 2048), (64, 512), (4, 8192))
SWEEP = (1, 2, 4, 8, 16, 32)


def cuda_time_ms(fn, warmup: int = 5, repeats: int = 30) -> float:
    """Median time of ``fn()`` in milliseconds, measured with CUDA events (wall clock
    elsewhere)."""
    if DEVICE != "cuda":  # a smoke run: the timings mean nothing, one run each is enough
        warmup, repeats = 0, 1
    for _ in range(warmup):
        fn()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        if DEVICE != "cuda":
            started = time.perf_counter()
            fn()
            times.append((time.perf_counter() - started) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def paged_case(seq_lens, block_size, num_kv_heads, head_dim, dtype, seed=0):
    """Random K/V for the given contexts in shuffled blocks: (k_cache, v_cache, block_table,
    seqlens).

    Drawn on the CPU (the same numbers on every machine), then moved to ``DEVICE``.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(blocks) + 4
    order = torch.randperm(num_blocks, generator=gen, device="cpu")
    block_table = torch.full((len(seq_lens), max(blocks)), -1, dtype=torch.int32, device="cpu")
    used = 0
    for b, n in enumerate(blocks):
        block_table[b, :n] = order[used : used + n]
        used += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen, device="cpu").to(dtype).to(DEVICE)
    v_cache = torch.randn(shape, generator=gen, device="cpu").to(dtype).to(DEVICE)
    return (
        k_cache,
        v_cache,
        block_table.to(DEVICE),
        torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
    )


def randn(gen, *shape, dtype):
    return torch.randn(*shape, generator=gen, device="cpu").to(dtype).to(DEVICE)


# max |difference|, outputs of size ~1
TOLERANCE = {torch.float32: 1e-4, torch.float16: 6e-3, torch.bfloat16: 4e-2}


def check_correctness() -> bool:
    from refimpl import kernels
    from refimpl.kernels import reference
    from refimpl.kernels.triton_setup import INTERPRET

    ok = True
    mode = "interpreted" if INTERPRET else "compiled"
    print(f"== correctness: Triton ({mode}) against the torch twin, max |difference|")
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        configs = (
            ((16, 128, 4), (7, 64, 1), (256, 128, 8), (32, 96, 2))
            if not SMALL
            else ((3, 12, 2),)
        )
        for block_size, head_dim, group in configs:
            seq_lens, q_lens = (
                ([1, 513, 260, 1024], [1, 513, 17, 128])
                if not SMALL
                else ([1, 9, 20], [1, 9, 3])
            )
            k_cache, v_cache, block_table, seqlens = paged_case(
                seq_lens, block_size, 2, head_dim, dtype
            )
            gen = torch.Generator().manual_seed(1)
            q = randn(gen, sum(q_lens), 2 * group, head_dim, dtype=dtype)
            cu_q = torch.tensor(
                [0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=DEVICE
            )
            cu_k = torch.tensor(
                [0, *itertools.accumulate(seq_lens)], dtype=torch.int32, device=DEVICE
            )
            args = (q, k_cache, v_cache, cu_q, cu_k, max(q_lens), max(seq_lens), block_table)
            prefill = (
                (
                    kernels.paged_prefill_attention(*args).float()
                    - reference.paged_prefill_attention(*args).float()
                )
                .abs()
                .max()
                .item()
            )
            dq = q[: len(seq_lens)].contiguous()
            want = reference.paged_decode_attention(
                dq, k_cache, v_cache, seqlens, block_table
            ).float()
            decode = max(
                (
                    kernels.paged_decode_attention(
                        dq, k_cache, v_cache, seqlens, block_table, num_splits=n
                    ).float()
                    - want
                )
                .abs()
                .max()
                .item()
                for n in (0, 1, 4)
            )
            num_new = min(300, k_cache.shape[0] * block_size)
            slots = torch.randperm(k_cache.shape[0] * block_size, generator=gen, device="cpu")[
                :num_new
            ].to(DEVICE)
            slots[::5] = -1
            kv = randn(gen, num_new, 2, 2, head_dim, dtype=dtype)
            caches = [k_cache.clone(), v_cache.clone(), k_cache.clone(), v_cache.clone()]
            kernels.store_kvcache(kv[:, 0], kv[:, 1], caches[0], caches[1], slots)
            reference.store_kvcache(kv[:, 0], kv[:, 1], caches[2], caches[3], slots)
            store_equal = torch.equal(caches[0], caches[2]) and torch.equal(
                caches[1], caches[3]
            )
            good = prefill <= TOLERANCE[dtype] and decode <= TOLERANCE[dtype] and store_equal
            ok &= good
            print(
                f"  {str(dtype):15s} block {block_size:3d} head_dim {head_dim:3d} gqa "
                f"{group}: "
                f"prefill {prefill:.2e}  decode (1, 4, auto chunks) {decode:.2e}  "
                f"store {'equal' if store_equal else 'DIFFERENT'}  {'ok' if good else 'FAIL'}"
            )
    return ok


def copy_gbps(num_bytes: int) -> float:
    """Device-to-device copy bandwidth (bytes read + bytes written per second, in GB/s) for a
    buffer of `num_bytes`."""
    src = torch.empty(num_bytes // 2, dtype=torch.float16, device=DEVICE)
    dst = torch.empty_like(src)
    ms = cuda_time_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / ms / 1e6


def bench_store(
    dtype=torch.float16, num_tokens=32768, num_kv_heads=8, head_dim=128, block_size=16
) -> None:
    store_module = sys.modules["refimpl.kernels.store_kvcache"]
    num_blocks = num_tokens // block_size + 8
    k_cache = torch.zeros(
        num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=DEVICE
    )
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn(num_tokens, num_kv_heads, head_dim, dtype=dtype, device=DEVICE)
    value = torch.randn_like(key)
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:num_tokens]
    # The same bytes moved by two plain copies (contiguous, the best case for the memory
    # system).
    k_dst, v_dst = torch.empty_like(key), torch.empty_like(value)

    def copy():
        k_dst.copy_(key)
        v_dst.copy_(value)

    copy_ms = cuda_time_ms(copy)
    kernel_ms = cuda_time_ms(
        lambda: store_module.launch_store_kvcache(key, value, k_cache, v_cache, slots)
    )
    checked_ms = cuda_time_ms(
        lambda: store_module.store_kvcache(key, value, k_cache, v_cache, slots), repeats=10
    )
    moved = 2 * 2 * key.numel() * key.element_size()  # read + write, for K and for V
    print(
        f"== store_kvcache: {num_tokens} tokens x {num_kv_heads} heads x {head_dim}, {dtype}, "
        f"block {block_size}"
    )
    print(f"  device-to-device copy  {copy_ms:8.3f} ms  {moved / copy_ms / 1e6:8.1f} GB/s")
    print(
        f"  Triton kernel          {kernel_ms:8.3f} ms  {moved / kernel_ms / 1e6:8.1f} GB/s"
        f"  = {copy_ms / kernel_ms:.2f} of copy bandwidth"
    )
    print(
        f"  with argument checks   {checked_ms:8.3f} ms  (slot range + uniqueness checks sync "
        "with the host)"
    )


def bench_decode(
    batch: int,
    context: int,
    copy_bandwidth: float,
    dtype=torch.float16,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    block_size=16,
) -> dict:
    """Time one decode shape; return its record (times in ms, the automatic chunk count, the
    sweep)."""
    import torch.nn.functional as F

    attention_module = sys.modules["refimpl.kernels.paged_attention"]
    from refimpl.kernels import reference

    k_cache, v_cache, block_table, seqlens = paged_case(
        [context] * batch, block_size, num_kv_heads, head_dim, dtype
    )
    q = randn(torch.Generator().manual_seed(2), batch, num_heads, head_dim, dtype=dtype)
    scale = head_dim**-0.5
    # SDPA on the same data, already gathered and laid out [batch, kv_heads, context,
    # head_dim].
    keys = (
        reference.gather_kv(k_cache, block_table, seqlens, context)
        .transpose(1, 2)
        .contiguous()
    )
    values = (
        reference.gather_kv(v_cache, block_table, seqlens, context)
        .transpose(1, 2)
        .contiguous()
    )
    q4 = q.unsqueeze(2)  # [batch, heads, 1, head_dim]

    def triton(num_splits: int):
        return attention_module.launch_paged_decode(
            q, k_cache, v_cache, seqlens, block_table, scale, num_splits
        )

    sdpa_ms = cuda_time_ms(
        lambda: F.scaled_dot_product_attention(q4, keys, values, scale=scale, enable_gqa=True)
    )
    sweep = {n: cuda_time_ms(lambda n=n: triton(n)) for n in SWEEP}
    split_ms = cuda_time_ms(lambda: triton(0))
    auto, _ = attention_module.split_plan(q, k_cache, block_table)
    want = F.scaled_dot_product_attention(
        q4, keys, values, scale=scale, enable_gqa=True
    ).squeeze(2)
    error = max((triton(n).float() - want.float()).abs().max().item() for n in (0, 1))
    kv_bytes = 2 * batch * context * num_kv_heads * head_dim * q.element_size()
    record = dict(
        batch=batch,
        context=context,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=str(dtype).removeprefix("torch."),
        block_size=block_size,
        kv_bytes=kv_bytes,
        sdpa_ms=sdpa_ms,
        unsplit_ms=sweep[1],
        split_ms=split_ms,
        auto_splits=auto,
        sweep_ms={str(n): ms for n, ms in sweep.items()},
        max_abs_error=error,
    )
    print(
        f"== paged decode: batch {batch}, context {context}, heads "
        f"{num_heads}/{num_kv_heads}, "
        f"head_dim {head_dim}, {dtype}, block {block_size}"
    )
    print(f"  torch SDPA on gathered K/V   {sdpa_ms:8.3f} ms  (enable_gqa=True)")
    for n, ms in sweep.items():
        print(
            f"  Triton, {n:2d} chunk{'s' if n > 1 else ' '}          {ms:8.3f} ms  = "
            f"{ms / sdpa_ms:5.2f}x SDPA time,"
            f"  {kv_bytes / ms / 1e6:6.0f} GB/s of K/V read"
        )
    gbps = kv_bytes / split_ms / 1e6
    print(
        f"  Triton, automatic ({auto:2d})     {split_ms:8.3f} ms  = "
        f"{split_ms / sdpa_ms:5.2f}x SDPA time,"
        f"  {gbps:6.0f} GB/s = {gbps / copy_bandwidth:.2f} of copy bandwidth"
    )
    print(
        f"  goals: within 2x of SDPA {'met' if split_ms <= 2 * sdpa_ms else 'NOT met'}, at "
        "least half of copy "
        f"bandwidth {'met' if gbps >= copy_bandwidth / 2 else 'NOT met'};  max |Triton - "
        f"SDPA| = {error:.2e}"
    )
    return record


def main(argv: list[str] | None = None) -> int:
    global DEVICE, SMALL
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny shapes wherever the kernels run (CPU interpreter)",
    )
    parser.add_argument(
        "--json", type=Path, help=f"where to record the decode timings (on a GPU: {RECORD})"
    )
    parser.add_argument("--figure", type=Path, help=f"where to draw them (on a GPU: {FIGURE})")
    args = parser.parse_args(argv)
    if args.smoke:
        from refimpl.kernels.triton_setup import TRITON_DEVICE

        if TRITON_DEVICE is None:
            print("The Triton kernels cannot run in this process; nothing to smoke-test.")
            return 0
        DEVICE, SMALL = TRITON_DEVICE, True
    elif not torch.cuda.is_available():
        print(
            "No CUDA device here: nothing to check. The same kernels run in Triton's CPU "
            "interpreter "
            "(pytest tests/test_kernels_*.py); run this script on a machine with an NVIDIA "
            "GPU."
        )
        return 0
    else:
        args.json, args.figure = args.json or RECORD, args.figure or FIGURE
    import triton

    import refimpl.kernels  # noqa: F401  (compiled mode: TRITON_INTERPRET stays unset on CUDA)
    from refimpl.kernels.triton_setup import INTERPRET

    started = time.perf_counter()
    name = (
        torch.cuda.get_device_name()
        if DEVICE == "cuda"
        else "CPU (smoke run, timings meaningless)"
    )
    print(
        f"device: {name}, torch {torch.__version__}, Triton {triton.__version__}, "
        f"interpreter: {INTERPRET}"
    )
    ok = check_correctness()
    if SMALL:
        bench_store(num_tokens=64, num_kv_heads=2, head_dim=16, block_size=4)
        copy = copy_gbps(2 * 2 * 40 * 2 * 16 * 2)
        decodes = [
            bench_decode(2, 40, copy, num_heads=4, num_kv_heads=2, head_dim=16, block_size=4)
        ]
    else:
        bench_store()
        copy = copy_gbps(1 << 30)
        print(f"== device-to-device copy of 1 GiB: {copy:.0f} GB/s (read + written)")
        decodes = [bench_decode(batch, context, copy) for batch, context in DECODE_SHAPES]
    record = dict(
        machine=name,
        torch=torch.__version__,
        triton=triton.__version__,
        copy_gbps=copy,
        decode=decodes,
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
        print(f"recorded {args.json}")
    if args.figure:
        from refimpl.viz.split_kv import draw_decode_timings

        args.figure.parent.mkdir(parents=True, exist_ok=True)
        draw_decode_timings(record).savefig(args.figure, dpi=100)
        print(f"drew {args.figure}")
    print(
        f"done in {time.perf_counter() - started:.0f} s: "
        f"{'all kernels match their twins' if ok else 'MISMATCH'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
