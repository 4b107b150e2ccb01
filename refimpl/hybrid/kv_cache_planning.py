"""The planner: which layers share a block table, and how the cache tensors are laid out
(vLLM's `kv_cache_planning.py`; vLLM 0.32 keeps the same functions in `kv_cache_utils.py`).

This is planner C, what vLLM 0.32/0.33 run and refimpl's default:
- `get_kv_cache_groups(specs)` puts layers into cache groups (`get_packed_kv_cache_groups` for
  DeepSeek V4's pages of several sizes, split by `approximate_gcd`);
- `get_kv_cache_config(groups, available_memory)` turns groups and a byte budget into a
  `KVCacheConfig`: one block-outermost slab of `num_blocks x block_stride` bytes, one tensor
  per group and spec run.
The planners vLLM ran before (V0, A and the article's B) live in `older_planners.py`, for the
chapters that compare them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace

from refimpl.hybrid.kv_cache_interface import (
    AttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    cdiv,
    round_up,
)
from refimpl.validation import check_int_at_least, check_positive_int, is_integer

GIB = 1 << 30


# --- grouping


def padding_for(values: Sequence[int], d: int) -> int:
    """Total amount each value must grow to reach a multiple of d."""
    return sum((d - x % d) % d for x in values)


def approximate_gcd(values: Sequence[int], lower_bound: int | None = None) -> int:
    """The d in [max(1, lower_bound), max(values)] that needs the least round-up padding.

    Ties go to the larger d. If the lower bound is above every value, it is returned as is.
    DeepSeek V4 passes the MLA group's tuple count as the lower bound so that group is never
    split: `approximate_gcd([31, 61, 31, 30], 31) == 31` (padding 2).
    """
    values = list(values)
    if not values:
        raise ValueError("approximate_gcd needs at least one value")
    for x in values:
        check_positive_int("each approximate_gcd value", x)
    if lower_bound is not None and not is_integer(lower_bound):
        raise ValueError(f"lower_bound must be an int or None, got {lower_bound!r}")
    lo = max(1, lower_bound or 1)
    hi = max(values)
    if lo > hi:
        return lo
    best_d, best_pad = lo, None
    for d in range(lo, hi + 1):
        pad = padding_for(values, d)
        if best_pad is None or pad <= best_pad:  # "<=": the larger d wins a tie
            best_d, best_pad = d, pad
    return best_d


def padding_curve(values: Sequence[int], lower_bound: int | None = None) -> dict[int, int]:
    """{d: padding} over approximate_gcd's search range (for plots and tables)."""
    lo = max(1, lower_bound or 1)
    return {d: padding_for(values, d) for d in range(lo, max(values) + 1)}


