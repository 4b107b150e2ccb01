"""KV-cache spec types: how many bytes one block of one layer needs.

A *spec* describes the cache of one attention layer: how many tokens a block covers
(`block_size`), how many entries it really stores (`storage_block_size`, smaller for compressed
layers), and how many bytes that takes (`real_page_size_bytes`), rounded up to an alignment
(`page_size_bytes`). Specs are frozen and hashable so equal specs can be grouped with a dict.

The class names follow vLLM v1 (`vllm/v1/kv_cache_interface.py`) so a reader can map them:
every kind vLLM 0.32 builds for a decoder-only model is here (full attention, sliding window,
chunked local, MLA, sliding-window MLA, Mamba / linear-attention state). A layer that reuses
another layer's cache (cross-layer KV sharing, vLLM's `kv_sharing_target_layer_name`) has no
spec at all: vLLM plans without it and adds it to its target's group afterwards
(`kv_cache_planning.add_kv_sharing_layers_to_kv_cache_groups`).
Dtypes are stored as names ("uint8", "bfloat16", ...) so planning never needs torch; the
`torch_dtype` property converts when a tensor is built.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from refimpl.validation import check_int_at_least, check_positive_int

# Bytes per element for the dtypes a cache may use.
DTYPE_SIZES: dict[str, int] = {
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
}

# DeepSeek V4's fp8_ds_mla token row: 448 fp8 NoPE bytes + 64 bf16 RoPE values (128 bytes)
# + 8 scale bytes (7 UE8M0 exponents and 1 pad byte).
DSV4_FP8_DS_MLA_TOKEN_BYTES = 584
# DeepSeek V3.2's fp8_ds_mla row: 512 fp8 + 4 fp32 scales (16 bytes) + 64 bf16 RoPE (128
# bytes).
DSV32_FP8_DS_MLA_TOKEN_BYTES = 656


def round_up(x: int, multiple: int) -> int:
    """Smallest multiple of `multiple` that is >= x."""
    return -(-x // multiple) * multiple


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative integers."""
    return -(-a // b)


def _dtype_name(dtype: object) -> str:
    """Accept "bfloat16" or torch.bfloat16 and return the name."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_SIZES:
        raise ValueError(f"unsupported cache dtype {dtype!r}; allowed: {sorted(DTYPE_SIZES)}")
    return name


@dataclass(frozen=True, kw_only=True)
class KVCacheSpec:
    """Base of all specs: every block of a group covers `block_size` token positions."""

    block_size: int

    def __post_init__(self) -> None:
        check_positive_int("block_size", self.block_size)

    @property
    def page_size_bytes(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def max_memory_usage_bytes(self, *, max_model_len: int, max_in_flight_tokens: int) -> int:
        """Bytes one request may hold in this layer at most (vLLM's `max_memory_usage_bytes`).

        vLLM reads both numbers from its `VllmConfig`: `max_model_len`, and
        `max_in_flight_tokens` = `max_num_batched_tokens` x the batches in flight (2 with async
        scheduling, else 1, times the pipeline stages).
        """
        raise NotImplementedError(f"{type(self).__name__} has no memory rule")

    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
        """One spec for a group of layers (vLLM's `KVCacheSpec.merge`): all must be equal.

        Raises `SpecMergeError` (a ValueError) when they cannot share one spec; the planner
        catches it to keep such layers in separate groups, as vLLM catches its assertion.
        """
        first = specs[0]
        if any(spec != first for spec in specs[1:]):
            raise SpecMergeError("all layers of one KV cache group must have the same spec")
        return first


class SpecMergeError(ValueError):
    """Layers whose specs cannot be merged into one group spec."""


class WindowSizeMismatchError(ValueError):
    """Full-attention layers of one group that compute with different windows or chunks (not
    a `SpecMergeError`: vLLM's uniformity test lets such layers through, and its merge then
    refuses the model)."""


@dataclass(frozen=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    """A layer that stores per-token rows of `num_kv_heads x (head_size + head_size_v)`
    elements (a key row and a value row).

    `head_size_v` is the value head size when it differs from the key's (vLLM 0.32's field;
    None means equal to `head_size`; MLA layers store no separate value row: 0).
    `compress_ratio` > 1 means the layer keeps one entry per `compress_ratio` tokens (vLLM's
    `tokens_per_state`), so a block that covers `block_size` tokens stores only
    `storage_block_size = block_size // ratio` entries. `page_size_padded`, when set, is the
    page size actually reserved (>= the real one). `kernel_block_size` is vLLM's
    `block_stride_alignment=MultipleOf(n)`: the largest block the attention kernel takes.
    `dcp_world_size`: the decode context parallel ranks this layer's token positions are
    spread over (vLLM's `--decode-context-parallel-size` for its `dcp_sharded` attention
    specs): each rank stores every `dcp_world_size`-th token, so a block of `block_size`
    slots spans `block_size x dcp_world_size` positions of the sequence.
    """

    num_kv_heads: int
    head_size: int
    dtype: str
    head_size_v: int | None = None
    compress_ratio: int = 1
    page_size_padded: int | None = None
    kernel_block_size: int | None = None
    dcp_world_size: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kernel_block_size is not None:
            check_positive_int("kernel_block_size", self.kernel_block_size)
        check_positive_int("num_kv_heads", self.num_kv_heads)
        check_positive_int("head_size", self.head_size)
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", self.head_size)
        check_int_at_least("head_size_v", self.head_size_v, 0)
        check_positive_int("compress_ratio", self.compress_ratio)
        check_positive_int("dcp_world_size", self.dcp_world_size)
        object.__setattr__(self, "dtype", _dtype_name(self.dtype))
        if self.block_size % self.compress_ratio != 0:
            raise ValueError(
                f"block_size {self.block_size} must be a multiple of compress_ratio "
                f"{self.compress_ratio} so a block holds a whole number of entries"
            )

    @property
    def dtype_size(self) -> int:
        return DTYPE_SIZES[self.dtype]

    @property
    def torch_dtype(self):  # noqa: ANN201 - torch is imported lazily
        import torch

        return getattr(torch, self.dtype)

    @property
    def tokens_per_state(self) -> int:
        """vLLM 0.32's name for `compress_ratio`: tokens one stored entry covers."""
        return self.compress_ratio

    @property
    def storage_block_size(self) -> int:
        """Entries one block really stores: block_size // compress_ratio (vLLM's
        `num_states`)."""
        return self.block_size // self.compress_ratio

    @property
    def num_heads(self) -> int:
        """H of vLLM's logical [B, H, N, C] page: one slot per KV head."""
        return self.num_kv_heads

    @property
    def num_states(self) -> int:
        """N of the logical page: the entries one block stores."""
        return self.storage_block_size

    @property
    def state_content_size_bytes(self) -> int:
        """C of the logical page: bytes of one (head, entry) cell."""
        return self.real_page_size_bytes // (self.num_heads * self.num_states)

    @property
    def real_page_size_bytes(self) -> int:
        """Key and value rows for every stored entry of one block (entries x heads x
        (head_size + head_size_v) x dtype bytes)."""
        return (
            self.storage_block_size
            * self.num_kv_heads
            * (self.head_size + self.head_size_v)
            * self.dtype_size
        )

    @property
    def unpadded_page_size_bytes(self) -> int:
        """vLLM 0.32's name for `real_page_size_bytes`."""
        return self.real_page_size_bytes

    def block_stride_alignment(self) -> int:
        """Bytes the distance between two blocks must be a multiple of (planner C).

        `kernel_block_size` is the largest block the attention backend's kernel takes (vLLM's
        `MultipleOf(n)` from `get_supported_kernel_block_sizes`). A larger block is split into
        kernel blocks of `gcd(kernel, block_size)` tokens, so the block stride must be a whole
        number of such kernel pages. None (or a kernel that takes the whole block): 1.
        """
        if self.kernel_block_size is None:
            return 1
        kernel = math.gcd(self.kernel_block_size, self.block_size)
        if kernel == self.block_size:
            return 1
        return self.with_block_size(kernel).page_size_bytes

    def with_block_size(self, block_size: int) -> AttentionSpec:
        """The same spec for another block size (page padding recomputed, vLLM's
        `copy_with_new_block_size`)."""
        if getattr(self, "alignment", None) is not None:
            return replace(self, block_size=block_size, page_size_padded=None)
        return replace(self, block_size=block_size)

    @property
    def page_size_bytes(self) -> int:
        """Bytes reserved per block: the padded size when one is set, else the real size."""
        return _padded(self.real_page_size_bytes, self.page_size_padded, "the real page")

    def attention_fields(self) -> tuple:
        """The fields vLLM's `merge` requires equal across a group (its AttentionSpec
        fields)."""
        return (
            self.block_size,
            self.num_kv_heads,
            self.head_size,
            self.head_size_v,
            self.dtype,
            self.compress_ratio,
            self.page_size_padded,
            self.kernel_block_size,
            self.dcp_world_size,
        )


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """A layer that attends to every earlier token: its blocks are kept until the request
    ends.

    `sliding_window` / `attention_chunk_size` are set only when a sliding-window or chunked
    local layer is *managed* as full attention (vLLM's `--disable-hybrid-kv-cache-manager`):
    it still computes over its window but its cache keeps every block.
    """

    sliding_window: int | None = None
    attention_chunk_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("sliding_window", "attention_chunk_size"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        _check_padded(self)

    def max_memory_usage_bytes(self, *, max_model_len: int, max_in_flight_tokens: int) -> int:
        """A whole request: cdiv(max_model_len, block_size) pages, of this rank's share of
        the tokens under decode context parallelism."""
        tokens = cdiv(max_model_len, self.dcp_world_size)
        return cdiv(tokens, self.block_size) * self.page_size_bytes

    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec]) -> FullAttentionSpec:
        """vLLM's `FullAttentionSpec.merge`: full-attention layers with equal attention
        fields form one spec, whatever window or chunk size they compute with (at most one of
        each, never both). MLA layers merge only through `MLAAttentionSpec.merge`."""
        if not all(isinstance(s, FullAttentionSpec) for s in specs):
            raise SpecMergeError("every layer of the group must be full attention")
        if any(isinstance(s, MLAAttentionSpec) for s in specs):
            raise SpecMergeError("MLA layers merge with MLAAttentionSpec.merge")
        first = specs[0]
        windows = {s.sliding_window for s in specs} - {None}
        chunks = {s.attention_chunk_size for s in specs} - {None}
        if len(windows) > 1 or len(chunks) > 1:
            # vLLM's uniformity test lets it through, so vLLM refuses such a model with the
            # hybrid manager disabled
            raise WindowSizeMismatchError(
                "all attention layers of one KV cache group must have the same window size, "
                f"got {sorted(windows or chunks)}"
            )
        if any(s.attention_fields() != first.attention_fields() for s in specs):
            raise SpecMergeError("layers of one group must have the same attention spec")
        if windows and chunks:
            raise SpecMergeError("a group cannot mix sliding window and chunked local layers")
        return replace(
            first,
            sliding_window=next(iter(windows), None),
            attention_chunk_size=next(iter(chunks), None),
        )


@dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    """A layer that attends only to the last `sliding_window` tokens; older blocks can be
    freed.

    `extra_retained_tokens` keeps that many more tokens below the window (vLLM sets it to
    lookahead - 1 for multi-token speculative prefill; 0 otherwise).
    """

    sliding_window: int
    extra_retained_tokens: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int("sliding_window", self.sliding_window)
        check_int_at_least("extra_retained_tokens", self.extra_retained_tokens, 0)
        _check_padded(self)

    def max_admission_blocks_per_request(
        self, max_in_flight_tokens: int, max_model_len: int
    ) -> int:
        """Blocks one request holds at most: the window (less the current token) plus the
        tokens in flight, capped at the model length, plus one block because the window need
        not start at a block boundary."""
        num_tokens = min(
            self.sliding_window - 1 + self.extra_retained_tokens + max_in_flight_tokens,
            max_model_len,
        )
        return cdiv(num_tokens, self.block_size) + 1

    def max_memory_usage_bytes(self, *, max_model_len: int, max_in_flight_tokens: int) -> int:
        if self.dcp_world_size > 1:
            raise ValueError(
                "decode context parallelism does not support sliding-window layers (vLLM "
                "0.32 refuses them); use --decode-context-parallel-size 1"
            )
        blocks = self.max_admission_blocks_per_request(max_in_flight_tokens, max_model_len)
        return blocks * self.page_size_bytes


@dataclass(frozen=True, kw_only=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """A layer that attends within fixed chunks of `attention_chunk_size` tokens (Llama 4's
    local layers): blocks of finished chunks can be freed."""

    attention_chunk_size: int

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int("attention_chunk_size", self.attention_chunk_size)
        _check_padded(self)

    def max_admission_blocks_per_request(
        self, max_in_flight_tokens: int, max_model_len: int
    ) -> int:
        """One chunk plus the tokens in flight, capped at the model length (no extra
        block: a chunk starts at a multiple of its size)."""
        num_tokens = min(self.attention_chunk_size + max_in_flight_tokens, max_model_len)
        return cdiv(num_tokens, self.block_size)

    def max_memory_usage_bytes(self, *, max_model_len: int, max_in_flight_tokens: int) -> int:
        blocks = self.max_admission_blocks_per_request(max_in_flight_tokens, max_model_len)
        return blocks * self.page_size_bytes


def _padded(real: int, padded: int | None, what: str) -> int:
    """A page's bytes: `padded` when set (never less than the `real` bytes), else `real`."""
    if padded is None:
        return real
    if padded < real:
        raise ValueError(f"page_size_padded {padded} is smaller than {what} {real}")
    return padded


def _check_padded(spec: AttentionSpec | MambaSpec) -> None:
    if spec.page_size_padded is not None:
        check_positive_int("page_size_padded", spec.page_size_padded)
        _ = spec.page_size_bytes  # raises ValueError when smaller than the real page


def _mla_fields_post_init(spec: MLAAttentionSpec | SlidingWindowMLASpec) -> None:
    """Validate the MLA-only fields, then pad the page up to `alignment` if one is given."""
    if spec.alignment is not None:
        check_positive_int("alignment", spec.alignment)
        if spec.page_size_padded is not None:
            raise ValueError("give either alignment or page_size_padded, not both")
        real = spec.real_page_size_bytes
        padded = round_up(real, spec.alignment)
        if padded != real:  # like vLLM: only set when padding really adds bytes
            object.__setattr__(spec, "page_size_padded", padded)
    _check_padded(spec)


@dataclass(frozen=True, kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Full attention over one latent row per entry (no separate value row: `head_size_v`
    is 0).

    `cache_dtype_str="fp8_ds_mla"` selects the packed fp8 row: 584 bytes per entry for
    DeepSeek V4 (`model_version="deepseek_v4"`), 656 bytes per token for V3.2. Otherwise a row
    is `num_kv_heads x head_size` elements of `dtype`.
    """

    head_size_v: int | None = 0
    cache_dtype_str: str | None = None
    alignment: int | None = None
    model_version: str | None = None

    def __post_init__(self) -> None:
        AttentionSpec.__post_init__(self)
        _mla_fields_post_init(self)

    @property
    def entry_bytes(self) -> int:
        """Bytes of one stored entry (one row of the backend's cache tensor)."""
        if self.cache_dtype_str == "fp8_ds_mla":
            if self.model_version == "deepseek_v4":
                return DSV4_FP8_DS_MLA_TOKEN_BYTES
            return DSV32_FP8_DS_MLA_TOKEN_BYTES
        return self.num_kv_heads * (self.head_size + self.head_size_v) * self.dtype_size

    @property
    def real_page_size_bytes(self) -> int:
        if self.cache_dtype_str == "fp8_ds_mla" and self.model_version != "deepseek_v4":
            # The V3.2 layout is per token of the logical block (V3.2 has no compression).
            return self.block_size * DSV32_FP8_DS_MLA_TOKEN_BYTES
        return self.storage_block_size * self.entry_bytes

    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec]) -> MLAAttentionSpec:
        """vLLM's `MLAAttentionSpec.merge`: MLA layers with equal attention fields, cache
        format and model version."""
        if not all(isinstance(s, MLAAttentionSpec) for s in specs):
            raise SpecMergeError("every layer of the group must be MLA")
        first = specs[0]
        key = (first.attention_fields(), first.cache_dtype_str, first.model_version)
        if any(
            (s.attention_fields(), s.cache_dtype_str, s.model_version) != key for s in specs
        ):
            raise SpecMergeError("MLA layers of one group must have the same spec")
        return first


@dataclass(frozen=True, kw_only=True)
class SlidingWindowMLASpec(SlidingWindowSpec):
    """A sliding-window layer with one row per entry, like MLA (DeepSeek V4 SWA and states)."""

    head_size_v: int | None = 0
    cache_dtype_str: str | None = None
    alignment: int | None = None
    model_version: str | None = None

    def __post_init__(self) -> None:
        AttentionSpec.__post_init__(self)
        check_positive_int("sliding_window", self.sliding_window)
        check_int_at_least("extra_retained_tokens", self.extra_retained_tokens, 0)
        if self.model_version not in (None, "deepseek_v4"):
            raise ValueError(
                f"unsupported model_version {self.model_version!r}; allowed: None, "
                "'deepseek_v4'"
            )
        _mla_fields_post_init(self)

    @property
    def entry_bytes(self) -> int:
        if self.model_version == "deepseek_v4" and self.cache_dtype_str == "fp8_ds_mla":
            return DSV4_FP8_DS_MLA_TOKEN_BYTES
        return self.num_kv_heads * (self.head_size + self.head_size_v) * self.dtype_size

    @property
    def real_page_size_bytes(self) -> int:
        return self.storage_block_size * self.entry_bytes


# vLLM's MambaAttentionBackendEnum members, by the names refimpl stores (lower case).
MAMBA_TYPES = ("mamba1", "mamba2", "short_conv", "linear", "gdn_attn")
MAMBA_CACHE_MODES = ("none", "align")


@dataclass(frozen=True, kw_only=True)
class MambaSpec(KVCacheSpec):
    """The recurrent state of a Mamba / linear-attention layer: a fixed set of tensors per
    request, whatever its length.

    `shapes` and `dtypes` list the state tensors of one request (for Mamba2: the conv state
    and the SSM state). `mamba_type` is vLLM's backend for the layer: "mamba1", "mamba2",
    "short_conv", "linear" (lightning / MiniMax linear attention) or "gdn_attn" (gated delta
    net, Qwen3-Next). `block_size` is the tokens one state block stands for: the whole
    `max_model_len` when prefix caching is off (`mamba_cache_mode="none"`), the attention block
    size with "align". `page_size_padded` is the attention page that vLLM pads the state to so
    all groups share one page size. vLLM's TP-replication and prefill-checkpoint-alignment
    fields are not modelled (they do not change the page or the reservation).
    """

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    page_size_padded: int | None = None
    mamba_type: str = "mamba2"
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0
    num_prefill_checkpoint_blocks: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        shapes = tuple(tuple(int(d) for d in shape) for shape in self.shapes)
        dtypes = tuple(_dtype_name(d) for d in self.dtypes)
        if not shapes or len(shapes) != len(dtypes):
            raise ValueError(
                f"MambaSpec needs one dtype per state shape, got {len(shapes)} shapes and "
                f"{len(dtypes)} dtypes"
            )
        if any(d < 1 for shape in shapes for d in shape):
            raise ValueError(f"state shapes must have positive sizes, got {shapes}")
        object.__setattr__(self, "shapes", shapes)
        object.__setattr__(self, "dtypes", dtypes)
        if self.mamba_type not in MAMBA_TYPES:
            raise ValueError(f"unknown mamba_type {self.mamba_type!r}; allowed: {MAMBA_TYPES}")
        if self.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise ValueError(
                f"unknown mamba_cache_mode {self.mamba_cache_mode!r}; allowed: "
                f"{MAMBA_CACHE_MODES}"
            )
        check_int_at_least("num_speculative_blocks", self.num_speculative_blocks, 0)
        check_int_at_least(
            "num_prefill_checkpoint_blocks", self.num_prefill_checkpoint_blocks, 0
        )
        _check_padded(self)

    @property
    def real_page_size_bytes(self) -> int:
        """Bytes of all state tensors of one request."""
        return sum(
            math.prod(shape) * DTYPE_SIZES[dtype]
            for shape, dtype in zip(self.shapes, self.dtypes)
        )

    unpadded_page_size_bytes = real_page_size_bytes

    @property
    def page_size_bytes(self) -> int:
        return _padded(self.real_page_size_bytes, self.page_size_padded, "the state")

    @property
    def num_heads(self) -> int:
        return 1

    @property
    def num_states(self) -> int:
        return 1

    @property
    def state_content_size_bytes(self) -> int:
        return self.real_page_size_bytes

    def block_stride_alignment(self) -> int:
        return 1

    def with_block_size(self, block_size: int) -> MambaSpec:
        return replace(self, block_size=block_size)

    def max_memory_usage_bytes(self, *, max_model_len: int, max_in_flight_tokens: int) -> int:
        """The states one request holds: 1 (+1 per speculative token) without prefix
        caching; with "align" 2 (the running state and the last block-aligned checkpoint),
        plus speculative and prefill-checkpoint blocks."""
        if self.mamba_cache_mode == "align":
            blocks = 2 + self.num_speculative_blocks + self.num_prefill_checkpoint_blocks
        else:
            blocks = 1 + self.num_speculative_blocks
        return blocks * self.page_size_bytes


class FrozenSpecMap(Mapping):
    """An immutable, hashable, insertion-ordered {layer_name: spec} mapping."""

    __slots__ = ("_items", "_index")

    def __init__(self, specs: Mapping[str, KVCacheSpec] | None = None) -> None:
        items = tuple((specs or {}).items())
        self._items = items
        self._index = dict(items)

    def __getitem__(self, name: str) -> KVCacheSpec:
        return self._index[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenSpecMap):
            return self._items == other._items
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return f"FrozenSpecMap({len(self)} layers)"


@dataclass(frozen=True, kw_only=True, repr=False)
class UniformTypeKVCacheSpecs(KVCacheSpec):
    """Layers of one attention type (same block size, same freeing rule) but different pages.

    One block id of such a group covers the same token range in every member layer; the block
    needs the sum of the member pages. DeepSeek V4 puts all its compressed MLA layers (and its
    indexer caches) in one such spec, and each sliding-window bucket in another.
    """

    kv_cache_specs: Mapping[str, KVCacheSpec] = field(default_factory=FrozenSpecMap)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.kv_cache_specs, FrozenSpecMap):
            object.__setattr__(self, "kv_cache_specs", FrozenSpecMap(self.kv_cache_specs))
        if not self.kv_cache_specs:
            raise ValueError("UniformTypeKVCacheSpecs needs at least one layer")
        problem = uniform_type_problem(self.kv_cache_specs)
        if problem is not None:
            raise ValueError(f"layers are not of one uniform type: {problem}")
        first = self.first_spec
        if first.block_size != self.block_size:
            raise ValueError(
                f"block_size {self.block_size} differs from the members' {first.block_size}"
            )

    @classmethod
    def is_uniform_type(cls, specs: Mapping[str, KVCacheSpec]) -> bool:
        """True when all specs share a block size and a type family (sliding: one window)."""
        return bool(specs) and uniform_type_problem(specs) is None

    @classmethod
    def from_specs(cls, specs: Mapping[str, KVCacheSpec]) -> UniformTypeKVCacheSpecs | None:
        """Merge the specs into one, or return None when they are not of one uniform type."""
        if not cls.is_uniform_type(specs):
            return None
        first = next(iter(specs.values()))
        return cls(block_size=first.block_size, kv_cache_specs=specs)

    @property
    def first_spec(self) -> KVCacheSpec:
        """The spec a scheduler uses for the whole group (vLLM takes the first member)."""
        return next(iter(self.kv_cache_specs.values()))

    def max_memory_usage_pages(self, *, max_model_len: int, max_in_flight_tokens: int) -> int:
        """Blocks one request needs in this group: the most any member layer needs."""
        return max(
            cdiv(
                spec.max_memory_usage_bytes(
                    max_model_len=max_model_len, max_in_flight_tokens=max_in_flight_tokens
                ),
                spec.page_size_bytes,
            )
            for spec in self.kv_cache_specs.values()
        )

    def max_memory_usage_bytes(self, *, max_model_len: int, max_in_flight_tokens: int) -> int:
        """That many blocks of the whole group's page."""
        pages = self.max_memory_usage_pages(
            max_model_len=max_model_len, max_in_flight_tokens=max_in_flight_tokens
        )
        return pages * self.page_size_bytes

    @property
    def sliding_window(self) -> int | None:
        return getattr(self.first_spec, "sliding_window", None)

    @property
    def page_size_bytes(self) -> int:
        """Bytes one block id needs across all member layers."""
        return sum(spec.page_size_bytes for spec in self.kv_cache_specs.values())

    @property
    def real_page_size_bytes(self) -> int:
        return sum(spec.real_page_size_bytes for spec in self.kv_cache_specs.values())

    def page_size_counts(self) -> dict[int, int]:
        """{member page size: number of layers}, in first-seen order."""
        return dict(Counter(spec.page_size_bytes for spec in self.kv_cache_specs.values()))

    def get_num_layer_tuples(self) -> int:
        """Largest number of member layers that share one page size.

        A "layer tuple" holds one layer of each page size; the most common page size decides
        how many tuples the group has (31 for DeepSeek V4 Pro's MLA group: its 31 ratio-128
        layers).
        """
        return max(self.page_size_counts().values())

    def get_max_layers_per_page_size(self) -> int:
        """vLLM 0.32's name for `get_num_layer_tuples`."""
        return self.get_num_layer_tuples()

    def __repr__(self) -> str:
        sizes = ", ".join(f"{n}x{page}" for page, n in self.page_size_counts().items())
        return (
            f"UniformTypeKVCacheSpecs(block_size={self.block_size}, "
            f"type={type(self.first_spec).__name__}, layers=[{sizes}], "
            f"page_size_bytes={self.page_size_bytes})"
        )


def uniform_type_problem(specs: Mapping[str, KVCacheSpec]) -> str | None:
    """Why `specs` cannot form one UniformTypeKVCacheSpecs, or None when they can.

    vLLM's `is_uniform_type`: one block size, then the *first* layer's kind decides who may
    join (`is_uniform_with_collection`): a full-attention layer (MLA included) takes any full-
    attention layer; a sliding-window layer takes sliding-window layers of the same window
    (a sliding-window MLA layer only sliding-window MLA ones); a chunked local layer the same
    chunk size; a Mamba layer Mamba layers with the same page and speculative blocks.
    """
    members = list(specs.items())
    if not members:
        return "no layers"
    first_name, first = members[0]
    for name, spec in members[1:]:
        if spec.block_size != first.block_size:
            return (
                f"{name} has block_size {spec.block_size}, {first_name} has {first.block_size}"
            )
    for name, spec in members[1:]:
        problem = _joins_uniform_type(first, spec)
        if problem is not None:
            return f"{name} {problem} ({first_name} is a {type(first).__name__})"
    if not isinstance(first, (AttentionSpec, MambaSpec)):
        return f"{first_name} has spec type {type(first).__name__}, which cannot be merged"
    return None


def _joins_uniform_type(first: KVCacheSpec, spec: KVCacheSpec) -> str | None:
    """Why `spec` cannot join a uniform-type collection led by `first`, or None."""
    kind = type(spec).__name__
    if isinstance(first, SlidingWindowSpec):
        base = (
            SlidingWindowMLASpec
            if isinstance(first, SlidingWindowMLASpec)
            else (SlidingWindowSpec)
        )
        if not isinstance(spec, base):
            return f"is a {kind}"
        if spec.sliding_window != first.sliding_window:
            return f"has sliding_window {spec.sliding_window}, not {first.sliding_window}"
        return None
    if isinstance(first, ChunkedLocalAttentionSpec):
        if not isinstance(spec, ChunkedLocalAttentionSpec):
            return f"is a {kind}"
        if spec.attention_chunk_size != first.attention_chunk_size:
            return f"has attention_chunk_size {spec.attention_chunk_size}"
        return None
    if isinstance(first, MambaSpec):
        if not isinstance(spec, MambaSpec):
            return f"is a {kind}"
        if (
            spec.page_size_bytes,
            spec.num_speculative_blocks,
            spec.num_prefill_checkpoint_blocks,
        ) != (
            first.page_size_bytes,
            first.num_speculative_blocks,
            first.num_prefill_checkpoint_blocks,
        ):
            return "has another state page or speculative blocks"
        return None
    if isinstance(first, FullAttentionSpec):
        return None if isinstance(spec, FullAttentionSpec) else f"is a {kind}"
    return f"cannot join a {type(first).__name__}"


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """Layers that share one block table: block id b means the same tokens in all of them."""

    layer_names: tuple[str, ...]
    kv_cache_spec: KVCacheSpec
    is_eagle_group: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_names", tuple(self.layer_names))
        if not self.layer_names:
            raise ValueError("a KV cache group needs at least one layer")
        if len(set(self.layer_names)) != len(self.layer_names):
            raise ValueError("a KV cache group lists a layer twice")
        spec = self.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            missing = [n for n in self.layer_names if n not in spec.kv_cache_specs]
            if missing:
                raise ValueError(f"layers {missing[:3]} have no spec in the group's spec")

    def page_size_of(self, layer_name: str) -> int:
        """Bytes of one block of this layer (its member page for a uniform-type group)."""
        if layer_name not in self.layer_names:
            raise ValueError(f"layer {layer_name!r} is not in this group")
        return self.layer_spec(layer_name).page_size_bytes

    def layer_spec(self, layer_name: str) -> KVCacheSpec:
        spec = self.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            return spec.kv_cache_specs[layer_name]
        return spec

    @property
    def block_size(self) -> int:
        return self.kv_cache_spec.block_size

    @property
    def width_bytes(self) -> int:
        """Bytes one block of this group covers: the sum of its layers' pages."""
        return sum(self.page_size_of(n) for n in self.layer_names)

    def __repr__(self) -> str:
        names = self.layer_names
        shown = ", ".join(names[:2]) + (
            f", ... ({len(names)} layers)" if len(names) > 2 else ""
        )
        eagle = ", is_eagle_group=True" if self.is_eagle_group else ""
        return f"KVCacheGroupSpec([{shown}], {self.kv_cache_spec!r}{eagle})"


def unwrap_spec(spec: KVCacheGroupSpec | KVCacheSpec) -> AttentionSpec:
    """The spec the allocator works with: a group stands for its spec, and a
    `UniformTypeKVCacheSpecs` for its first member.

    All members of a uniform-type collection share block size and window, which is all the
    managers need (vLLM's `generate_scheduler_kv_cache_config` makes the same reduction).
    """
    if isinstance(spec, KVCacheGroupSpec):
        spec = spec.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return spec.first_spec
    return spec


@dataclass(frozen=True)
class KVCacheTensor:
    """One backing allocation of `size` bytes and the layers that view it.

    For the packed layout (`block_stride > 0`) every tensor aliases one slab: block b of a
    layer starts at byte `layer_offset(layer) + b * block_stride`. Version B lists the layers
    that share one offset (`layer_stride` None); version C (vLLM 0.32/0.33) lists a run of
    layers with one spec, laid side by side `layer_stride` bytes apart.
    """

    size: int
    shared_by: tuple[str, ...]
    offset: int = 0
    block_stride: int = 0
    layer_stride: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shared_by", tuple(self.shared_by))
        if self.size < 0 or self.offset < 0 or self.block_stride < 0:
            raise ValueError("size, offset and block_stride must be >= 0")
        if self.layer_stride is not None and self.layer_stride <= 0:
            raise ValueError(
                "layer_stride must be > 0 (or None when the layers share the bytes)"
            )

    @property
    def layers(self) -> tuple[str, ...]:
        """vLLM 0.32's name for `shared_by`."""
        return self.shared_by

    def layer_offset(self, layer_name: str) -> int:
        """Byte offset of the layer's page inside a block.

        Version B: every listed layer sits at `offset` (they share the bytes; `layer_stride`
        is None). Version C: the layers sit side by side, the i-th at `offset + i *
        layer_stride`.
        """
        if layer_name not in self.shared_by:
            raise ValueError(f"layer {layer_name!r} is not in this tensor")
        if self.layer_stride is None:
            return self.offset
        return self.offset + self.shared_by.index(layer_name) * self.layer_stride


@dataclass(frozen=True)
class KVCacheConfig:
    """The plan a worker allocates from: block count, tensors, and groups.

    Block 0 becomes the block pool's null block, so `num_usable_blocks = num_blocks - 1`.
    """

    num_blocks: int
    kv_cache_tensors: tuple[KVCacheTensor, ...]
    kv_cache_groups: tuple[KVCacheGroupSpec, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_cache_tensors", tuple(self.kv_cache_tensors))
        object.__setattr__(self, "kv_cache_groups", tuple(self.kv_cache_groups))

    @property
    def num_usable_blocks(self) -> int:
        return max(self.num_blocks - 1, 0)

    @property
    def block_stride(self) -> int:
        """Bytes between consecutive blocks of the packed slab (0 when not packed)."""
        return max((t.block_stride for t in self.kv_cache_tensors), default=0)

    @property
    def is_packed(self) -> bool:
        return self.block_stride > 0

    def __repr__(self) -> str:
        return (
            f"KVCacheConfig(num_blocks={self.num_blocks}, "
            f"kv_cache_tensors=[{len(self.kv_cache_tensors)} tensors], "
            f"kv_cache_groups=[{len(self.kv_cache_groups)} groups])"
        )
