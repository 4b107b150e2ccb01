"""The planners vLLM ran before planner C, kept for the chapters that compare them.

- V0 (`bytes_per_block_v0`): every layer tuple reserves one page of each distinct MLA page
  size;
- A (`bytes_per_block_slots`): one slot per (page size, ordinal within its group), shared by
  groups;
- B (`get_kv_cache_groups_b`, `get_kv_cache_config_b`, `bytes_per_block_b`): the version the
  article "vllm分析(四)——kv cache初始化" describes. Grouping: one MLA group first, then the
  sliding-window buckets (`group_and_unify_kv_cache_specs`), each split by the approximate gcd.
  Layout, four cases: no groups -> one block (the null block) and no tensors; one group of one
  `UniformTypeKVCacheSpecs` -> one tensor per layer sized by its own page; packed (every group
  uniform-type, or cross-layer blocks requested) -> one slab of `num_blocks x block_stride`
  bytes, each group laid out densely from byte 0 of a block, one tensor per byte offset;
  general -> all groups share one page size and tensor i is shared by the i-th layer of each
  group.
- the article's hypothetical two-group plan (`two_group_layout`): one MLA group and one unsplit
  sliding-window group, which no planner builds; the plan command prints it on request.
What vLLM runs today is planner C, in `kv_cache_planning.py`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from refimpl.hybrid.deepseek_v4 import parse_layer_name
from refimpl.hybrid.kv_cache_interface import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    UniformTypeKVCacheSpecs,
    cdiv,
)
from refimpl.hybrid.kv_cache_planning import (
    _check_memory,
    _get_kv_cache_groups_uniform_page_size,
    _num_blocks,
    annotate_eagle_groups,
    approximate_gcd,
    check_layers_unique,
    get_kv_cache_config,
    get_kv_cache_groups,
    unify_kv_cache_spec_page_size,
)

# --- planner B: grouping


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
    """The MLA bucket becomes group 0 whole; each other bucket is split by the approximate
    gcd."""
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


def get_kv_cache_groups_b(
    specs: Mapping[str, KVCacheSpec], *, use_eagle: bool = False
) -> list[KVCacheGroupSpec]:
    """Planner B's grouping, in order (as vLLM v1's `get_kv_cache_groups` did then):

    1. no layers -> no groups (an attention-free model);
    2. every spec equal -> one group;
    3. one `UniformTypeKVCacheSpecs` fits -> one group (DeepSeek V3.2: MLA + indexer);
    4. `group_and_unify_kv_cache_specs` -> the DeepSeek V4 path: one MLA group plus
      sliding-window
       buckets, each bucket split into groups of about the same number of "layer tuples";
    5. otherwise the general hybrid path: same-spec layers split into equal-size groups that
      all
       use one page size.
    `use_eagle=True` flags the group holding the last registered layer, for DeepSeek V4 specs
    only.
    """
    if not specs:
        return []
    values = list(specs.values())
    if all(v == values[0] for v in values):
        return [KVCacheGroupSpec(list(specs), values[0])]
    uniform = UniformTypeKVCacheSpecs.from_specs(specs)
    if uniform is not None:
        return [KVCacheGroupSpec(list(specs), uniform)]
    grouped = group_and_unify_kv_cache_specs(specs)
    if grouped is not None:
        groups = _get_kv_cache_groups_uniform_groups(grouped)
        return annotate_eagle_groups(specs, groups) if use_eagle else groups
    return _get_kv_cache_groups_uniform_page_size(unify_kv_cache_spec_page_size(specs))


# --- planner B: layout


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
    """Packed when every group is uniform-type (DeepSeek V4) or when cross-layer blocks are
    on."""
    if all(isinstance(g.kv_cache_spec, UniformTypeKVCacheSpecs) for g in groups):
        return True
    return enable_cross_layers_blocks and len(groups) > 1


def uniform_page_size(groups: Sequence[KVCacheGroupSpec]) -> int:
    pages = {g.kv_cache_spec.page_size_bytes for g in groups}
    if len(pages) != 1:
        raise ValueError(
            f"the general layout needs one page size across groups, got {sorted(pages)}"
        )
    return pages.pop()


def bytes_per_block_b(
    groups: Sequence[KVCacheGroupSpec], enable_cross_layers_blocks: bool = False
) -> int:
    """Bytes that one more block id costs under planner B (the divisor of the memory
    budget)."""
    groups = list(groups)
    if not groups:
        return 0
    if len(groups) == 1 and isinstance(groups[0].kv_cache_spec, UniformTypeKVCacheSpecs):
        return groups[0].kv_cache_spec.page_size_bytes
    if use_packed_kv_cache_config(groups, enable_cross_layers_blocks):
        return get_packed_kv_cache_layout(groups)[0]
    return uniform_page_size(groups) * max(len(g.layer_names) for g in groups)


def get_kv_cache_config_b(
    groups: Sequence[KVCacheGroupSpec],
    available_memory: int,
    num_blocks_override: int | None = None,
    *,
    enable_cross_layers_blocks: bool = False,
) -> KVCacheConfig:
    """Planner B's layout: the cache tensors for `groups` within `available_memory` bytes.

    Any list of groups is accepted, so hand-made layouts (such as the vLLM KV-cache article's
    MLA + one unsplit SWA group) can be compared with the real grouping. Raises ValueError when
    the budget is smaller than one block (unless `num_blocks_override` is given). Planner C
    (`kv_cache_planning.get_kv_cache_config`) lists one tensor per group and spec run instead
    of one per byte offset.
    """
    _check_memory(available_memory)
    groups = list(groups)
    check_layers_unique(groups)
    if not groups:
        # An attention-free model still needs one block: the block pool's null block.
        return KVCacheConfig(num_blocks=1, kv_cache_tensors=(), kv_cache_groups=())

    if len(groups) == 1 and isinstance(groups[0].kv_cache_spec, UniformTypeKVCacheSpecs):
        group = groups[0]
        num_blocks = _num_blocks(
            available_memory, group.kv_cache_spec.page_size_bytes, num_blocks_override
        )
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
            KVCacheTensor(
                size=size,
                shared_by=tuple(layers_by_offset[offset]),
                offset=offset,
                block_stride=block_stride,
            )
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


# --- planners V0 and A: bytes per block only


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


# --- planners side by side

#: {version: (get groups, get config)} for the chapters and the CLI that compare B with C.
PLANNERS = {
    "B": (get_kv_cache_groups_b, get_kv_cache_config_b),
    "C": (get_kv_cache_groups, get_kv_cache_config),
}


# --- the article's hypothetical plan: one MLA group, one unsplit sliding-window group


def article_layer_order(names: list[str]) -> list[str]:
    """Reorder MLA-group names the way the article's offset walk does: per layer the main
    attention first, then the indexer (vLLM registers the indexer first)."""
    rank = {"attn": 0, "idx": 1}
    return sorted(
        names, key=lambda n: (parse_layer_name(n)[0], rank.get(parse_layer_name(n)[1], 2))
    )


def two_group_layout(
    specs: dict[str, KVCacheSpec], article_order: bool = False
) -> list[KVCacheGroupSpec]:
    """The article's hypothetical plan: one MLA group and one unsplit SWA group (states left
    out).

    The real grouping never builds it (the gcd rule always splits the SWA bucket); it is here
    so its stride (2,283,840 B for Pro) can be compared with the real one. `article_order=True`
    lists each ratio-4 layer's main attention before its indexer, as the article's offsets
    assume.
    """
    grouped = group_and_unify_kv_cache_specs(specs)
    if grouped is None:
        raise ValueError("these specs do not take the DeepSeek V4 grouping path")
    mla, swa = grouped[0], grouped[1]
    mla_names = list(mla.kv_cache_specs)
    if article_order:
        mla_names = article_layer_order(mla_names)
    return [KVCacheGroupSpec(mla_names, mla), KVCacheGroupSpec(list(swa.kv_cache_specs), swa)]
