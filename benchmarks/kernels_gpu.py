"""GPU check for refimpl's Triton kernels: correctness against the torch twins, then speed.

Run on a machine with a CUDA device:  python benchmarks/kernels_gpu.py
It (1) runs every kernel compiled and compares it with its pure-torch twin on realistic
shapes in fp16, bf16 and fp32, (2) measures store_kvcache's bandwidth as a fraction of a
plain device-to-device copy of the same bytes, and (3) times paged decode attention against
torch's scaled_dot_product_attention on the same K/V already gathered into contiguous
tensors (the work a paged kernel saves the caller). Takes well under 3 minutes.
Without CUDA it says so and exits with status 0. ``--smoke-on-cpu`` runs the same code on
tiny shapes in Triton's interpreter, only to show the script itself works (timings meaningless).
"""

from __future__ import annotations

import math
import sys
import time

import torch

DEVICE = "cuda"
SMALL = False  # tiny shapes for --smoke-on-cpu


def cuda_time_ms(fn, warmup: int = 5, repeats: int = 30) -> float:
    """Median time of ``fn()`` in milliseconds, measured with CUDA events (wall clock on CPU)."""
    if DEVICE != "cuda":
        warmup, repeats = 1, 2
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
    """Random K/V for the given contexts in shuffled blocks: (k_cache, v_cache, block_table, seqlens)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(blocks) + 4
    order = torch.randperm(num_blocks, generator=gen)
    block_table = torch.full((len(seq_lens), max(blocks)), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(blocks):
        block_table[b, :n] = order[used : used + n]
        used += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    v_cache = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    return k_cache, v_cache, block_table.to(DEVICE), torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)


TOLERANCE = {torch.float32: 1e-4, torch.float16: 6e-3, torch.bfloat16: 4e-2}  # max |difference|, outputs of size ~1


def check_correctness() -> bool:
    from refimpl import kernels
    from refimpl.kernels import reference

    ok = True
    from refimpl.kernels.triton_setup import INTERPRET

    mode = "interpreted" if INTERPRET else "compiled"
    print(f"== correctness: Triton ({mode}) against the torch twin, max |difference|")
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        configs = ((16, 128, 4), (7, 64, 1), (256, 128, 8), (32, 96, 2)) if not SMALL else ((3, 12, 2),)
        for block_size, head_dim, group in configs:
            seq_lens, q_lens = ([1, 513, 260, 1024], [1, 513, 17, 128]) if not SMALL else ([1, 9, 20], [1, 9, 3])
            k_cache, v_cache, block_table, seqlens = paged_case(seq_lens, block_size, 2, head_dim, dtype)
            gen = torch.Generator().manual_seed(1)
            q = torch.randn(sum(q_lens), 2 * group, head_dim, generator=gen).to(dtype).to(DEVICE)
            cu_q = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
            cu_k = torch.tensor([0] + torch.tensor(seq_lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
            args = (q, k_cache, v_cache, cu_q, cu_k, max(q_lens), max(seq_lens), block_table)
            prefill = (kernels.paged_prefill_attention(*args).float()
                       - reference.paged_prefill_attention(*args).float()).abs().max().item()
            dq = q[: len(seq_lens)].contiguous()
            decode = (kernels.paged_decode_attention(dq, k_cache, v_cache, seqlens, block_table).float()
                      - reference.paged_decode_attention(dq, k_cache, v_cache, seqlens, block_table).float()
                      ).abs().max().item()
            num_new = min(300, k_cache.shape[0] * block_size)
            slots = torch.randperm(k_cache.shape[0] * block_size, generator=gen)[:num_new].to(DEVICE)
            slots[::5] = -1
            kv = torch.randn(num_new, 2, 2, head_dim, generator=gen).to(dtype).to(DEVICE)
            caches = [k_cache.clone(), v_cache.clone(), k_cache.clone(), v_cache.clone()]
            kernels.store_kvcache(kv[:, 0], kv[:, 1], caches[0], caches[1], slots)
            reference.store_kvcache(kv[:, 0], kv[:, 1], caches[2], caches[3], slots)
            store_equal = torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
            good = prefill <= TOLERANCE[dtype] and decode <= TOLERANCE[dtype] and store_equal
            ok &= good
            print(f"  {str(dtype):15s} block {block_size:3d} head_dim {head_dim:3d} gqa {group}: "
                  f"prefill {prefill:.2e}  decode {decode:.2e}  store {'equal' if store_equal else 'DIFFERENT'}"
                  f"  {'ok' if good else 'FAIL'}")
    return ok


def bench_store(dtype=torch.float16, num_tokens=32768, num_kv_heads=8, head_dim=128, block_size=16) -> None:
    store_module = sys.modules["refimpl.kernels.store_kvcache"]
    num_blocks = num_tokens // block_size + 8
    k_cache = torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn(num_tokens, num_kv_heads, head_dim, dtype=dtype, device=DEVICE)
    value = torch.randn_like(key)
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:num_tokens]
    # The same bytes moved by two plain copies (contiguous, the best case for the memory system).
    k_dst, v_dst = torch.empty_like(key), torch.empty_like(value)

    def copy():
        k_dst.copy_(key)
        v_dst.copy_(value)

    copy_ms = cuda_time_ms(copy)
    kernel_ms = cuda_time_ms(lambda: store_module.launch_store_kvcache(key, value, k_cache, v_cache, slots))
    checked_ms = cuda_time_ms(lambda: store_module.store_kvcache(key, value, k_cache, v_cache, slots), repeats=10)
    moved = 2 * 2 * key.numel() * key.element_size()  # read + write, for K and for V
    print(f"== store_kvcache: {num_tokens} tokens x {num_kv_heads} heads x {head_dim}, {dtype}, block {block_size}")
    print(f"  device-to-device copy  {copy_ms:8.3f} ms  {moved / copy_ms / 1e6:8.1f} GB/s")
    print(f"  Triton kernel          {kernel_ms:8.3f} ms  {moved / kernel_ms / 1e6:8.1f} GB/s"
          f"  = {copy_ms / kernel_ms:.2f} of copy bandwidth")
    print(f"  with argument checks   {checked_ms:8.3f} ms  (slot range + uniqueness checks sync with the host)")


def bench_decode(dtype=torch.float16, batch=32, context=2048, num_heads=32, num_kv_heads=8, head_dim=128,
                 block_size=16) -> None:
    import torch.nn.functional as F

    attention_module = sys.modules["refimpl.kernels.paged_attention"]
    from refimpl.kernels import reference

    k_cache, v_cache, block_table, seqlens = paged_case([context] * batch, block_size, num_kv_heads, head_dim, dtype)
    q = torch.randn(batch, num_heads, head_dim, dtype=dtype, device=DEVICE)
    scale = head_dim**-0.5
    group = num_heads // num_kv_heads
    # SDPA on the same data, already gathered and laid out [batch, kv_heads, context, head_dim].
    keys = reference.gather_kv(k_cache, block_table, seqlens, context).transpose(1, 2).contiguous()
    values = reference.gather_kv(v_cache, block_table, seqlens, context).transpose(1, 2).contiguous()
    q4 = q.unsqueeze(2)  # [batch, heads, 1, head_dim]
    # SDPA reads the K/V heads as they are (enable_gqa), and, for comparison, copies repeated to
    # every query head (what older code does; it reads `group` times more bytes).
    keys_rep = keys.repeat_interleave(group, dim=1)
    values_rep = values.repeat_interleave(group, dim=1)

    sdpa_ms = cuda_time_ms(lambda: F.scaled_dot_product_attention(q4, keys, values, scale=scale, enable_gqa=True))
    sdpa_rep_ms = cuda_time_ms(lambda: F.scaled_dot_product_attention(q4, keys_rep, values_rep, scale=scale))
    triton_ms = cuda_time_ms(lambda: attention_module.launch_paged_decode(q, k_cache, v_cache, seqlens,
                                                                          block_table, scale))
    twin_ms = cuda_time_ms(lambda: reference.paged_decode_attention(q, k_cache, v_cache, seqlens, block_table),
                           repeats=10)
    got = attention_module.launch_paged_decode(q, k_cache, v_cache, seqlens, block_table, scale)
    want = F.scaled_dot_product_attention(q4, keys_rep, values_rep, scale=scale).squeeze(2)
    kv_bytes = 2 * batch * context * num_kv_heads * head_dim * q.element_size()
    print(f"== paged decode: batch {batch}, context {context}, heads {num_heads}/{num_kv_heads}, "
          f"head_dim {head_dim}, {dtype}, block {block_size}")
    print(f"  torch SDPA on gathered K/V  {sdpa_ms:8.3f} ms  (enable_gqa=True)")
    print(f"  ... K/V repeated per head   {sdpa_rep_ms:8.3f} ms  = {sdpa_rep_ms / sdpa_ms:.2f}x SDPA time")
    print(f"  Triton paged decode         {triton_ms:8.3f} ms  = {triton_ms / sdpa_ms:.2f}x SDPA time,"
          f"  {kv_bytes / triton_ms / 1e6:.0f} GB/s of K/V read")
    print(f"  torch twin (gather + attn)  {twin_ms:8.3f} ms  = {twin_ms / sdpa_ms:.2f}x SDPA time")
    print(f"  max |Triton - SDPA| = {(got.float() - want.float()).abs().max().item():.2e}")


def main() -> int:
    global DEVICE, SMALL
    if "--smoke-on-cpu" in sys.argv[1:]:
        DEVICE, SMALL = "cpu", True
    elif not torch.cuda.is_available():
        print("No CUDA device here: nothing to check. The same kernels run in Triton's CPU interpreter "
              "(pytest tests/test_kernels_*.py); run this script on a machine with an NVIDIA GPU.")
        return 0
    import refimpl.kernels  # noqa: F401  (compiled mode: TRITON_INTERPRET stays unset on CUDA)
    from refimpl.kernels.triton_setup import INTERPRET

    started = time.perf_counter()
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU (smoke run, timings meaningless)"
    print(f"device: {name}, torch {torch.__version__}, Triton interpreter: {INTERPRET}")
    ok = check_correctness()
    if SMALL:
        bench_store(num_tokens=64, num_kv_heads=2, head_dim=16, block_size=4)
        bench_decode(batch=2, context=40, num_heads=4, num_kv_heads=2, head_dim=16, block_size=4)
    else:
        bench_store()
        bench_decode()
        bench_decode(context=512, batch=64)
    print(f"done in {time.perf_counter() - started:.0f} s: {'all kernels match their twins' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
