"""The one place where refimpl imports Triton.

Triton decides at ``@triton.jit`` time whether a kernel is compiled for a GPU or run by its
CPU interpreter, by reading the ``TRITON_INTERPRET`` environment variable. So this module
must run before any kernel module is imported. The rule:

* the user set ``TRITON_INTERPRET`` themselves: we leave it alone, whatever its value;
* CUDA is available: we leave it unset, kernels compile for the GPU;
* no CUDA: we set ``TRITON_INTERPRET=1`` so the same kernels run (slowly) on CPU tensors.

Importing this module never fails: without Triton, ``triton`` and ``tl`` are ``None`` and
``HAS_TRITON`` is False; calling a Triton kernel then raises a clear error.
"""

from __future__ import annotations

import os

import torch

#: Did the user set TRITON_INTERPRET before refimpl looked at it? (Then we never touch it.)
INTERPRET_SET_BY_USER: bool = "TRITON_INTERPRET" in os.environ
#: Is a CUDA device visible to torch?
CUDA_AVAILABLE: bool = torch.cuda.is_available()

if not INTERPRET_SET_BY_USER and not CUDA_AVAILABLE:
    os.environ["TRITON_INTERPRET"] = "1"

try:
    import triton
    import triton.language as tl

    HAS_TRITON: bool = True
except ImportError:  # triton is Linux-only; the torch twins still work everywhere
    triton = None
    tl = None
    HAS_TRITON = False


#: True when kernels defined from now on run in Triton's CPU interpreter.
#: Read through Triton's own parser so "1", "true", "on" all count the way Triton counts them.
def _interpret_flag() -> bool:
    if not HAS_TRITON:
        return False
    knobs = getattr(triton, "knobs", None)  # Triton >= 3.3 parses the flag in one place
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in (
        "1",
        "true",
        "on",
        "yes",
    )


INTERPRET: bool = _interpret_flag()


def _mode_mismatch() -> str | None:
    """Why the kernels cannot run in this process, when Triton's own helpers are in the other
    mode.

    ``tl.sum``, ``tl.max`` and ``tl.zeros`` are themselves ``@triton.jit`` functions, built
    when ``triton`` is first imported. If that happened before ``TRITON_INTERPRET`` was set,
    they are compiled-mode functions and an interpreted kernel cannot call them.
    """
    if not HAS_TRITON:
        return None
    helpers_interpreted = type(tl.standard.sum).__name__ == "InterpretedFunction"
    if helpers_interpreted == INTERPRET:
        return None
    return (
        f"Triton was imported with TRITON_INTERPRET={'1' if helpers_interpreted else 'unset'} "
        "before refimpl "
        f"switched it {'off' if helpers_interpreted else 'on'}; Triton's built-in helpers and "
        "refimpl's kernels "
        "are now in different modes. Import refimpl before triton, or set TRITON_INTERPRET "
        "yourself "
        "(1 on a CPU-only machine) before starting Python"
    )


#: None when the kernels can run; otherwise the reason they cannot (reported when one is
# called).
MODE_MISMATCH: str | None = _mode_mismatch()

#: The device whose tensors the Triton kernels take in this process: "cpu" under the
# interpreter
#: (which would also take CUDA tensors, copying them through the host), "cuda" when they are
#: compiled for a present GPU, None when they cannot run here (no Triton, a mode mismatch, or
#: compiled mode without CUDA). Tests and notebooks put a kernel's tensors here instead of
#: assuming the CPU, so the same code runs on a laptop and on a GPU machine.
TRITON_DEVICE: str | None = None
if HAS_TRITON and MODE_MISMATCH is None:
    TRITON_DEVICE = "cpu" if INTERPRET else "cuda" if CUDA_AVAILABLE else None
