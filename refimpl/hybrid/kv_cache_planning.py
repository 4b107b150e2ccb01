"""The planner: which layers share a block table, and how the cache tensors are laid out
(vLLM 0.32 keeps these functions in `vllm/v1/core/kv_cache_utils.py`; refimpl gives them a file
of their own, as vLLM's newer releases do with `kv_cache_planning.py`).

This is planner C, vLLM 0.32's general path and refimpl's default, in vLLM's call order:
- `get_kv_cache_groups(specs)` puts layers into cache groups. Every spec mergeable into one ->
  one group; one uniform type (same block size and freeing rule) -> one group of several
  pages; pages of several sizes and a block-outermost layout -> `get_packed_kv_cache_groups`
  (DeepSeek V4, whose backends ask for BLHNC); otherwise `unify_kv_cache_spec_page_size`
  (bigger blocks, or padded pages) and `_get_kv_cache_groups_uniform_page_size` (merge
  compatible specs, then groups of equal size by the 1.5 rule).
- `get_kv_cache_config(groups, available_memory)` turns groups and a byte budget into a
  `KVCacheConfig` (vLLM's `get_kv_cache_config_from_groups`): block count and tensors, laid out
  block-outermost (one slab, groups overlaid) or layer-outermost (one region per layer).
- `align_hybrid_block_size` is the step vLLM's platform runs before any spec exists for
  attention + Mamba models: the attention block grows until its page holds a Mamba state, and
  the state is padded to that page.
vLLM 0.33.0 (its source read, its functions run by `make crosscheck-033`) keeps these names
in `vllm/v1/core/kv_cache_planning.py`, with the memory check and `estimate_max_model_len`;
`get_max_concurrency_for_kv_cache_config` and `get_kv_cache_capacity` stay in
`kv_cache_utils.py`. Grouping moves out of `get_kv_cache_configs` into
`get_global_kv_cache_groups`, whose groups it now receives; both go through a
`KVCacheConfigBuilder` (`kv_cache_config_builder.py`) whose default calls the same
`get_kv_cache_groups` and `get_kv_cache_config_from_groups`. Eagle groups are flagged there:
those holding a layer whose spec says `is_draft` (0.32: a spec marker, or the last layer).
On the crosscheck's fuzzed cases, the real configs' specs and DeepSeek V4's layers, 0.33 prints
the same groups, block and page sizes, blocks, tensors, tokens and concurrency as 0.32. One
rule is new: in Mamba "align" mode the attention block is also rounded to a multiple of the
prefill checkpoint alignment that every Mamba layer declares (64 tokens for GDN on FlashInfer,
16 for KDA on FlashKDA; none by default), so such models can get bigger blocks, and other
block and token counts. refimpl keeps 0.32's rule.
The planners vLLM ran before (V0, A and the article's B) live in `older_planners.py`.
The capacity figures (tokens, concurrency, the memory check) are in `kv_cache_utils.py`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace

from refimpl.hybrid.kv_cache_interface import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    SpecMergeError,
    UniformTypeKVCacheSpecs,
    cdiv,
    round_up,
)
from refimpl.hybrid.kv_cache_layout import DEEPSEEK_V4_LAYOUT, DEFAULT_LAYOUT, KVCacheLayout
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


def resolve_kv_cache_layout(
    specs: Mapping[str, KVCacheSpec] | Sequence[KVCacheSpec],
    kv_cache_layout: str | KVCacheLayout | None = None,
) -> KVCacheLayout:
    """The layout vLLM's engine core settles on, when `kv_cache_layout` does not name one.

    vLLM takes the layouts every attention backend declares, most preferred first; DeepSeek
    V4's indexer and sparse backends declare block-outermost layouts only (BLHNC first), and
    backends that declare nothing follow vLLM's default preference, LBNHC first. refimpl knows
    no backend, so it reads the model from the specs: DeepSeek V4's kinds (`model_version`
    "deepseek_v4", compressed entries, or sliding-window MLA caches, which only V4 builds,
    Part III's float32 ones included) -> BLHNC, anything else -> LBNHC. Give the backend's
    layout explicitly when it declares one (vLLM's CPU backend: LBHNC).
    """
    if kv_cache_layout is not None:
        return KVCacheLayout.from_name(kv_cache_layout)
    values = specs.values() if isinstance(specs, Mapping) else specs
    layer_specs = [
        s for v in values for s in (v.kv_cache_specs.values() if _is_uniform(v) else (v,))
    ]
    if any(_is_deepseek_v4_kind(s) for s in layer_specs):
        return DEEPSEEK_V4_LAYOUT
    return DEFAULT_LAYOUT


def _is_deepseek_v4_kind(spec: KVCacheSpec) -> bool:
    return (
        getattr(spec, "model_version", None) == "deepseek_v4"
        or getattr(spec, "compress_ratio", 1) > 1
        or isinstance(spec, SlidingWindowMLASpec)
    )


def _is_uniform(spec: KVCacheSpec) -> bool:
    return isinstance(spec, UniformTypeKVCacheSpecs)


def get_packed_kv_cache_groups(
    specs: Mapping[str, KVCacheSpec],
    kv_cache_layout: str | KVCacheLayout | None = None,
) -> list[KVCacheGroupSpec] | None:
    """Planner C's grouping for pages of several sizes (vLLM 0.32's
    `_get_packed_kv_cache_groups`), or None when the layout is not block-outermost or every
    page has one size.

    Packing pages of different sizes side by side in one block needs the block axis outermost
    (the layout gate); vLLM's other layouts go through page unification instead.
    1. Buckets are found greedily in registration order: a layer joins the first bucket it
       keeps uniform-type (same block size and kind, same window), else opens a new one. So
       the first layer decides the order: DeepSeek V4 registers a sliding-window cache first,
       and the SWA groups come before the MLA group (B put MLA first by construction).
    2. A bucket is *balanced* when each of its page sizes has the same number of layers (a
       repeating pattern, one layer of each size per repeat). Unbalanced buckets stay whole.
    3. The repeats per group: `approximate_gcd` of the balanced buckets' repeat counts, never
       below the largest balanced bucket that mixes page sizes (that one cannot be split).
    4. Balanced buckets are split into `cdiv(repeats, d)` groups, taking every n-th repeat.
       State buckets (Mamba, and sliding windows when nothing fixed the repeats) are split
       instead so each group fits into the block the other groups already need.
    """
    layout = resolve_kv_cache_layout(specs, kv_cache_layout)
    if not layout.is_block_outermost or len({s.page_size_bytes for s in specs.values()}) <= 1:
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
        if isinstance(merged.first_spec, MambaSpec):
            return True
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
        if not balanced:
            raise UnsplittableBucketError(
                f"cannot split the {len(merged.kv_cache_specs)} "
                f"{type(merged.first_spec).__name__} layers into {n} groups: their page "
                f"sizes have unequal layer counts {[len(v) for v in by_page.values()]} "
                "(vLLM 0.32's packer fails here too, with StopIteration)"
            )
        repeats_list = list(zip(*by_page.values()))
        for i in range(n):
            names = [name for repeat in repeats_list[i::n] for name in repeat]
            members = {name: merged.kv_cache_specs[name] for name in names}
            groups.append(KVCacheGroupSpec(names, UniformTypeKVCacheSpecs.from_specs(members)))
    return groups


class UnsplittableBucketError(ValueError):
    """A state bucket that must be split across groups but has no repeating pattern."""


class SpecPromotionError(ValueError):
    """With the hybrid manager disabled, layers that promoting windows to full attention
    still cannot make one type of (vLLM refuses the model)."""


class PageSizeUnifyError(ValueError):
    """Pages that neither bigger blocks nor padding can make equal (vLLM raises
    NotImplementedError; `get_kv_cache_groups` then tries the full-allocation fallback)."""


def unify_kv_cache_spec_page_size(specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """Give every layer the largest page (vLLM 0.32's rules, in this order):

    - a Mamba state is padded to it (its page does not grow with the block);
    - an attention page that divides it gets a block that many times bigger (the issue's
      8 full + 4 sliding KV heads: the sliding layers' 16-token blocks become 32);
    - any other non-MLA attention page is padded to it (read through a strided view);
    - an MLA page that does not divide it raises `PageSizeUnifyError` (sparse MLA indexes
      whole token rows, so its stride cannot be padded freely).
    """
    pages = {s.page_size_bytes for s in specs.values()}
    if len(pages) <= 1:
        return dict(specs)
    largest = max(pages)
    unified: dict[str, KVCacheSpec] = {}
    for name, spec in specs.items():
        page = spec.page_size_bytes
        if page == largest:
            unified[name] = spec
        elif isinstance(spec, MambaSpec):
            unified[name] = replace(spec, page_size_padded=largest)
        elif largest % page == 0 and isinstance(spec, AttentionSpec):
            unified[name] = spec.with_block_size(spec.block_size * (largest // page))
        elif isinstance(spec, AttentionSpec) and not isinstance(spec, MLAAttentionSpec):
            unified[name] = replace(spec, page_size_padded=largest)
        else:
            raise PageSizeUnifyError(
                f"cannot unify page sizes {sorted(pages)}: {name}'s page {page} B does not "
                f"divide the largest page {largest} B and a {type(spec).__name__} page cannot "
                "be padded"
            )
        if unified[name].page_size_bytes != largest:
            raise PageSizeUnifyError(
                f"cannot unify page sizes {sorted(pages)}: {name} keeps a page of "
                f"{unified[name].page_size_bytes} B"
            )
    return unified


def is_kv_cache_spec_uniform(specs: Mapping[str, KVCacheSpec]) -> bool:
    """True when one spec can stand for every layer (vLLM merges them to find out: full
    attention layers that differ only in the window they compute over count as one)."""
    values = list(specs.values())
    if not values:
        return True
    try:
        type(values[0]).merge(values)
    except SpecMergeError:
        return False
    return True


def create_kv_cache_group_specs(
    specs: Mapping[str, KVCacheSpec], grouped_layer_names: Sequence[Sequence[str]]
) -> list[KVCacheGroupSpec]:
    """One group per list of layer names, its spec the members' merged spec."""
    groups = []
    for names in grouped_layer_names:
        layer_specs = [specs[n] for n in names]
        groups.append(KVCacheGroupSpec(list(names), type(layer_specs[0]).merge(layer_specs)))
    return groups


# The group-size rule: groups take the smallest layer count of any kind (the "1" of an n:1
# pattern) unless the largest count is below 1.5 times it; then they take the largest, and
# the smaller kinds get padding slots (gpt-oss-20b with an eagle layer: 12 sliding + 13 full).
GROUP_SIZE_RATIO = 1.5


def _get_kv_cache_groups_uniform_page_size(
    specs: Mapping[str, KVCacheSpec],
) -> list[KVCacheGroupSpec]:
    """General hybrid path (every page already equal): same-spec layers, merged where their
    specs merge, split into groups of one size, dealt out i::n.

    1. Layers with equal specs form a bucket, in first-seen order.
    2. A bucket joins an earlier one whose specs merge with its spec (the merge step: e.g.
       full-attention layers that differ only in the window they compute with).
    3. Group size: the smallest bucket, or the largest when it is < 1.5 x the smallest.
       With 10 full and 14 sliding layers 14 < 15, so the size is 14 and the groups are
       [10, 14] (4 padding slots); a 1.25 rule would split the 14 into 7 + 7.
    4. A bucket of n layers makes cdiv(n, size) groups; group i takes layers i::groups, so
       every pipeline stage gets the same pattern.
    """
    same_spec: dict[KVCacheSpec, list[str]] = defaultdict(list)
    for name, spec in specs.items():
        same_spec[spec].append(name)
    layer_buckets: list[list[str]] = []
    spec_buckets: list[list[KVCacheSpec]] = []
    for spec, names in same_spec.items():
        for bucket_names, bucket_specs in zip(layer_buckets, spec_buckets):
            try:
                type(bucket_specs[0]).merge([*bucket_specs, spec])
            except ValueError:  # SpecMergeError, or two window sizes
                continue
            bucket_names.extend(names)
            bucket_specs.append(spec)
            break
        else:
            layer_buckets.append(list(names))
            spec_buckets.append([spec])
    counts = [len(names) for names in layer_buckets]
    group_size = min(counts)
    if max(counts) < group_size * GROUP_SIZE_RATIO:
        group_size = max(counts)
    grouped = []
    for names in layer_buckets:
        n = cdiv(len(names), group_size)
        grouped.extend(names[i::n] for i in range(n))
    return create_kv_cache_group_specs(specs, grouped)


def get_num_padding_layers(groups: Sequence[KVCacheGroupSpec]) -> int:
    """Empty layer slots of the general path: every group's block covers as many layers as
    the largest group, so a smaller group leaves the difference unused (vLLM logs "Add N
    padding layers")."""
    largest = max(len(g.layer_names) for g in groups)
    return sum(largest - len(g.layer_names) for g in groups)


_PROMOTIONS: tuple[tuple[type, type], ...] = (
    (SlidingWindowMLASpec, MLAAttentionSpec),
    (SlidingWindowSpec, FullAttentionSpec),
    (ChunkedLocalAttentionSpec, FullAttentionSpec),
)


def _promoted(spec: AttentionSpec, block_size: int) -> AttentionSpec:
    """`spec` managed as full attention (vLLM's `replace_as`): it keeps its window as a field
    and every block."""
    target = next(t for src, t in _PROMOTIONS if isinstance(spec, src))
    names = {f for f in spec.__dataclass_fields__ if spec.__dataclass_fields__[f].init}
    kwargs = {f: getattr(spec, f) for f in names if f != "extra_retained_tokens"}
    kwargs = {k: v for k, v in kwargs.items() if k in target.__dataclass_fields__}
    padded = spec.page_size_padded
    if padded is not None:
        padded = max(padded, spec.real_page_size_bytes * block_size // spec.block_size)
    kwargs.update(block_size=block_size, page_size_padded=padded)
    if getattr(spec, "alignment", None) is not None:
        kwargs["page_size_padded"] = None
    return target(**kwargs)


def unify_hybrid_kv_cache_specs(specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """`--disable-hybrid-kv-cache-manager`: manage sliding-window and chunked local layers as
    full attention (they keep every block) when the model also has full-attention layers, so
    one group remains (vLLM's `unify_hybrid_kv_cache_specs` / `_promote_local_kv_cache_specs`).
    A mix that still is not one type (Mamba next to attention, two window sizes) raises
    ValueError, as vLLM refuses to start."""
    specs = dict(specs)
    if is_kv_cache_spec_uniform(specs) or UniformTypeKVCacheSpecs.is_uniform_type(specs):
        return specs
    values = specs.values()
    has_full = any(isinstance(s, FullAttentionSpec) for s in values)
    has_local = any(
        isinstance(s, (SlidingWindowSpec, ChunkedLocalAttentionSpec)) for s in values
    )
    full_sizes = {s.block_size for s in values if isinstance(s, FullAttentionSpec)}
    full_block = next(iter(full_sizes)) if len(full_sizes) == 1 else None
    promoted = dict(specs)
    if has_full and has_local:
        for name, spec in specs.items():
            if isinstance(spec, (SlidingWindowSpec, ChunkedLocalAttentionSpec)):
                promoted[name] = _promoted(spec, full_block or spec.block_size)
    if not (
        is_kv_cache_spec_uniform(promoted) or UniformTypeKVCacheSpecs.is_uniform_type(promoted)
    ):
        raise SpecPromotionError(
            "cannot manage these layers as one type with the hybrid KV cache manager "
            "disabled: failed to promote local KV cache specs to one unified type"
        )
    return promoted


def _try_get_full_allocation_fallback_groups(
    specs: Mapping[str, KVCacheSpec],
) -> list[KVCacheGroupSpec] | None:
    """MLA next to ordinary sliding-window layers whose pages cannot be unified: vLLM
    allocates the window layers as full attention, in one uniform-type group."""
    values = list(specs.values())
    if any(isinstance(s, (SlidingWindowMLASpec, ChunkedLocalAttentionSpec)) for s in values):
        return None
    if not (
        any(isinstance(s, MLAAttentionSpec) for s in values)
        and any(isinstance(s, SlidingWindowSpec) for s in values)
    ):
        return None
    try:
        promoted = unify_hybrid_kv_cache_specs(specs)
    except ValueError:
        return None
    uniform = UniformTypeKVCacheSpecs.from_specs(promoted)
    if uniform is None:
        return None
    return [KVCacheGroupSpec(list(uniform.kv_cache_specs), uniform)]


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
    specs: Mapping[str, KVCacheSpec],
    *,
    use_eagle: bool = False,
    kv_cache_layout: str | KVCacheLayout | None = None,
    disable_hybrid_kv_cache_manager: bool = False,
) -> list[KVCacheGroupSpec]:
    """Group the layers of `specs` ({layer name: spec}, registration order) into cache groups
    (vLLM 0.32's `get_kv_cache_groups`).

    In order: with the hybrid manager disabled, local layers become full attention first;
    every spec mergeable into one -> one group; one `UniformTypeKVCacheSpecs` fits -> one
    group; pages of several sizes and a block-outermost layout -> `get_packed_kv_cache_groups`;
    otherwise the general hybrid path on unified page sizes (if the pages cannot be unified,
    the full-allocation fallback for MLA next to sliding windows). `kv_cache_layout` (a
    `KVCacheLayout` or its name) defaults to `resolve_kv_cache_layout(specs)`: BLHNC for
    DeepSeek V4, whose plans are vLLM's packed ones, LBNHC for the rest. `use_eagle=True`
    (speculative decoding whose draft layer registers last: MTP, DeepSeek V4) flags the group
    holding the last registered layer on the packed and general paths, as vLLM does; its
    one-group paths flag nothing. The article's planner B is
    `older_planners.get_kv_cache_groups_b`.
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
    layout = resolve_kv_cache_layout(specs, kv_cache_layout)
    if disable_hybrid_kv_cache_manager:
        specs = unify_hybrid_kv_cache_specs(specs)
    if is_kv_cache_spec_uniform(specs):
        return create_kv_cache_group_specs(specs, [list(specs)])
    uniform = UniformTypeKVCacheSpecs.from_specs(specs)
    if uniform is not None:
        return [KVCacheGroupSpec(list(specs), uniform)]
    groups = get_packed_kv_cache_groups(specs, layout)
    if groups is None:
        try:
            unified = unify_kv_cache_spec_page_size(specs)
        except PageSizeUnifyError:
            fallback = _try_get_full_allocation_fallback_groups(specs)
            if fallback is None:
                raise
            return fallback
        groups = _get_kv_cache_groups_uniform_page_size(unified)
    return annotate_last_layer_eagle_group(specs, groups) if use_eagle else groups


def align_hybrid_block_size(
    *,
    block_size: int,
    attn_page_size_1_token: int,
    mamba_page_size: int,
    kernel_block_alignment: int,
    backend_block_alignment: int | None = None,
    use_mla: bool = False,
) -> tuple[int, int | None]:
    """(attention block size, Mamba page padded to the attention page or None) for a hybrid
    attention + Mamba model (vLLM 0.32's `Platform._align_hybrid_block_size`, which runs on
    the config before any layer builds its spec).

    A Mamba state is one page whatever the block size, so every page must be at least a
    state: the attention block grows to the smallest multiple of `kernel_block_alignment`
    (the first attention backend's smallest kernel block, or `block_size` if larger; 128 at
    least for MLA) whose page holds `mamba_page_size` bytes, then to a multiple of
    `backend_block_alignment` (the lcm of every attention backend's smallest kernel block).
    The block never shrinks below `block_size`. The state is then padded to exactly one
    attention page. E.g. 16-token kernels, 4096 B of KV per token and a 1.6 MB state give a
    400-token block.
    """
    for name, value in (
        ("block_size", block_size),
        ("attn_page_size_1_token", attn_page_size_1_token),
        ("mamba_page_size", mamba_page_size),
        ("kernel_block_alignment", kernel_block_alignment),
    ):
        check_positive_int(name, value)
    backend_block_alignment = backend_block_alignment or kernel_block_alignment
    check_positive_int("backend_block_alignment", backend_block_alignment)
    alignment = max(kernel_block_alignment, block_size)
    if use_mla:
        alignment = max(alignment, 128)
    attn_block = alignment * cdiv(mamba_page_size, alignment * attn_page_size_1_token)
    attn_block = backend_block_alignment * cdiv(attn_block, backend_block_alignment)
    block_size = max(block_size, attn_block)
    attn_page = block_size * attn_page_size_1_token
    return block_size, (None if attn_page == mamba_page_size else attn_page)


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


def _layer_block_stride(spec: KVCacheSpec) -> int:
    """A layer-outermost block stride: the page rounded up to its kernel-block alignment."""
    return round_up(spec.page_size_bytes, spec.block_stride_alignment())


def get_kv_cache_bytes_per_block(
    groups: Sequence[KVCacheGroupSpec], kv_cache_layout: str | KVCacheLayout | None = None
) -> int:
    """Bytes one block id costs in the pool: the widest group.

    Block-outermost (planner C's slab): the widest group's pages side by side, rounded up to a
    common multiple of every layer's `block_stride_alignment` (its page at the kernel block
    size when the backend splits a block into smaller kernel blocks; 1 otherwise).
    Layer-outermost: the widest group's sum of per-layer strides (each page rounded up to its
    own alignment).
    """
    layout = resolve_kv_cache_layout([g.kv_cache_spec for g in groups], kv_cache_layout)
    if not layout.is_block_outermost:
        return max(
            sum(_layer_block_stride(g.layer_spec(n)) for n in g.layer_names) for g in groups
        )
    widest = max(g.width_bytes for g in groups)
    if widest <= 0:
        raise ValueError("a packed layout needs at least one layer with a non-empty page")
    alignments = [
        g.layer_spec(n).block_stride_alignment() for g in groups for n in g.layer_names
    ]
    return round_up(widest, math.lcm(*alignments))


def validate_kv_cache_layout(
    layout: KVCacheLayout, groups: Sequence[KVCacheGroupSpec]
) -> None:
    """Pages of several sizes need each page to be one contiguous run (a block-compact
    layout) and, with several groups, the layer axis inside the block axis."""
    pages = {g.page_size_of(n) for g in groups for n in g.layer_names}
    if len(pages) == 1:
        return
    if not layout.is_block_compact or (len(groups) > 1 and layout.is_layer_compact):
        raise ValueError(
            f"KV cache layout {layout.name} cannot express mixed page sizes {sorted(pages)}; "
            "a block-outermost layout (BLHNC) can"
        )


def get_kv_cache_config(
    groups: Sequence[KVCacheGroupSpec],
    available_memory: int,
    num_blocks_override: int | None = None,
    *,
    kv_cache_layout: str | KVCacheLayout | None = None,
) -> KVCacheConfig:
    """Plan the cache tensors for `groups` within `available_memory` bytes (vLLM 0.32's
    `get_kv_cache_config_from_groups`).

    num_blocks = available_memory // bytes per block (`get_kv_cache_bytes_per_block`). Every
    group starts at byte 0 (groups overlay: a block id belongs to one group at a time). Inside
    a group the layers are taken spec by spec: all layers with one (equal) spec form a run, in
    first-seen order, and one `KVCacheTensor` per run lists them. Block-outermost: the run's
    layers sit side by side in each block (`layer_stride` = page, `block_stride` = bytes per
    block). Layer-outermost: each layer owns a region of `num_blocks` pages (`block_stride` =
    its page rounded to its alignment, `layer_stride` = that x num_blocks), and the next run
    starts after them. Only block-compact layouts (L and B outermost) are planned.
    Raises ValueError when the budget is smaller than one block (unless `num_blocks_override`
    is given). The article's planner B is `older_planners.get_kv_cache_config_b`.
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
    layout = resolve_kv_cache_layout([g.kv_cache_spec for g in groups], kv_cache_layout)
    if not layout.is_block_compact:
        raise ValueError(
            f"refimpl plans block-compact layouts only (LBHNC, LBNHC, BLHNC, BLNHC), got "
            f"{layout.name}"
        )
    validate_kv_cache_layout(layout, groups)
    bytes_per_block = get_kv_cache_bytes_per_block(groups, layout)
    num_blocks = _num_blocks(available_memory, bytes_per_block, num_blocks_override)
    size = bytes_per_block * num_blocks
    tensors = []
    for group in groups:
        runs: dict[object, list[str]] = {}
        for name in group.layer_names:
            runs.setdefault(group.layer_spec(name), []).append(name)
        offset = 0
        for spec, names in runs.items():
            page = spec.page_size_bytes
            if layout.is_block_outermost:
                layer_stride, block_stride = page, bytes_per_block
                advance = len(names) * page
            else:
                block_stride = _layer_block_stride(spec)
                layer_stride = block_stride * num_blocks
                advance = len(names) * layer_stride
            tensors.append(
                KVCacheTensor(
                    size=size,
                    shared_by=tuple(names),
                    offset=offset,
                    block_stride=block_stride,
                    layer_stride=layer_stride,
                )
            )
            offset += advance
    return KVCacheConfig(num_blocks, tensors, groups)


# --- cross-layer KV sharing


def add_kv_sharing_layers_to_kv_cache_groups(
    shared_kv_cache_layers: Mapping[str, str], groups: Sequence[KVCacheGroupSpec]
) -> list[tuple[str, ...]]:
    """The layer names of each group once the layers that reuse another layer's cache are
    added (vLLM's `vllm/v1/worker/utils.py` function of this name).

    `shared_kv_cache_layers` maps a layer to the layer whose K/V it reads (the attention
    layer's `kv_sharing_target_layer_name`, e.g. Gemma 3n's or Hunyuan's cross-layer sharing).
    Such a layer has no spec: vLLM plans groups, blocks and tensors without it, so it costs no
    memory, and only then appends it to its target's group so it gets attention metadata.
    Groups are frozen here, so the lists are returned (in group order) instead of being
    appended in place.
    """
    where = {name: i for i, g in enumerate(groups) for name in g.layer_names}
    names = [list(g.layer_names) for g in groups]
    for layer, target in shared_kv_cache_layers.items():
        if layer in where:
            raise ValueError(f"layer {layer!r} shares another layer's cache but has a spec")
        if target not in where:
            raise ValueError(
                f"layer {layer!r} shares the cache of {target!r}, which is in no group "
                "(a sharing target must have its own spec)"
            )
        names[where[target]].append(layer)
    return [tuple(n) for n in names]
