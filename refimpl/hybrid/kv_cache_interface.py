"""KV-cache spec types: how many bytes one block of one layer needs.

A *spec* describes the cache of one attention layer: how many tokens a block covers
(`block_size`), how many entries it really stores (`storage_block_size`, smaller for compressed
layers), and how many bytes that takes (`real_page_size_bytes`), rounded up to an alignment
(`page_size_bytes`). Specs are frozen and hashable so equal specs can be grouped with a dict.

The class names follow vLLM v1 (`vllm/v1/kv_cache_interface.py`) so a reader can map them.
Dtypes are stored as names ("uint8", "bfloat16", ...) so planning never needs torch; the
`torch_dtype` property converts when a tensor is built.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from refimpl.validation import check_positive_int

# Bytes per element for the dtypes a cache may use.
DTYPE_SIZES: dict[str, int] = {
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
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


@dataclass(frozen=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    """A layer that stores per-token rows of `num_kv_heads x head_size` elements.

    `compress_ratio` > 1 means the layer keeps one entry per `compress_ratio` tokens, so a
    block that covers `block_size` tokens stores only `storage_block_size = block_size //
    ratio` entries. `page_size_padded`, when set, is the page size actually reserved (>= the
    real one).
    """

    num_kv_heads: int
    head_size: int
    dtype: str
    compress_ratio: int = 1
    page_size_padded: int | None = None
    kernel_block_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kernel_block_size is not None:
            check_positive_int("kernel_block_size", self.kernel_block_size)
        check_positive_int("num_kv_heads", self.num_kv_heads)
        check_positive_int("head_size", self.head_size)
        check_positive_int("compress_ratio", self.compress_ratio)
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
    def storage_block_size(self) -> int:
        """Entries one block really stores: block_size // compress_ratio."""
        return self.block_size // self.compress_ratio

    @property
    def real_page_size_bytes(self) -> int:
        """Key and value rows for every stored entry of one block (2 x entries x heads x
        dim)."""
        return (
            2 * self.storage_block_size * self.num_kv_heads * self.head_size * self.dtype_size
        )

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
        from dataclasses import replace

        if getattr(self, "alignment", None) is not None:
            return replace(self, block_size=block_size, page_size_padded=None)
        return replace(self, block_size=block_size)

    @property
    def page_size_bytes(self) -> int:
        """Bytes reserved per block: the padded size when one is set, else the real size."""
        real = self.real_page_size_bytes
        if self.page_size_padded is None:
            return real
        if self.page_size_padded < real:
            raise ValueError(
                f"page_size_padded {self.page_size_padded} is smaller than the real page "
                f"{real}"
            )
        return self.page_size_padded


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """A layer that attends to every earlier token: its blocks are kept until the request
    ends."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_padded(self)


@dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    """A layer that attends only to the last `sliding_window` tokens; older blocks can be
    freed."""

    sliding_window: int

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int("sliding_window", self.sliding_window)
        _check_padded(self)


def _check_padded(spec: AttentionSpec) -> None:
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
    """Full attention over one latent row per entry (no separate value row).

    `cache_dtype_str="fp8_ds_mla"` selects the packed fp8 row: 584 bytes per entry for
    DeepSeek V4 (`model_version="deepseek_v4"`), 656 bytes per token for V3.2. Otherwise a row
    is `num_kv_heads x head_size` elements of `dtype`.
    """

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
        return self.num_kv_heads * self.head_size * self.dtype_size

    @property
    def real_page_size_bytes(self) -> int:
        if self.cache_dtype_str == "fp8_ds_mla" and self.model_version != "deepseek_v4":
            # The V3.2 layout is per token of the logical block (V3.2 has no compression).
            return self.block_size * DSV32_FP8_DS_MLA_TOKEN_BYTES
        return self.storage_block_size * self.entry_bytes


@dataclass(frozen=True, kw_only=True)
class SlidingWindowMLASpec(SlidingWindowSpec):
    """A sliding-window layer with one row per entry, like MLA (DeepSeek V4 SWA and states)."""

    cache_dtype_str: str | None = None
    alignment: int | None = None
    model_version: str | None = None

    def __post_init__(self) -> None:
        AttentionSpec.__post_init__(self)
        check_positive_int("sliding_window", self.sliding_window)
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
        return self.num_kv_heads * self.head_size * self.dtype_size

    @property
    def real_page_size_bytes(self) -> int:
        return self.storage_block_size * self.entry_bytes


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


def _uniform_family(spec: KVCacheSpec) -> type | None:
    """The base type a UniformTypeKVCacheSpecs member must share with the others."""
    if isinstance(spec, SlidingWindowSpec):
        return SlidingWindowSpec
    if isinstance(spec, FullAttentionSpec):
        return FullAttentionSpec
    return None


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
    def first_spec(self) -> AttentionSpec:
        """The spec a scheduler uses for the whole group (vLLM takes the first member)."""
        return next(iter(self.kv_cache_specs.values()))

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

    def __repr__(self) -> str:
        sizes = ", ".join(f"{n}x{page}" for page, n in self.page_size_counts().items())
        return (
            f"UniformTypeKVCacheSpecs(block_size={self.block_size}, "
            f"type={type(self.first_spec).__name__}, layers=[{sizes}], "
            f"page_size_bytes={self.page_size_bytes})"
        )


def uniform_type_problem(specs: Mapping[str, KVCacheSpec]) -> str | None:
    """Why `specs` cannot form one UniformTypeKVCacheSpecs, or None when they can."""
    members = list(specs.items())
    if not members:
        return "no layers"
    first_name, first = members[0]
    family = _uniform_family(first)
    if family is None:
        return f"{first_name} has spec type {type(first).__name__}, which cannot be merged"
    for name, spec in members[1:]:
        if spec.block_size != first.block_size:
            return (
                f"{name} has block_size {spec.block_size}, {first_name} has {first.block_size}"
            )
        if _uniform_family(spec) is not family:
            return (
                f"{name} is a {type(spec).__name__}, {first_name} is a {type(first).__name__}"
            )
        if family is SlidingWindowSpec and spec.sliding_window != first.sliding_window:
            return (
                f"{name} has sliding_window {spec.sliding_window}, "
                f"{first_name} has {first.sliding_window}"
            )
    return None


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
