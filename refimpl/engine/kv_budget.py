"""How many KV-cache blocks an engine allocates: enough for its work, within the memory it may
use.

nano-vllm sizes the pool from the GPU's memory, ``total * gpu_memory_utilization - used``,
where ``used`` counts every byte in use on the card. On a large GPU the first engine then takes
most of the card for a tiny model, and a second engine in the same process (prefix caching on
and off, two block sizes) computes a negative budget. Here an engine asks for the blocks its
work can use at most (``max_num_seqs`` sequences of ``max_model_len`` tokens, nano-vllm's worst
case) and takes fewer only when the memory it may still use is smaller; the error comes only
when not even one block fits. Both engines (Part I's `LLM` and Part III's `V4LLM`) can size
their pools with these functions: they know nothing of either engine.
"""

from __future__ import annotations

import torch

from refimpl.validation import check_fraction, check_positive_int, is_integer

#: The KV budget on a CPU when no size is given: a laptop's share, whatever the work.
CPU_KV_CACHE_BYTES = 256 * 1024**2


def blocks_for_work(max_num_seqs: int, max_model_len: int, block_size: int) -> int:
    """The most blocks the scheduler can hold at once: every running sequence at the longest
    length."""
    check_positive_int("max_num_seqs", max_num_seqs)
    check_positive_int("max_model_len", max_model_len)
    check_positive_int("block_size", block_size)
    return max_num_seqs * -(-max_model_len // block_size)


def available_kv_cache_memory(
    device: torch.device | str, gpu_memory_utilization: float = 0.9
) -> int:
    """Bytes a new KV cache may take on ``device``.

    On CUDA: this process's share of the card (``total * gpu_memory_utilization``) less what it
    already holds in live tensors (model weights, the caches of engines still open), and never
    more than the card can still hand out (its free memory plus blocks torch keeps cached for
    this process). On a CPU: ``CPU_KV_CACHE_BYTES``.
    """
    check_fraction("gpu_memory_utilization", gpu_memory_utilization)
    device = torch.device(device)
    if device.type != "cuda":
        return CPU_KV_CACHE_BYTES
    free, total = torch.cuda.mem_get_info(device)
    held = torch.cuda.memory_allocated(device)
    # this process's, reusable without asking the driver
    cached = torch.cuda.memory_reserved(device) - held
    return max(0, min(int(total * gpu_memory_utilization) - held, free + cached))


def kv_cache_num_blocks(
    block_bytes: int, work_blocks: int, available_bytes: int, device: torch.device | str
) -> int:
    """``min(work_blocks, available_bytes // block_bytes)``; a ValueError that says why when no
    block fits."""
    check_positive_int("block_bytes", block_bytes)
    check_positive_int("work_blocks", work_blocks)
    if not is_integer(available_bytes):
        raise ValueError(f"available_bytes must be an integer, got {available_bytes!r}")
    fits = available_bytes // block_bytes
    if fits < 1:
        device = torch.device(device)
        held = ""
        if device.type == "cuda":
            free, total = torch.cuda.mem_get_info(device)
            held = (
                f" ({free} of {total} bytes free; this process holds "
                f"{torch.cuda.memory_allocated(device)}: "
                "close() the engines you no longer use)"
            )
        raise ValueError(
            f"a KV budget of {max(available_bytes, 0)} bytes on {device} holds no block of "
            f"{block_bytes} bytes{held}; "
            "give num_kvcache_blocks or kv_cache_memory_bytes, or raise gpu_memory_utilization"
        )
    return min(work_blocks, fits)
