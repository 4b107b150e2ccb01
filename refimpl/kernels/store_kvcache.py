"""Triton kernel that writes this step's K/V rows into the paged cache.

One program per token: it reads the token's slot, splits it into ``(block_id, offset)`` and
copies the ``[num_kv_heads, head_dim]`` key and value rows there. Slot -1 means "no cache
row for this token" (nano-vllm uses it for padding) and the program returns at once.

All offsets are computed in int64: ``block_id * stride`` overflows int32 for caches over
2 GiB elements, and in Triton's interpreter such an overflow crashes the process.
"""

from __future__ import annotations

import torch

from refimpl.kernels import reference
from refimpl.kernels.common import check_triton_device, next_power_of_2
from refimpl.kernels.triton_setup import HAS_TRITON, tl, triton

#: The kernels hold a whole ``[num_heads, head_dim]`` row (or tile) in registers.
MAX_HEAD_DIM = 256


def check_head_dim(head_dim: int) -> None:
    """The kernels keep a whole head row in registers: refuse head dims above
    ``MAX_HEAD_DIM``."""
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(
            f"the Triton kernels support head_dim up to {MAX_HEAD_DIM}, got {head_dim}"
        )


if HAS_TRITON:

    @triton.jit
    def _store_kvcache_kernel(
        key_ptr,
        value_ptr,
        k_cache_ptr,
        v_cache_ptr,
        slot_mapping_ptr,
        key_stride_t,
        key_stride_h,
        key_stride_d,
        value_stride_t,
        value_stride_h,
        value_stride_d,
        kc_stride_b,
        kc_stride_s,
        kc_stride_h,
        kc_stride_d,
        vc_stride_b,
        vc_stride_s,
        vc_stride_h,
        vc_stride_d,
        block_size,
        num_kv_heads,
        head_dim,
        BLOCK_H: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        token = tl.program_id(0).to(tl.int64)
        slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
        if slot == -1:  # padding token: nothing to store
            return
        block_id = slot // block_size
        offset = slot % block_size
        heads = tl.arange(0, BLOCK_H)[:, None]
        dims = tl.arange(0, BLOCK_D)[None, :]
        mask = (heads < num_kv_heads) & (dims < head_dim)  # tiles are padded to powers of two

        key = tl.load(
            key_ptr + token * key_stride_t + heads * key_stride_h + dims * key_stride_d,
            mask=mask,
        )
        value = tl.load(
            value_ptr
            + token * value_stride_t
            + heads * value_stride_h
            + dims * value_stride_d,
            mask=mask,
        )
        k_dst = (
            k_cache_ptr
            + block_id * kc_stride_b
            + offset * kc_stride_s
            + heads * kc_stride_h
            + dims * kc_stride_d
        )
        v_dst = (
            v_cache_ptr
            + block_id * vc_stride_b
            + offset * vc_stride_s
            + heads * vc_stride_h
            + dims * vc_stride_d
        )
        tl.store(k_dst, key, mask=mask)
        tl.store(v_dst, value, mask=mask)


def store_kvcache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write token ``i``'s K/V rows into slot ``slot_mapping[i]`` (-1: skip). Same contract as
    the torch twin.

    ``key``/``value`` may be non-contiguous views (e.g. slices of a fused QKV projection):
    the kernel follows their strides, and the cache's, instead of copying.
    """
    check_triton_device(k_cache)
    reference.check_store_kvcache_args(key, value, k_cache, v_cache, slot_mapping)
    check_head_dim(key.shape[2])
    launch_store_kvcache(key, value, k_cache, v_cache, slot_mapping)


def launch_store_kvcache(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Launch the kernel without any checks (benchmarks time this; everyone else calls
    ``store_kvcache``)."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    _store_kvcache_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping.contiguous(),
        *key.stride(),
        *value.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        k_cache.shape[1],
        num_kv_heads,
        head_dim,
        BLOCK_H=next_power_of_2(num_kv_heads),
        BLOCK_D=next_power_of_2(head_dim),
    )
