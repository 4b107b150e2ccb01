"""Triton paged attention (placeholder until the kernels land in this session)."""

from __future__ import annotations


def paged_decode_attention(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale=None):
    raise NotImplementedError("the Triton decode kernel is being written; use refimpl.kernels.reference")


def paged_prefill_attention(
    q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table, softmax_scale=None
):
    raise NotImplementedError("the Triton prefill kernel is being written; use refimpl.kernels.reference")
