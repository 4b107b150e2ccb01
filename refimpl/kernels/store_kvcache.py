"""Triton store_kvcache (placeholder until the kernel lands in this session)."""

from __future__ import annotations


def store_kvcache(key, value, k_cache, v_cache, slot_mapping) -> None:
    raise NotImplementedError("the Triton store_kvcache kernel is being written; use refimpl.kernels.reference")
