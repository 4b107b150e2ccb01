"""What every kernel module shares: the index dtypes, tile sides, and the check that the Triton
kernels can run on a tensor's device (Triton installed, interpreter mode matching the device).

A leaf module: it imports only `triton_setup` and `refimpl.errors`, so any kernel module and
any torch twin can use it without an import cycle through `refimpl.kernels`.
"""

from __future__ import annotations

import torch

from refimpl.errors import BackendUnavailableError
from refimpl.kernels.triton_setup import HAS_TRITON, INTERPRET, MODE_MISMATCH

#: Dtypes accepted for slot mappings, block tables and other index tensors.
INDEX_DTYPES = (torch.int32, torch.int64)


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (Triton tiles must have power-of-two sides)."""
    return 1 << max(0, n - 1).bit_length()


def check_triton_device(tensor: object, twins: str = "refimpl.kernels.reference") -> None:
    """Raise a clear error when the Triton kernels cannot run on ``tensor``'s device.

    Checked before anything else, so that e.g. a ``meta`` tensor gets this message rather
    than a failure inside the value checks. ``twins`` names the pure-torch module to use
    instead.
    """
    if not HAS_TRITON:
        raise BackendUnavailableError(
            f"Triton is not installed; use {twins} (pure torch) instead"
        )
    if MODE_MISMATCH is not None:
        raise BackendUnavailableError(MODE_MISMATCH)
    if not isinstance(tensor, torch.Tensor):
        return  # the argument checks that follow name the wrong argument
    kind = tensor.device.type
    if kind == "cpu" and not INTERPRET:
        raise ValueError(
            "the Triton kernels got CPU tensors but Triton is in compiled mode "
            "(TRITON_INTERPRET is off); "
            "move the tensors to CUDA, or set TRITON_INTERPRET=1 before importing refimpl, "
            f"or use {twins}"
        )
    if kind not in ("cpu", "cuda"):
        raise ValueError(
            "the Triton kernels run on CUDA (compiled) or CPU (interpreter) tensors, not "
            f"{kind}"
        )