def get_packed_kv_cache_groups(
    specs: Mapping[str, KVCacheSpec],
) -> list[KVCacheGroupSpec] | None:
    """Planner C's grouping (vLLM 0.32/0.33 `_get_packed_kv_cache_groups`), or None when every
    page has one size.

    1. Buckets are found greedily in registration order: a layer joins the first bucket it
      keeps
       uniform-type (same block size and kind, same window), else opens a new one. So the first
       layer decides the order: DeepSeek V4 registers a sliding-window cache first, and the SWA
       groups come before the MLA group (B put MLA first by construction).
    2. A bucket is *balanced* when each of its page sizes has the same number of layers (a
       repeating pattern, one layer of each size per repeat). Unbalanced buckets stay whole.
    3. The repeats per group: `approximate_gcd` of the balanced buckets' repeat counts, never
       below the largest balanced bucket that mixes page sizes (that one cannot be split).
    4. Balanced buckets are split into `cdiv(repeats, d)` groups, taking every n-th repeat.
       Without any mixed balanced bucket, sliding-window buckets are split instead so each
       group fits into the widest group's block.
    """
    if len({s.page_size_bytes for s in specs.values()}) <= 1:
        return None
    buckets: list[dict[str, KVCacheSpec]] = []
    for name, spec in specs.items():
        for bucket in buckets:
            if UniformTypeKVCacheSpecs.is_uniform_type({**bucket, name: spec}):
                bucket[name] = spec
                break
        else:
            buckets.append({name: spec})

    bucketed = []
    for bucket in buckets:
        merged = UniformTypeKVCacheSpecs.from_specs(bucket)
        if merged is None:  # a spec type that cannot be merged at all
            raise ValueError(
                f"cannot pack layer specs of type {type(next(iter(bucket.values()))).__name__}"
            )
        by_page: dict[int, list[str]] = {}
        for name, spec in bucket.items():
            by_page.setdefault(spec.page_size_bytes, []).append(name)
        balanced = len({len(names) for names in by_page.values()}) == 1
        bucketed.append((merged, by_page, balanced))

    min_repeats = max(
        (
            m.get_num_layer_tuples()
            for m, by_page, balanced in bucketed
            if balanced and len(by_page) > 1
        ),
        default=0,
    )
    repeats = (
        approximate_gcd(
            [m.get_num_layer_tuples() for m, _, balanced in bucketed if balanced],
            lower_bound=min_repeats,
        )
        if min_repeats
        else None
    )

    def num_groups_for(merged: UniformTypeKVCacheSpecs, balanced: bool) -> int:
        return (
            cdiv(merged.get_num_layer_tuples(), repeats)
            if balanced and repeats is not None
            else 1
        )

    def widest_group_bytes(by_page: dict[int, list[str]], n: int) -> int:
        return sum(cdiv(len(names), n) * page for page, names in by_page.items())

    def is_state_bucket(merged: UniformTypeKVCacheSpecs) -> bool:
        return repeats is None and isinstance(merged.first_spec, SlidingWindowSpec)

    anchor_bytes = max(
        widest_group_bytes(
            by_page,
            len(m.kv_cache_specs) if is_state_bucket(m) else num_groups_for(m, balanced),
        )
        for m, by_page, balanced in bucketed
    )
    groups: list[KVCacheGroupSpec] = []
    for merged, by_page, balanced in bucketed:
        n = num_groups_for(merged, balanced)
        if anchor_bytes and is_state_bucket(merged):
            per_block = max(anchor_bytes // merged.first_spec.page_size_bytes, 1)
            n = max(n, cdiv(len(merged.kv_cache_specs), per_block))
        if n == 1:
            groups.append(KVCacheGroupSpec(list(merged.kv_cache_specs), merged))
            continue
        repeats_list = list(zip(*by_page.values()))
        for i in range(n):
            names = [name for repeat in repeats_list[i::n] for name in repeat]
            members = {name: merged.kv_cache_specs[name] for name in names}
            groups.append(KVCacheGroupSpec(names, UniformTypeKVCacheSpecs.from_specs(members)))
    return groups


def unify_kv_cache_spec_page_size(specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """Grow smaller pages to the largest one by giving those layers bigger blocks.

    Only works when the largest page is a whole multiple of each smaller page.
    """
    pages = {s.page_size_bytes for s in specs.values()}
    if len(pages) <= 1:
        return dict(specs)
    largest = max(pages)
    unified = {}
    for name, spec in specs.items():
        page = spec.page_size_bytes
        if page == largest:
            unified[name] = spec
            continue
        if largest % page != 0:
            raise ValueError(
                f"cannot unify page sizes {sorted(pages)}: {name}'s page {page} B does not "
                "divide "
                f"the largest page {largest} B"
            )
        if not isinstance(spec, AttentionSpec) or spec.page_size_padded is not None:
            raise ValueError(
                f"cannot unify page sizes {sorted(pages)}: {name} has a fixed (padded) page, "
                "so a "
                f"bigger block would not give exactly {largest} B"
            )
        unified[name] = _with_block_size(spec, spec.block_size * (largest // page))
    return unified


def _with_block_size(spec: AttentionSpec, block_size: int) -> AttentionSpec:
    return replace(spec, block_size=block_size)


def _get_kv_cache_groups_uniform_page_size(
    specs: Mapping[str, KVCacheSpec],
) -> list[KVCacheGroupSpec]:
    """General hybrid path: same-spec layers, split into groups of equal size, interleaved.

    The group size is the smallest count among spec types (the "1" of an n:1 pattern), or the
    largest count when all counts are within 25% of each other (fewer padding slots).
    """
    same_spec: dict[KVCacheSpec, list[str]] = defaultdict(list)
    for name, spec in specs.items():
        same_spec[spec].append(name)
    counts = [len(names) for names in same_spec.values()]
    group_size = min(counts)
    if max(counts) < group_size * 1.25:
        group_size = max(counts)
    groups = []
    for spec, names in same_spec.items():
        n = cdiv(len(names), group_size)
        for i in range(n):
            groups.append(KVCacheGroupSpec(names[i::n], spec))
    return groups


def annotate_eagle_groups(
    specs: Mapping[str, KVCacheSpec],
    groups: list[KVCacheGroupSpec],
    require_deepseek_v4: bool = True,
) -> list[KVCacheGroupSpec]:
    """Flag the group holding the last registered layer (the MTP layer's SWA cache).

    Planner B does this only for DeepSeek V4 specs (`require_deepseek_v4`)."""
    if not specs:
        return groups
    if require_deepseek_v4 and not any(
        getattr(s, "model_version", None) == "deepseek_v4" for s in specs.values()
    ):
        return groups
    last = next(reversed(list(specs)))
    return [
        KVCacheGroupSpec(g.layer_names, g.kv_cache_spec, is_eagle_group=True)
        if last in g.layer_names
        else g
        for g in groups
    ]


def annotate_last_layer_eagle_group(
    specs: Mapping[str, KVCacheSpec], groups: list[KVCacheGroupSpec]
) -> list[KVCacheGroupSpec]:
    """Planner C's eagle rule: the MTP layer registers last, so flag the group that holds the
    last registered layer, but only when the groups cover every layer exactly once."""
    names = [n for g in groups for n in g.layer_names]
    if len(names) != len(specs) or set(names) != set(specs):
        return groups
    return annotate_eagle_groups({**specs}, groups, require_deepseek_v4=False)


def get_kv_cache_groups(
    specs: Mapping[str, KVCacheSpec], *, use_eagle: bool = False
) -> list[KVCacheGroupSpec]:
    """Group the layers of `specs` ({layer name: spec}, registration order) into cache groups.

    This is planner C, what vLLM 0.32/0.33 run; the article's planner B is
    `older_planners.get_kv_cache_groups_b`. In order: every spec equal ->
    one group; one `UniformTypeKVCacheSpecs` fits -> one group; pages of several sizes ->
    `get_packed_kv_cache_groups`; otherwise the general hybrid path on unified page sizes.
    `use_eagle=True` (speculative decoding with an MTP/eagle layer) flags the group that holds
    the last registered layer.
    """
    if not isinstance(specs, Mapping):
        raise TypeError(
            f"specs must be a dict {{layer name: KVCacheSpec}}, got {type(specs).__name__}"
        )
    if not specs:
        raise ValueError(
            "specs is empty: a model without attention layers has no KV cache to group"
        )
    bad = [name for name, spec in specs.items() if not isinstance(spec, KVCacheSpec)]
    if bad:
        raise TypeError(
            f"specs[{bad[0]!r}] must be a KVCacheSpec, got {type(specs[bad[0]]).__name__}"
        )
    values = list(specs.values())
    if all(v == values[0] for v in values):
        return [KVCacheGroupSpec(list(specs), values[0])]
    uniform = UniformTypeKVCacheSpecs.from_specs(specs)
    if uniform is not None:
        return [KVCacheGroupSpec(list(specs), uniform)]
    groups = get_packed_kv_cache_groups(specs)
    if groups is None:
        groups = _get_kv_cache_groups_uniform_page_size(unify_kv_cache_spec_page_size(specs))
    return annotate_last_layer_eagle_group(specs, groups) if use_eagle else groups


# --- layout


def _check_memory(available_memory: int) -> None:
    check_int_at_least("available_memory", available_memory, 0, " (bytes)")


def _num_blocks(available_memory: int, bytes_per_block: int, override: int | None) -> int:
    """Blocks that fit in the budget, or the override (which replaces the budget's answer)."""
    if override is not None:
        return check_int_at_least(
            "num_blocks_override", override, 2, " (block 0 is the null block)"
        )
    num_blocks = available_memory // bytes_per_block
    if num_blocks < 1:
        raise ValueError(
            f"available_memory {available_memory} B is smaller than one block "
            f"({bytes_per_block} B); give at least {bytes_per_block} B or set "
            "num_blocks_override"
        )
    return num_blocks


def check_layers_unique(groups: Sequence[KVCacheGroupSpec]) -> None:
    """A layer belongs to exactly one group (its block table); refuse a layout that repeats
    one."""
    names = [n for g in groups for n in g.layer_names]
    if len(names) != len(set(names)):
        raise ValueError("a layer appears in more than one group")


def get_kv_cache_bytes_per_block(groups: Sequence[KVCacheGroupSpec]) -> int:
    """Planner C's block stride: the widest group, rounded up to a common multiple of every
    layer's `block_stride_alignment` (its page at the kernel block size when the backend splits
    a block into smaller kernel blocks; 1 otherwise)."""
    widest = max(g.width_bytes for g in groups)
    if widest <= 0:
        raise ValueError("a packed layout needs at least one layer with a non-empty page")
    alignments = [
        g.layer_spec(n).block_stride_alignment() for g in groups for n in g.layer_names
    ]
    return round_up(widest, math.lcm(*alignments))


def get_kv_cache_config(
    groups: Sequence[KVCacheGroupSpec],
    available_memory: int,
    num_blocks_override: int | None = None,
) -> KVCacheConfig:
    """Plan the cache tensors for `groups` within `available_memory` bytes (planner C: vLLM
    0.32/0.33 `get_kv_cache_config_from_groups`, block-outermost layout).

    Every group starts at byte 0 of a block (groups overlay: a block id belongs to one group at
    a time). Inside a group, the layers are taken spec by spec: all layers with one (equal)
    spec form a run, in first-seen order, and one `KVCacheTensor` per run lists them with
    `layer_stride` = their page. Any list of groups is accepted, so hand-made layouts can be
    compared with the real grouping. Raises ValueError when the budget is smaller than one
    block (unless `num_blocks_override` is given). The article's planner B is
    `older_planners.get_kv_cache_config_b`.
    """
    _check_memory(available_memory)
    if isinstance(groups, (str, bytes, Mapping)) or not isinstance(groups, Sequence):
        raise TypeError(
            f"groups must be a list of KVCacheGroupSpec, got {type(groups).__name__}"
        )
    groups = list(groups)
    if not groups:
        raise ValueError(
            "groups is empty: there is no cache to lay out (get_kv_cache_groups gives at "
            "least one)"
        )
    bad = [g for g in groups if not isinstance(g, KVCacheGroupSpec)]
    if bad:
        raise TypeError(f"groups must hold KVCacheGroupSpec, got {type(bad[0]).__name__}")
    check_layers_unique(groups)
    block_stride = get_kv_cache_bytes_per_block(groups)
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
            tensors.append(
                KVCacheTensor(
                    size=size,
                    shared_by=tuple(names),
                    offset=offset,
                    block_stride=block_stride,
                    layer_stride=page,
                )
            )
            offset += len(names) * page
    return KVCacheConfig(num_blocks, tensors, groups)
