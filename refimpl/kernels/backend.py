"""Which attention backend to use, and the rules each one imposes.

Three backends compute the same attention over the paged KV cache:

* ``"torch"``: pure torch, runs anywhere: ``refimpl.kernels.torch_backend``, the fast versions
  of
  the readable twins in ``refimpl.kernels.reference`` (same signatures, same numbers).
* ``"triton"``: the Triton kernels in ``refimpl.kernels``; compiled on CUDA, run by Triton's
  CPU interpreter elsewhere (correct but about a thousand times slower than torch).
* ``"flash-attn"``: ``flash_attn_with_kvcache`` / ``flash_attn_varlen_func``; CUDA only, only
  when the ``flash_attn`` package is installed, and only for block sizes that are a
  multiple of 256 (FlashAttention-2 checks this: its key tiles, up to 256 rows, must not
  cross a page boundary).

Nothing here imports flash-attn or launches a kernel: asking what is available is free.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch

from refimpl.errors import BackendUnavailableError
from refimpl.kernels import reference, torch_backend
from refimpl.kernels.triton_setup import HAS_TRITON, INTERPRET, MODE_MISMATCH

#: Backend names, best first when all are usable.
ATTENTION_BACKENDS = ("flash-attn", "triton", "torch")
#: flash-attn's paged KV cache wants every page to hold a multiple of this many tokens.
FLASH_ATTN_BLOCK_SIZE_MULTIPLE = 256


def has_flash_attn() -> bool:
    """True when the ``flash_attn`` package is installed (it is never imported just to ask)."""
    return importlib.util.find_spec("flash_attn") is not None


def _device_type(device: torch.device | str | None) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device).type


def available_attention_backends(device: torch.device | str | None = None) -> list[str]:
    """The backends that can run on ``device`` (default: CUDA when present, else CPU), best
    first."""
    kind = _device_type(device)
    names = []
    if kind == "cuda" and has_flash_attn():
        names.append("flash-attn")
    if HAS_TRITON and MODE_MISMATCH is None and (INTERPRET or kind == "cuda"):
        names.append("triton")
    names.append("torch")
    return names


def best_attention_backend(
    device: torch.device | str | None = None, block_size: int | None = None
) -> str:
    """The fastest backend that works on ``device`` (and pages ``block_size``, when given).

    On CUDA: flash-attn if installed and the block size is a multiple of 256, else compiled
    Triton, else torch. On CPU always torch: the Triton interpreter gives the same numbers but
    is far slower, so it is only used when asked for by name.
    """
    if _device_type(device) != "cuda":
        return "torch"
    for name in available_attention_backends(device):
        if (
            name == "flash-attn"
            and block_size is not None
            and block_size % FLASH_ATTN_BLOCK_SIZE_MULTIPLE
        ):
            continue
        return name
    return "torch"


def check_flash_attn_block_size(block_size: int) -> None:
    """Raise ``ValueError`` unless ``block_size`` is a positive multiple of 256 (flash-attn's
    paged KV rule)."""
    multiple = FLASH_ATTN_BLOCK_SIZE_MULTIPLE
    if (
        not isinstance(block_size, int)
        or isinstance(block_size, bool)
        or block_size < 1
        or block_size % multiple
    ):
        suggestion = (
            -(-block_size // multiple) * multiple
            if isinstance(block_size, int) and block_size > 0
            else multiple
        )
        raise ValueError(
            "flash-attn's paged KV cache needs a block size that is a positive multiple of "
            f"{multiple}, "
            f"got {block_size!r}; use e.g. kvcache_block_size={suggestion}, "
            "or the 'triton' / 'torch' attention backend, which accept any block size"
        )


def check_attention_backend(
    name: str, device: torch.device | str | None = None, block_size: int | None = None
) -> str:
    """Validate a backend choice for ``device`` and ``block_size``; return the name.

    ``None`` or ``"auto"`` picks :func:`best_attention_backend`, except that flash-attn is
    skipped for a block size it cannot page (then compiled Triton or torch is used).
    """
    if name is None or name == "auto":
        return best_attention_backend(device, block_size)
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; choose one of "
            f"{', '.join(ATTENTION_BACKENDS)} or 'auto'"
        )
    kind = _device_type(device)
    if name == "flash-attn":
        # The block-size rule first: it is a setting to fix on every machine, not a missing
        # part.
        if block_size is not None:
            check_flash_attn_block_size(block_size)
        if kind != "cuda":
            raise BackendUnavailableError(
                f"flash-attn runs only on CUDA devices, not on {kind}"
            )
        if not has_flash_attn():
            raise BackendUnavailableError(
                "flash-attn is not installed; `pip install flash-attn` needs CUDA to build"
            )
    if name == "triton":
        if not HAS_TRITON:
            raise BackendUnavailableError(
                "Triton is not installed; use the 'torch' attention backend"
            )
        if MODE_MISMATCH is not None:
            raise BackendUnavailableError(MODE_MISMATCH)
        if kind == "cpu" and not INTERPRET:
            raise BackendUnavailableError(
                "Triton kernels on CPU tensors need TRITON_INTERPRET=1 in the environment "
                "before refimpl is "
                "imported (refimpl sets it itself when no CUDA device is present and you did "
                "not set it)"
            )
    return name


@dataclass(frozen=True)
class AttentionOps:
    """The three cache operations of one backend, all with the signatures of
    ``refimpl.kernels``.

    With ``check_once_per_step`` the three also take ``check=``, and the engine checks a step's
    arguments in its first attention layer only (every layer gets the same step metadata);
    the other backends check every call.
    """

    name: str
    store_kvcache: Callable[..., None]
    paged_decode_attention: Callable[..., torch.Tensor]
    paged_prefill_attention: Callable[..., torch.Tensor]
    check_once_per_step: bool = False


def _flash_attn_ops() -> AttentionOps:
    # CUDA-only optional extra
    from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

    from refimpl.kernels.store_kvcache import store_kvcache as triton_store_kvcache

    def decode(
        q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale=None, num_splits=0
    ):
        reference.check_decode_args(
            q, k_cache, v_cache, cache_seqlens, block_table, num_splits
        )
        check_flash_attn_block_size(k_cache.shape[1])
        out = flash_attn_with_kvcache(
            q.unsqueeze(1),
            k_cache,
            v_cache,
            cache_seqlens=cache_seqlens.to(torch.int32),
            block_table=block_table.to(torch.int32),
            softmax_scale=softmax_scale,
            causal=True,
            num_splits=num_splits,
        )
        return out.squeeze(1)

    def prefill(
        q,
        k_cache,
        v_cache,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        block_table,
        softmax_scale=None,
    ):
        reference.check_prefill_args(
            q,
            k_cache,
            v_cache,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            block_table,
        )
        check_flash_attn_block_size(k_cache.shape[1])
        return flash_attn_varlen_func(
            q,
            k_cache,
            v_cache,
            cu_seqlens_q.to(torch.int32),
            cu_seqlens_k.to(torch.int32),
            max_seqlen_q,
            max_seqlen_k,
            softmax_scale=softmax_scale,
            causal=True,
            block_table=block_table.to(torch.int32),
        )

    return AttentionOps("flash-attn", triton_store_kvcache, decode, prefill)


def attention_ops(
    name: str | None = None,
    device: torch.device | str | None = None,
    block_size: int | None = None,
) -> AttentionOps:
    """The store / decode / prefill functions of backend ``name`` (``None`` or ``"auto"``: the
    best one).

    The flash-attn backend writes the cache with the Triton ``store_kvcache``, as nano-vllm
    does.
    """
    name = check_attention_backend(name, device, block_size)
    if name == "flash-attn":
        return _flash_attn_ops()
    if name == "triton":
        from refimpl import kernels

        return AttentionOps(
            "triton",
            kernels.store_kvcache,
            kernels.paged_decode_attention,
            kernels.paged_prefill_attention,
        )
    return AttentionOps(
        "torch",
        torch_backend.store_kvcache,
        torch_backend.paged_decode_attention,
        torch_backend.paged_prefill_attention,
        check_once_per_step=True,
    )


@dataclass(frozen=True)
class V4IndexOps:
    """DeepSeek V4's three index kernels of one backend (signatures of ``refimpl.kernels``).

    ``"torch"`` gives the twins of ``refimpl.kernels.reference_v4``; ``"triton"`` the kernels
    of ``refimpl.kernels.deepseek_v4`` (``compressed_slot_mapping`` is torch in both).
    flash-attn has no such kernels.
    """

    name: str
    compressed_slot_mapping: Callable[..., torch.Tensor]
    compute_swa_indices_and_lens: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    compute_global_topk_indices_and_lens: Callable[..., tuple[torch.Tensor, torch.Tensor]]


def v4_index_ops(
    name: str | None = None, device: torch.device | str | None = None
) -> V4IndexOps:
    """The V4 index kernels of backend ``name`` ("torch", "triton"; ``None`` / "auto": the best
    on ``device``)."""
    if name == "flash-attn":
        raise ValueError(
            "flash-attn has no DeepSeek V4 index kernels; choose 'triton', 'torch' or 'auto'"
        )
    name = check_attention_backend(name, device)
    # "auto" on a CUDA machine with flash-attn: compiled Triton is next best
    if name == "flash-attn":
        name = "triton" if "triton" in available_attention_backends(device) else "torch"
    if name == "triton":
        from refimpl.kernels import deepseek_v4 as kernels
    else:
        from refimpl.kernels import reference_v4 as kernels
    return V4IndexOps(
        name,
        kernels.compressed_slot_mapping,
        kernels.compute_swa_indices_and_lens,
        kernels.compute_global_topk_indices_and_lens,
    )
