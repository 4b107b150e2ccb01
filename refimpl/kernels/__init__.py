"""Kernels that read and write the paged KV cache.

``refimpl.kernels`` holds the Triton kernels (compiled on CUDA, run by Triton's CPU
interpreter elsewhere, see ``triton_setup``); ``refimpl.kernels.reference`` and, for DeepSeek
V4, ``reference_v4`` hold pure-torch twins with the same signatures. Importing this package
never needs Triton, CUDA or flash-attn: a missing backend is reported when a kernel is called.
"""

from refimpl.kernels import triton_setup  # noqa: F401  (must run before any kernel is defined)

# DeepSeek V4 index kernels (Part II addressing). compressed_slot_mapping has no Triton
# version: it is the torch function (it runs on any device), exported here under the same name.
from refimpl.kernels.deepseek_v4 import (
    compute_global_topk_indices_and_lens,
    compute_swa_indices_and_lens,
)
from refimpl.kernels.paged_attention import paged_decode_attention, paged_prefill_attention
from refimpl.kernels.reference_v4 import compressed_slot_mapping
from refimpl.kernels.store_kvcache import store_kvcache

__all__ = [
    "store_kvcache",
    "paged_decode_attention",
    "paged_prefill_attention",
    "compressed_slot_mapping",
    "compute_swa_indices_and_lens",
    "compute_global_topk_indices_and_lens",
]
