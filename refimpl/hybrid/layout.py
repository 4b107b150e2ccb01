"""Turn cache groups and a memory budget into a `KVCacheConfig` (how many blocks, which tensors).

Two planner versions. C (the default) is what vLLM 0.32/0.33 run: one block-outermost slab, one
tensor per group and spec run (`get_kv_cache_config_c`). B is the version the DeepSeek V4
KV-cache article describes; four cases (vLLM v1 `get_kv_cache_config_from_groups`, version B):

- no groups (attention-free model): one block, for the block pool's null block, no tensors;
- one group of one `UniformTypeKVCacheSpecs`: one tensor per layer, sized by its own page;
- packed (every group is a `UniformTypeKVCacheSpecs`, as for DeepSeek V4, or explicitly
  requested): one slab of `num_blocks x block_stride` bytes; each group lays its layers out
  densely from byte 0 of a block, and groups overlay each other because a block id belongs to
  one group at a time. `block_stride` is the widest group;
- general: all groups share one page size; tensor i is shared by the i-th layer of each group.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from refimpl.hybrid.grouping import check_layout_version
from refimpl.hybrid.specs import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    UniformTypeKVCacheSpecs,
    round_up,
)
from refimpl.validation import check_int_at_least, check_positive_int

GIB = 1 << 30


def get_packed_kv_cache_layout(
    groups: Sequence[KVCacheGroupSpec],
) -> tuple[int, dict[int, list[str]]]:
    """(block_stride, {byte offset: [layers at that offset, in group order]}).

    Within a group the layers are disjoint (each starts where the previous page ends); across
    groups they overlap, since one block id is owned by a single group at a time.
    """
    layers_by_offset: dict[int, list[str]] = {}
    block_stride = 0
    for group in groups:
        offset = 0
        for name in group.layer_names:
            layers_by_offset.setdefault(offset, []).append(name)
            offset += group.page_size_of(name)
        block_stride = max(block_stride, offset)
    if block_stride <= 0:
        raise ValueError("a packed layout needs at least one layer with a non-empty page")
    return block_stride, layers_by_offset


def use_packed_kv_cache_config(
    groups: Sequence[KVCacheGroupSpec], enable_cross_layers_blocks: bool = False
) -> bool:
    """Packed when every group is uniform-type (DeepSeek V4) or when cross-layer blocks are on."""
    if all(isinstance(g.kv_cache_spec, UniformTypeKVCacheSpecs) for g in groups):
        return True
    return enable_cross_layers_blocks and len(groups) > 1


def _check_memory(available_memory: int) -> None:
    check_int_at_least("available_memory", available_memory, 0, " (bytes)")


def _num_blocks(available_memory: int, bytes_per_block: int, override: int | None) -> int:
    """Blocks that fit in the budget, or the override (which replaces the budget's answer)."""
    if override is not None:
        return check_positive_int("num_blocks_override", override)
    num_blocks = available_memory // bytes_per_block
    if num_blocks < 1:
        raise ValueError(
            f"available_memory {available_memory} B is smaller than one block "
            f"({bytes_per_block} B); give at least {bytes_per_block} B or set num_blocks_override"
        )
    return num_blocks


def uniform_page_size(groups: Sequence[KVCacheGroupSpec]) -> int:
    pages = {g.kv_cache_spec.page_size_bytes for g in groups}
    if len(pages) != 1:
        raise ValueError(f"the general layout needs one page size across groups, got {sorted(pages)}")
    return pages.pop()


def get_kv_cache_bytes_per_block_c(groups: Sequence[KVCacheGroupSpec]) -> int:
    """Planner C's block stride: the widest group, rounded up to a common multiple of every
    layer's `block_stride_alignment` (its page at the kernel block size when the backend splits
    a block into smaller kernel blocks; 1 otherwise)."""
    widest = max(g.width_bytes for g in groups)
    if widest <= 0:
        raise ValueError("a packed layout needs at least one layer with a non-empty page")
    alignments = [g.layer_spec(n).block_stride_alignment() for g in groups for n in g.layer_names]
    return round_up(widest, math.lcm(*alignments))


def get_kv_cache_config_c(
    groups: Sequence[KVCacheGroupSpec], available_memory: int, num_blocks_override: int | None = None
) -> KVCacheConfig:
    """Planner C (vLLM 0.32/0.33 `get_kv_cache_config_from_groups`, block-outermost layout).

    Every group starts at byte 0 of a block (groups overlay, as in B). Inside a group, the
    layers are taken spec by spec: all layers with one (equal) spec form a run, in first-seen
    order, and one `KVCacheTensor` per run lists them with `layer_stride` = their page. B instead
    lists, per byte offset, the layers of all groups that start there.
    """
    if not groups:
        return KVCacheConfig(num_blocks=1, kv_cache_tensors=(), kv_cache_groups=())
    block_stride = get_kv_cache_bytes_per_block_c(groups)
    num_blocks = _num_blocks(available_memory, block_stride, num_blocks_override)
    size = block_stride * num_blocks
    tensors = []
    for group in groups:
        runs: dict[object, list[str]] = {}
        for name in group.layer_names:
            runs.setdefault(group.layer_spec(name), []).append(name)
        offset = 0
        for spec, names in runs.items():
            page = spec.page_size_bytes
            tensors.append(KVCacheTensor(size=size, shared_by=tuple(names), offset=offset,
                                         block_stride=block_stride, layer_stride=page))
            offset += len(names) * page
    return KVCacheConfig(num_blocks, tensors, groups)


def bytes_per_block(
    groups: Sequence[KVCacheGroupSpec], enable_cross_layers_blocks: bool = False, *, layout_version: str = "C"
) -> int:
    """Bytes that one more block id costs for these groups (the divisor of the memory budget)."""
    check_layout_version(layout_version)
    groups = list(groups)
    if not groups:
        return 0
    if layout_version == "C":
        return get_kv_cache_bytes_per_block_c(groups)
    if len(groups) == 1 and isinstance(groups[0].kv_cache_spec, UniformTypeKVCacheSpecs):
        return groups[0].kv_cache_spec.page_size_bytes
    if use_packed_kv_cache_config(groups, enable_cross_layers_blocks):
        return get_packed_kv_cache_layout(groups)[0]
    return uniform_page_size(groups) * max(len(g.layer_names) for g in groups)


def get_kv_cache_config(
    groups: Sequence[KVCacheGroupSpec],
    available_memory: int,
    num_blocks_override: int | None = None,
    *,
    enable_cross_layers_blocks: bool = False,
    layout_version: str = "C",
) -> KVCacheConfig:
    """Plan the cache tensors for `groups` within `available_memory` bytes.

    Any list of groups is accepted, so hand-made layouts (such as the vLLM KV-cache article's MLA + one
    unsplit SWA group) can be compared with the real grouping. Raises ValueError when the budget is
    smaller than one block (unless `num_blocks_override` is given).
    `layout_version`: "C" (default, vLLM 0.32/0.33: one tensor per group and spec run, with a
    `layer_stride`) or "B" (the article's version: one tensor per byte offset).
    """
    check_layout_version(layout_version)
    _check_memory(available_memory)
    groups = list(groups)
    names = [n for g in groups for n in g.layer_names]
    if len(names) != len(set(names)):
        raise ValueError("a layer appears in more than one group")
    if layout_version == "C":
        return get_kv_cache_config_c(groups, available_memory, num_blocks_override)
    if not groups:
        # An attention-free model still needs one block: the block pool's null block.
        return KVCacheConfig(num_blocks=1, kv_cache_tensors=(), kv_cache_groups=())

    if len(groups) == 1 and isinstance(groups[0].kv_cache_spec, UniformTypeKVCacheSpecs):
        group = groups[0]
        num_blocks = _num_blocks(available_memory, group.kv_cache_spec.page_size_bytes, num_blocks_override)
        tensors = [
            KVCacheTensor(size=group.page_size_of(name) * num_blocks, shared_by=(name,))
            for name in group.layer_names
        ]
        return KVCacheConfig(num_blocks, tensors, groups)

    if use_packed_kv_cache_config(groups, enable_cross_layers_blocks):
        block_stride, layers_by_offset = get_packed_kv_cache_layout(groups)
        num_blocks = _num_blocks(available_memory, block_stride, num_blocks_override)
        size = block_stride * num_blocks
        tensors = [
            KVCacheTensor(size=size, shared_by=tuple(layers_by_offset[offset]), offset=offset,
                          block_stride=block_stride)
            for offset in sorted(layers_by_offset)
        ]
        return KVCacheConfig(num_blocks, tensors, groups)

    # General case: tensor i holds the i-th layer of every group; groups own different blocks.
    page = uniform_page_size(groups)
    group_size = max(len(g.layer_names) for g in groups)
    num_blocks = _num_blocks(available_memory, page * group_size, num_blocks_override)
    tensors = [
        KVCacheTensor(
            size=page * num_blocks,
            shared_by=tuple(g.layer_names[i] for g in groups if i < len(g.layer_names)),
        )
        for i in range(group_size)
    ]
    return KVCacheConfig(num_blocks, tensors, groups)


@dataclass(frozen=True)
class GroupSummary:
    """One row of a layout table."""

    index: int
    kind: str
    block_size: int
    num_layers: int
    width_bytes: int
    unused_tail_bytes: int  # block_stride - width: bytes this group never touches in a block
    padding_bytes: int  # alignment padding inside its pages


def group_kind(group: KVCacheGroupSpec) -> str:
    """A short label: "MLA", "SWA" or "state w=8" style, from the group's first member."""
    spec = group.kv_cache_spec
    first = spec.first_spec if isinstance(spec, UniformTypeKVCacheSpecs) else spec
    window = getattr(first, "sliding_window", None)
    name = type(first).__name__.replace("AttentionSpec", "").replace("Spec", "")
    if window is None:
        return name
    if getattr(first, "model_version", None) == "deepseek_v4" and first.dtype in ("uint8", "bfloat16"):
        return f"SWA w={window}"
    return f"state bs={first.block_size} w={window}" if first.dtype == "float32" else f"{name} w={window}"


def summarize_groups(groups: Sequence[KVCacheGroupSpec]) -> list[GroupSummary]:
    stride = max(g.width_bytes for g in groups) if groups else 0
    rows = []
    for i, g in enumerate(groups):
        padding = sum(g.page_size_of(n) - g.layer_spec(n).real_page_size_bytes for n in g.layer_names)
        rows.append(GroupSummary(i, group_kind(g), g.block_size, len(g.layer_names), g.width_bytes,
                                 stride - g.width_bytes, padding))
    return rows


#: The largest budget `parse_memory` accepts: 1 PiB, more memory than any single accelerator has.
MAX_MEMORY_BYTES = 1 << 50
_MEMORY_UNITS = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
                 "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "b": 1, "": 1}


def parse_memory(text: str | int) -> int:
    """'10GiB' -> 10737418240; also KiB/MiB/TiB, KB/MB/GB/TB and plain byte counts.

    The number is read exactly (as a fraction, never through a float), so '1.5GiB' is exact and
    a size that is not a whole number of bytes, negative, or above 1 PiB is a ValueError.
    """
    if isinstance(text, bool):
        raise ValueError(f"memory size must be a number of bytes or a string such as '10GiB', got {text!r}")
    if isinstance(text, int):
        value = Fraction(text)
    else:
        s = str(text).strip().lower().replace("_", "").replace(",", "")
        number = s.rstrip("kmgtib")
        unit = s[len(number):]
        try:
            if "/" in number:
                raise ValueError("a fraction")
            value = Fraction(number) * _MEMORY_UNITS[unit]
        except (ValueError, ZeroDivisionError, KeyError):
            raise ValueError(f"cannot read memory size {text!r}; use e.g. 10GiB, 512MiB, 4GB or 123456") from None
    if value < 0:
        raise ValueError(f"memory size must not be negative, got {text!r}")
    if value.denominator != 1:
        raise ValueError(f"memory size {text!r} is not a whole number of bytes ({float(value):,.2f} B)")
    if value > MAX_MEMORY_BYTES:
        raise ValueError(f"memory size {text!r} is more than 1 PiB ({MAX_MEMORY_BYTES:,} B); no device has that much")
    return int(value)


# --- Older vLLM packings, kept only to compare bytes per block with the packed slab

def _page_counts(group: KVCacheGroupSpec) -> Counter:
    """{page size: number of the group's layers with that page}."""
    return Counter(group.page_size_of(n) for n in group.layer_names)


def bytes_per_block_v0(groups: Sequence[KVCacheGroupSpec]) -> int:
    """V0 (the blog's "three page sizes"): every layer tuple reserves one page of each distinct
    size of the first (MLA) group: tuples x sum(distinct MLA pages). Pro: 31 x 47,808."""
    tuples = max(max(_page_counts(g).values()) for g in groups)
    return tuples * sum(_page_counts(groups[0]))


def bytes_per_block_slots(groups: Sequence[KVCacheGroupSpec]) -> int:
    """Version A: one slot per (page size, ordinal within its group), shared across groups:
    sum over page sizes of page x (most layers of that size in any one group)."""
    slots: Counter = Counter()
    for g in groups:
        slots |= _page_counts(g)  # Counter union keeps the larger count
    return sum(page * count for page, count in slots.items())
