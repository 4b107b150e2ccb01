"""The attention backends' block-size facts, in one table (vLLM 0.32).

A backend's kernel reads the cache in *kernel blocks*. vLLM asks each backend class
(`get_supported_kernel_block_sizes`) which sizes its kernel takes: any multiple of a base
(`MultipleOf(16)`: FlashAttention, Triton; `MultipleOf(32)`: the CPU backend) or a fixed list
(FlashInfer `[16, 32, 64]`, FlashMLA `[64]`). Three things follow from that answer:

- the default block size: 16 tokens on CUDA when the backend accepts it, else the backend's
  smallest kernel block (FlashMLA: 64); vLLM's CPU platform sets 128 (16 for MLA models, 256
  for DeepSeek V4) before the backend is consulted. On a Hopper GPU vLLM tries the backends in
  a fixed order and takes the first that accepts the KV cache dtype (`_get_backend_priorities`
  in its `platforms/cuda.py`): for MLA, FlashAttention MLA (any multiple of 16 tokens, so
  16-token blocks) unless the cache is fp8, which only FlashMLA (64) and Triton MLA store;
- a sliding-window layer's block size: the largest kernel block that fits in the block size
  (`_largest_kernel_block_within` in vLLM's attention layer);
- the stride alignment of packed blocks: a backend with only fixed sizes splits a larger block
  into kernel blocks of its largest size, so refimpl's `kernel_block_size` field is set to it
  (vLLM's `customize_attention_spec` sets `block_stride_alignment=MultipleOf(max)`).

`layouts` is what the backend says about where a block's bytes go
(`supported_kv_cache_layouts`): the CPU backend reads only layer-outermost caches ("LBHNC"), so
vLLM's planner cannot pack different page sizes into one block there; the CUDA backends state
no constraint (None). The table is checked against vLLM's own backend classes by
`make crosscheck-models`.
"""

from __future__ import annotations

from dataclasses import dataclass

#: vLLM's `CacheConfig.DEFAULT_BLOCK_SIZE` (CUDA and the default platform).
DEFAULT_BLOCK_SIZE = 16
#: The block size vLLM's CPU platform sets when the user gives none (`CpuPlatform`).
CPU_DEFAULT_BLOCK_SIZE = 128
#: vLLM's CPU MLA decode kernel compiles only for 16-token blocks; the platform forces it.
CPU_MLA_BLOCK_SIZE = 16
#: DeepSeek V4's sparse-MLA and indexer kernels take 256-token blocks only.
DEEPSEEK_V4_BLOCK_SIZE = 256


