"""Put layers into KV-cache groups: layers of one group share one block table.

Two planner versions. C (`layout_version="C"`, the default) is what vLLM 0.32/0.33 run: after the
one-group cases, `get_packed_kv_cache_groups` buckets the layers greedily in registration order
and splits only the balanced buckets (see its docstring). B (`layout_version="B"`) is the version
the vLLM KV-cache article describes; `get_kv_cache_groups(specs, layout_version="B")` tries, in
order (as vLLM v1's `get_kv_cache_groups` in `kv_cache_utils.py` did then):

1. no layers                        -> no groups (an attention-free model);
2. every spec equal                  -> one group;
3. one `UniformTypeKVCacheSpecs` fits -> one group (DeepSeek V3.2: MLA + indexer);
4. `group_and_unify_kv_cache_specs`  -> the DeepSeek V4 path: one MLA group plus sliding-window
   buckets, each bucket split into groups of about the same number of "layer tuples";
5. otherwise the general hybrid path: same-spec layers are split into equal-size groups that
   all use one page size.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from refimpl.hybrid.specs import (
    AttentionSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    cdiv,
)
from refimpl.validation import check_positive_int, is_integer


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


def group_and_unify_kv_cache_specs(
    specs: Mapping[str, KVCacheSpec],
) -> list[UniformTypeKVCacheSpecs] | None:
    """DeepSeek V4 bucketing: [all MLA layers, one bucket per (block_size, sliding_window)].

    Returns None when there is no `SlidingWindowMLASpec` or when every page has one size (then
    a simpler path applies). Buckets appear in the order their key is first seen in `specs`.
    Specs of other types are ignored, as in vLLM.
    """
    if not any(isinstance(s, SlidingWindowMLASpec) for s in specs.values()):
        return None
    if len({s.page_size_bytes for s in specs.values()}) == 1:
        return None
    mla: dict[str, KVCacheSpec] = {}
    buckets: dict[tuple[int, int], dict[str, KVCacheSpec]] = {}
    for name, spec in specs.items():
        if isinstance(spec, SlidingWindowMLASpec):
            buckets.setdefault((spec.block_size, spec.sliding_window), {})[name] = spec
        elif isinstance(spec, MLAAttentionSpec):
            mla[name] = spec
    if not mla:
        raise ValueError("the DeepSeek V4 grouping needs at least one MLAAttentionSpec layer")
    grouped = []
    for members in [mla, *buckets.values()]:
        merged = UniformTypeKVCacheSpecs.from_specs(members)
        if merged is None:
            raise ValueError("layers of one DeepSeek V4 bucket do not share a block size")
        grouped.append(merged)
    return grouped


def split_bucket(bucket: UniformTypeKVCacheSpecs, num_layer_tuples: int) -> list[list[str]]:
    """Split a bucket into cdiv(tuples, d) layer lists, taking every n-th tuple (interleaved).

    A tuple holds one layer of each page size, in page-size first-seen order; group i gets
    tuples i, i+n, i+2n, ... so Pro's 61 SWA layers become the even layers (31) and the odd
    layers (30).
    """
    by_page: dict[int, list[str]] = {}
    for name, spec in bucket.kv_cache_specs.items():
        by_page.setdefault(spec.page_size_bytes, []).append(name)
    lengths = {len(names) for names in by_page.values()}
    if len(lengths) != 1:
        raise ValueError(
            f"a sliding-window bucket needs the same number of layers per page size, got "
            f"{ {page: len(names) for page, names in by_page.items()} }"
        )
    tuples = list(zip(*by_page.values()))
    n = cdiv(len(tuples), num_layer_tuples)
    return [[name for t in tuples[i::n] for name in t] for i in range(n)]


def _get_kv_cache_groups_uniform_groups(
    grouped: Sequence[UniformTypeKVCacheSpecs],
) -> list[KVCacheGroupSpec]:
    """The MLA bucket becomes group 0 whole; each other bucket is split by the approximate gcd."""
    mla = grouped[0]
    if not all(isinstance(s, MLAAttentionSpec) for s in mla.kv_cache_specs.values()):
        raise ValueError("the first DeepSeek V4 bucket must hold only MLAAttentionSpec layers")
    groups = [KVCacheGroupSpec(list(mla.kv_cache_specs), mla)]
    tuples_per_bucket = [b.get_num_layer_tuples() for b in grouped]
    d = approximate_gcd(tuples_per_bucket, lower_bound=tuples_per_bucket[0])
    for bucket in grouped[1:]:
        for names in split_bucket(bucket, d):
            members = {name: bucket.kv_cache_specs[name] for name in names}
            groups.append(KVCacheGroupSpec(names, UniformTypeKVCacheSpecs.from_specs(members)))
    return groups


def annotate_eagle_groups(
    specs: Mapping[str, KVCacheSpec], groups: list[KVCacheGroupSpec], require_deepseek_v4: bool = True
) -> list[KVCacheGroupSpec]:
    """Flag the group holding the last registered layer (the MTP layer's SWA cache).

    Planner B does this only for DeepSeek V4 specs (`require_deepseek_v4`)."""
    if not specs:
        return groups
    if require_deepseek_v4 and not any(getattr(s, "model_version", None) == "deepseek_v4" for s in specs.values()):
        return groups
    last = next(reversed(list(specs)))
    return [
        KVCacheGroupSpec(g.layer_names, g.kv_cache_spec, is_eagle_group=True) if last in g.layer_names else g
        for g in groups
    ]


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
                f"cannot unify page sizes {sorted(pages)}: {name}'s page {page} B does not divide "
                f"the largest page {largest} B"
            )
        if not isinstance(spec, AttentionSpec) or spec.page_size_padded is not None:
            raise ValueError(
                f"cannot unify page sizes {sorted(pages)}: {name} has a fixed (padded) page, so a "
                f"bigger block would not give exactly {largest} B"
            )
        unified[name] = _with_block_size(spec, spec.block_size * (largest // page))
    return unified


def _with_block_size(spec: AttentionSpec, block_size: int) -> AttentionSpec:
    from dataclasses import replace

    return replace(spec, block_size=block_size)


def _get_kv_cache_groups_uniform_page_size(specs: Mapping[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
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


LAYOUT_VERSIONS = ("B", "C")


def check_layout_version(layout_version: str) -> str:
    """"B" (the planner the vLLM KV-cache article describes) or "C" (vLLM 0.32/0.33)."""
    if layout_version not in LAYOUT_VERSIONS:
        raise ValueError(f"layout_version must be one of {LAYOUT_VERSIONS}, got {layout_version!r}")
    return layout_version


def get_packed_kv_cache_groups(specs: Mapping[str, KVCacheSpec]) -> list[KVCacheGroupSpec] | None:
    """Planner C's grouping (vLLM 0.32/0.33 `_get_packed_kv_cache_groups`), or None when every
    page has one size.

    1. Buckets are found greedily in registration order: a layer joins the first bucket it keeps
       uniform-type (same block size and kind, same window), else opens a new one. So the first
       layer decides the order: DeepSeek V4 registers a sliding-window cache first, and the SWA
       groups come before the MLA group (B put MLA first by construction).
    2. A bucket is *balanced* when each of its page sizes has the same number of layers (a
       repeating pattern, one layer of each size per repeat). Unbalanced buckets stay whole.
    3. The repeats per group: `approximate_gcd` of the balanced buckets' repeat counts, never
       below the largest balanced bucket that mixes page sizes (that one cannot be split).
    4. Balanced buckets are split into `cdiv(repeats, d)` groups, taking every n-th repeat.
       Without any mixed balanced bucket, sliding-window buckets are split instead so each group
       fits into the widest group's block.
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
            raise ValueError(f"cannot pack layer specs of type {type(next(iter(bucket.values()))).__name__}")
        by_page: dict[int, list[str]] = {}
        for name, spec in bucket.items():
            by_page.setdefault(spec.page_size_bytes, []).append(name)
        balanced = len({len(names) for names in by_page.values()}) == 1
        bucketed.append((merged, by_page, balanced))

    min_repeats = max(
        (m.get_num_layer_tuples() for m, by_page, balanced in bucketed if balanced and len(by_page) > 1),
        default=0,
    )
    repeats = (
        approximate_gcd([m.get_num_layer_tuples() for m, _, balanced in bucketed if balanced], lower_bound=min_repeats)
        if min_repeats
        else None
    )

    def num_groups_for(merged: UniformTypeKVCacheSpecs, balanced: bool) -> int:
        return cdiv(merged.get_num_layer_tuples(), repeats) if balanced and repeats is not None else 1

    def widest_group_bytes(by_page: dict[int, list[str]], n: int) -> int:
        return sum(cdiv(len(names), n) * page for page, names in by_page.items())

    def is_state_bucket(merged: UniformTypeKVCacheSpecs) -> bool:
        return repeats is None and isinstance(merged.first_spec, SlidingWindowSpec)

    anchor_bytes = max(
        widest_group_bytes(by_page, len(m.kv_cache_specs) if is_state_bucket(m) else num_groups_for(m, balanced))
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
    specs: Mapping[str, KVCacheSpec], *, use_eagle: bool = False, layout_version: str = "C"
) -> list[KVCacheGroupSpec]:
    """Group the layers of `specs` ({layer name: spec}, registration order) into cache groups.

    `layout_version`: "C" (default) is what vLLM 0.32/0.33 run (`get_packed_kv_cache_groups`);
    "B" is the version the vLLM KV-cache article describes (one MLA group first, then the
    sliding-window buckets split by the approximate gcd).
    `use_eagle=True` (speculative decoding with an MTP/eagle layer) flags the group that holds
    the last registered layer (B: only for DeepSeek V4 specs).
    """
    check_layout_version(layout_version)
    if not specs:
        return []
    values = list(specs.values())
    if all(v == values[0] for v in values):
        return [KVCacheGroupSpec(list(specs), values[0])]
    uniform = UniformTypeKVCacheSpecs.from_specs(specs)
    if uniform is not None:
        return [KVCacheGroupSpec(list(specs), uniform)]
    if layout_version == "C":
        groups = get_packed_kv_cache_groups(specs)
        if groups is None:
            groups = _get_kv_cache_groups_uniform_page_size(unify_kv_cache_spec_page_size(specs))
        return annotate_last_layer_eagle_group(specs, groups) if use_eagle else groups
    grouped = group_and_unify_kv_cache_specs(specs)
    if grouped is not None:
        groups = _get_kv_cache_groups_uniform_groups(grouped)
        return annotate_eagle_groups(specs, groups) if use_eagle else groups
    return _get_kv_cache_groups_uniform_page_size(unify_kv_cache_spec_page_size(specs))
