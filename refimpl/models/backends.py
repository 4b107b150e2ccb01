"""The attention backends' block-size facts, in one table (vLLM 0.32).

A backend's kernel reads the cache in *kernel blocks*. vLLM asks each backend class
(`get_supported_kernel_block_sizes`) which sizes its kernel takes: any multiple of a base
(`MultipleOf(16)`: FlashAttention, Triton; `MultipleOf(32)`: the CPU backend) or a fixed list
(FlashInfer `[16, 32, 64]`, FlashMLA `[64]`). Three things follow from that answer:

- the default block size: 16 tokens on CUDA when the backend accepts it, else the backend's
  smallest kernel block (FlashMLA: 64); vLLM's CPU platform sets 128 (16 for MLA models, 256
  for DeepSeek V4) before the backend is consulted;
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
    token) rather than K and V rows. `platform` is "cuda" or "cpu".
    """

    name: str
    multiple_of: int | None
    fixed_sizes: tuple[int, ...]
    is_mla: bool
    platform: str
    layouts: tuple[str, ...] | None = None

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


#: vLLM 0.32's backends, by the names `--backend` takes (vLLM's `AttentionBackendEnum`, lower
#: case). FlashInfer's larger pages (128 ... 1024) are offered only on Blackwell with
#: TRT-LLM kernels; this table gives the Hopper/Ampere answer.
BACKENDS: dict[str, AttentionBackendInfo] = {
    "flash_attn": AttentionBackendInfo("FLASH_ATTN", 16, (), False, "cuda"),
    "flashinfer": AttentionBackendInfo("FLASHINFER", None, (16, 32, 64), False, "cuda"),
    "triton_attn": AttentionBackendInfo("TRITON_ATTN", 16, (), False, "cuda"),
    "flashmla": AttentionBackendInfo("FLASHMLA", None, (64,), True, "cuda"),
    "triton_mla": AttentionBackendInfo("TRITON_MLA", 16, (), True, "cuda"),
    "cpu_attn": AttentionBackendInfo("CPU_ATTN", 32, (), False, "cpu", ("LBHNC",)),
}
#: What vLLM selects by default on a Hopper GPU, and on its CPU platform.
DEFAULT_BACKEND = {"cuda": ("flash_attn", "flashmla"), "cpu": ("cpu_attn", "cpu_attn")}
#: Aliases a user may type.
BACKEND_ALIASES = {"flash-attn": "flash_attn", "triton": "triton_attn", "cpu": "cpu_attn"}


def get_backend(name: str | None, *, mla: bool) -> AttentionBackendInfo:
    """The backend called `name` ("flash_attn", "flashinfer", "triton_attn", "flashmla",
    "triton_mla", "cpu_attn"), or the CUDA default for the model kind when None."""
    if name is None:
        name = DEFAULT_BACKEND["cuda"][1 if mla else 0]
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
    return info