@dataclass(frozen=True)
class AttentionBackendInfo:
    """What vLLM's backend class says about kernel blocks (`get_supported_kernel_block_sizes`).

    `multiple_of`: the kernel takes any multiple of this many tokens (None when it takes only
    the sizes in `fixed_sizes`). `is_mla`: the backend serves MLA layers (one latent row per
    token) rather than K and V rows. `platform` is "cuda" or "cpu". `kv_cache_dtypes`: the
    class's `supported_kv_cache_dtypes`.
    """

    name: str
    multiple_of: int | None
    fixed_sizes: tuple[int, ...]
    is_mla: bool
    platform: str
    layouts: tuple[str, ...] | None = None
    kv_cache_dtypes: tuple[str, ...] | None = None

    def supports_kv_cache_dtype(self, kv_cache_dtype: str) -> bool:
        """vLLM's `AttentionBackend.supports_kv_cache_dtype`: the backend class lists the
        `--kv-cache-dtype` values its kernels store (None: it states no list). Values vLLM
        itself does not take (refimpl's "half", "float32") are not judged here."""
        if self.kv_cache_dtypes is None or kv_cache_dtype not in VLLM_CACHE_DTYPES:
            return True
        return kv_cache_dtype in self.kv_cache_dtypes

    def supports_block_size(self, block_size: int) -> bool:
        """vLLM's `AttentionBackend.supports_block_size`: a multiple of some kernel size."""
        bases = (self.multiple_of,) if self.multiple_of else self.fixed_sizes
        return any(block_size % base == 0 for base in bases)

    def preferred_block_size(self, default: int = DEFAULT_BLOCK_SIZE) -> int:
        """The block size vLLM picks when the user gives none (`get_preferred_block_size`)."""
        if self.supports_block_size(default):
            return default
        return self.multiple_of or min(self.fixed_sizes)

    @property
    def layouts_first(self) -> str | None:
        """The layout the backend prefers, or None when it states none (vLLM's default)."""
        return self.layouts[0] if self.layouts else None

    @property
    def smallest_kernel_block(self) -> int:
        return self.multiple_of or min(self.fixed_sizes)

    @property
    def kernel_block_size(self) -> int | None:
        """The stride alignment refimpl's specs carry: the largest fixed kernel block, or None
        when the kernel takes any multiple of its base (then no block is ever split)."""
        if self.multiple_of is not None:
            return None
        return max(self.fixed_sizes)

    def sliding_window_block_size(self, block_size: int) -> int:
        """Tokens per block of a sliding-window layer whose full-attention siblings use
        `block_size`: the largest kernel block <= block_size, else the smallest one."""
        candidates = list(self.fixed_sizes)
        if self.multiple_of is not None:
            base = self.multiple_of
            candidates.append(max(base, block_size // base * base))
        fitting = [b for b in candidates if b <= block_size]
        return max(fitting) if fitting else min(candidates)


#: `--kv-cache-dtype` values vLLM 0.32 knows that refimpl plans (vLLM's `CacheDType`).
VLLM_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
_UNQUANTIZED = ("auto", "float16", "bfloat16")
_FP8 = ("fp8", "fp8_e4m3")

#: vLLM 0.32's backends, by the names `--backend` takes (vLLM's `AttentionBackendEnum`, lower
#: case). FlashInfer's larger pages (128 ... 1024) are offered only on Blackwell with
#: TRT-LLM kernels; this table gives the Hopper/Ampere answer.
BACKENDS: dict[str, AttentionBackendInfo] = {
    "flash_attn": AttentionBackendInfo(
        "FLASH_ATTN", 16, (), False, "cuda", kv_cache_dtypes=_UNQUANTIZED + _FP8
    ),
    "flashinfer": AttentionBackendInfo(
        "FLASHINFER",
        None,
        (16, 32, 64),
        False,
        "cuda",
        kv_cache_dtypes=(*_UNQUANTIZED, *_FP8, "fp8_e5m2", "nvfp4", "nvfp4_4over6"),
    ),
    "triton_attn": AttentionBackendInfo(
        "TRITON_ATTN",
        16,
        (),
        False,
        "cuda",
        kv_cache_dtypes=(
            *_UNQUANTIZED,
            *_FP8,
            "fp8_e5m2",
            "int4_per_token_head",
            "int8_per_token_head",
            "fp8_per_token_head",
        ),
    ),
    "flash_attn_mla": AttentionBackendInfo(
        "FLASH_ATTN_MLA", 16, (), True, "cuda", kv_cache_dtypes=_UNQUANTIZED
    ),
    "flashmla": AttentionBackendInfo(
        "FLASHMLA", None, (64,), True, "cuda", kv_cache_dtypes=_UNQUANTIZED + _FP8
    ),
    "triton_mla": AttentionBackendInfo(
        "TRITON_MLA", 16, (), True, "cuda", kv_cache_dtypes=_UNQUANTIZED + _FP8
    ),
    "cpu_attn": AttentionBackendInfo("CPU_ATTN", 32, (), False, "cpu", ("LBHNC",)),
}
#: The order vLLM 0.32 tries backends in on a Hopper GPU (SM90, `_get_backend_priorities`),
#: keeping those this table has: FlashInfer MLA, next after FlashMLA, runs on Blackwell only.
HOPPER_PRIORITY = {
    False: ("flash_attn", "flashinfer", "triton_attn"),
    True: ("flash_attn_mla", "flashmla", "triton_mla"),
}
#: Aliases a user may type.
BACKEND_ALIASES = {"flash-attn": "flash_attn", "triton": "triton_attn", "cpu": "cpu_attn"}


def default_backend(*, mla: bool, kv_cache_dtype: str = "auto") -> str:
    """The backend vLLM 0.32 selects on a Hopper GPU when none is named: the first in its
    priority order whose class stores this KV cache dtype (so an fp8 MLA cache goes to
    FlashMLA, an fp8_e5m2 cache of an ordinary model to FlashInfer)."""
    for name in HOPPER_PRIORITY[mla]:
        if BACKENDS[name].supports_kv_cache_dtype(kv_cache_dtype):
            return name
    kind = "MLA" if mla else "attention"
    raise ValueError(
        f"no {kind} backend vLLM 0.32 runs on a Hopper GPU stores a {kv_cache_dtype!r} KV "
        f"cache; use one of: {', '.join(_accepted_dtypes(mla))}"
    )


def _accepted_dtypes(mla: bool) -> list[str]:
    return [
        d
        for d in VLLM_CACHE_DTYPES
        if any(BACKENDS[n].supports_kv_cache_dtype(d) for n in HOPPER_PRIORITY[mla])
    ]


def get_backend(
    name: str | None, *, mla: bool, kv_cache_dtype: str = "auto"
) -> AttentionBackendInfo:
    """The backend called `name` ("flash_attn", "flashinfer", "triton_attn", "flash_attn_mla",
    "flashmla", "triton_mla", "cpu_attn"), or vLLM's Hopper default for the model kind and
    KV cache dtype when None (`default_backend`). A named backend that cannot serve the model
    kind or store the cache dtype is refused, as vLLM refuses a selected backend it cannot
    validate."""
    if name is None:
        name = default_backend(mla=mla, kv_cache_dtype=kv_cache_dtype)
    key = BACKEND_ALIASES.get(name.lower(), name.lower())
    if key not in BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; allowed: {', '.join(sorted(BACKENDS))}"
        )
    info = BACKENDS[key]
    if info.platform == "cuda" and info.is_mla != mla:
        kind = "an MLA model" if mla else "a model without MLA"
        allowed = sorted(
            k for k, v in BACKENDS.items() if v.is_mla == mla or v.platform == "cpu"
        )
        raise ValueError(
            f"backend {name!r} cannot serve {kind}; allowed: {', '.join(allowed)}"
        )
    if not info.supports_kv_cache_dtype(kv_cache_dtype):
        raise ValueError(
            f"backend {name!r} does not store a {kv_cache_dtype!r} KV cache; it takes "
            f"{', '.join(d for d in info.kv_cache_dtypes if d in VLLM_CACHE_DTYPES)}"
        )
    return info
