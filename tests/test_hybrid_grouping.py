"""Grouping: approximate gcd, the DeepSeek V4 path and the other paths of
get_kv_cache_groups."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.course.v4_inventory import short_name
from refimpl.hybrid import deepseek_v4 as v4
from refimpl.hybrid.kv_cache_interface import (
    FullAttentionSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from refimpl.hybrid.kv_cache_planning import (
    approximate_gcd,
    padding_curve,
)
from refimpl.hybrid.older_planners import get_kv_cache_groups_b, group_and_unify_kv_cache_specs


@pytest.mark.parametrize(
    "values, lower, expected",
    [
        ([4, 6], 1, 2),
        ([3], 5, 5),
        ([21, 43, 21, 20], 21, 22),
        ([31, 61, 31, 30], 31, 31),
        ([31, 62, 31, 30], 31, 31),
        ([12], None, 12),
        ([6, 9], None, 3),
        ([7], 0, 7),
    ],
)
def test_approximate_gcd_examples(values, lower, expected):
    assert approximate_gcd(values, lower_bound=lower) == expected


def test_approximate_gcd_padding_values_from_the_seed():
    curve = padding_curve([31, 61, 31, 30], 31)
    assert (curve[31], curve[32], curve[33], curve[61]) == (2, 7, 12, 91)
    assert min(curve, key=lambda d: (curve[d], -d)) == 31


@pytest.mark.parametrize(
    "values, lower", [([], None), ([0, 3], None), ([-1], 1), ([2.5], None), ([3], 1.5)]
)
def test_approximate_gcd_errors(values, lower):
    with pytest.raises(ValueError):
        approximate_gcd(values, lower_bound=lower)


@given(
    st.lists(st.integers(1, 80), min_size=1, max_size=6),
    st.one_of(st.none(), st.integers(-3, 90)),
)
def test_approximate_gcd_against_brute_force(values, lower):
    d = approximate_gcd(values, lower)
    lo = max(1, lower or 1)
    if lo > max(values):
        assert d == lo
        return
    pads = {c: sum(-x % c for x in values) for c in range(lo, max(values) + 1)}
    best = min(pads.values())
    assert pads[d] == best and d == max(c for c, p in pads.items() if p == best)


def _groups(variant="pro", **kw):
    specs = v4.kv_cache_specs(variant, **kw)
    return specs, get_kv_cache_groups_b(specs, use_eagle=kw.get("mtp", False))


def test_pro_buckets_in_first_appearance_order():
    grouped = group_and_unify_kv_cache_specs(v4.kv_cache_specs("pro"))
    assert [b.get_num_layer_tuples() for b in grouped] == [31, 61, 31, 30]
    assert [(b.block_size, b.sliding_window) for b in grouped] == [
        (256, None),
        (64, 128),
        (8, 128),
        (4, 8),
    ]
    assert [len(b.kv_cache_specs) for b in grouped] == [91, 61, 31, 60]


def test_pro_groups_exact_membership():
    specs, groups = _groups("pro")
    assert [len(g.layer_names) for g in groups] == [91, 31, 30, 31, 60]
    assert [g.block_size for g in groups] == [256, 64, 64, 8, 4]
    assert [g.width_bytes for g in groups] == [1435968, 1160640, 1123200, 1017792, 1244160]
    short = [[short_name(n, specs[n]) for n in g.layer_names] for g in groups]
    assert short[0][:7] == [
        "L0.c128",
        "L1.c128",
        "L2.idx",
        "L2.c4",
        "L3.c128",
        "L4.idx",
        "L4.c4",
    ]
    assert short[1] == [f"L{i}.swa" for i in range(0, 61, 2)]  # interleaved: even layers
    assert short[2] == [f"L{i}.swa" for i in range(1, 61, 2)]
    assert short[3] == ["L0.c128_state", "L1.c128_state"] + [
        f"L{i}.c128_state" for i in range(3, 61, 2)
    ]
    assert short[4][:4] == ["L2.idx_state", "L2.c4_state", "L4.idx_state", "L4.c4_state"]
    assert all(isinstance(g.kv_cache_spec, UniformTypeKVCacheSpecs) for g in groups)
    assert not any(g.is_eagle_group for g in groups)
    assert sorted(n for g in groups for n in g.layer_names) == sorted(specs)


def test_flash_groups():
    specs, groups = _groups("flash")
    grouped = group_and_unify_kv_cache_specs(specs)
    assert [b.get_num_layer_tuples() for b in grouped] == [21, 43, 21, 20]
    assert [len(g.layer_names) for g in groups] == [62, 22, 21, 42, 20]
    # C4 state appears before C128 state
    assert [g.block_size for g in groups] == [256, 64, 64, 4, 8]
    assert [g.width_bytes for g in groups] == [1002240, 823680, 786240, 870912, 656640]


def test_mtp_makes_even_swa_split_and_flags_eagle_group():
    specs, groups = _groups("pro", mtp=True)
    assert [len(g.layer_names) for g in groups] == [91, 31, 31, 31, 60]
    assert [g.is_eagle_group for g in groups] == [False, False, True, False, False]
    assert "layers.61.swa_cache" in groups[2].layer_names
    assert not any(g.is_eagle_group for g in get_kv_cache_groups_b(specs))


def test_empty_and_single_spec_paths():
    assert get_kv_cache_groups_b({}) == []
    full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16")
    (group,) = get_kv_cache_groups_b({"l0": full, "l1": full})
    assert group.layer_names == ("l0", "l1") and group.kv_cache_spec == full


def test_v32_mla_plus_indexer_is_one_uniform_type_group():
    mla = MLAAttentionSpec(
        block_size=64,
        num_kv_heads=1,
        head_size=576,
        dtype="uint8",
        cache_dtype_str="fp8_ds_mla",
    )
    idx = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=132, dtype="uint8")
    (group,) = get_kv_cache_groups_b(
        {"l0.attn": mla, "l0.idx": idx, "l1.attn": mla, "l1.idx": idx}
    )
    assert isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs)
    assert group.kv_cache_spec.page_size_bytes == 2 * (64 * 656 + 64 * 132)


def _sw(window=128, bs=16):
    return SlidingWindowSpec(
        block_size=bs, num_kv_heads=2, head_size=64, dtype="bfloat16", sliding_window=window
    )


def test_general_hybrid_path_n_to_1_pattern():
    full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16")
    specs = {}
    for i in range(12):  # 5 sliding-window layers then 1 full, twice (Gemma-3 style)
        specs[f"l{i}"] = full if i % 6 == 5 else _sw()
    groups = get_kv_cache_groups_b(specs)
    # group size = 2 (the full-attention count); the 10 window layers are dealt out i::5
    assert [g.layer_names for g in groups] == [
        ("l0", "l6"),
        ("l1", "l7"),
        ("l2", "l8"),
        ("l3", "l9"),
        ("l4", "l10"),
        ("l5", "l11"),
    ]
    assert [g.layer_names for g in groups if g.kv_cache_spec == full] == [("l5", "l11")]


def test_general_hybrid_path_close_counts_use_the_larger_size():
    full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16")
    specs = {f"s{i}": _sw() for i in range(12)} | {f"f{i}": full for i in range(13)}
    groups = get_kv_cache_groups_b(specs)
    assert [len(g.layer_names) for g in groups] == [12, 13]


def test_general_path_unifies_page_sizes_by_growing_blocks():
    full = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=64, dtype="bfloat16")
    groups = get_kv_cache_groups_b({"s0": _sw(), "f0": full})
    assert {g.kv_cache_spec.page_size_bytes for g in groups} == {full.page_size_bytes}
    assert sorted(g.block_size for g in groups) == [32, 32]
    odd = FullAttentionSpec(block_size=16, num_kv_heads=3, head_size=64, dtype="bfloat16")
    with pytest.raises(ValueError, match="cannot unify page sizes.*does not divide"):
        get_kv_cache_groups_b({"s0": _sw(), "f0": odd})
    padded = SlidingWindowSpec(
        block_size=16,
        num_kv_heads=2,
        head_size=64,
        dtype="bfloat16",
        sliding_window=128,
        page_size_padded=_sw().page_size_bytes,
    )
    with pytest.raises(ValueError, match="cannot unify page sizes.*padded"):
        get_kv_cache_groups_b({"s0": padded, "f0": full})


@pytest.mark.parametrize("variant", ["pro", "flash"])
@pytest.mark.parametrize("cache_dtype", ["fp8_ds_mla", "bfloat16"])
@pytest.mark.parametrize("indexer", ["fp8", "fp4"])
@pytest.mark.parametrize("mtp", [False, True])
def test_grouping_invariants_for_every_setting(variant, cache_dtype, indexer, mtp):
    from refimpl.hybrid.older_planners import get_packed_kv_cache_layout

    specs = v4.kv_cache_specs(variant, cache_dtype=cache_dtype, indexer=indexer, mtp=mtp)
    groups = get_kv_cache_groups_b(specs, use_eagle=mtp)
    names = [n for g in groups for n in g.layer_names]
    # each cache exactly once
    assert sorted(names) == sorted(specs) and len(names) == len(set(names))
    assert all(
        g.kv_cache_spec.kv_cache_specs[n] == specs[n] for g in groups for n in g.layer_names
    )
    mla = [n for n, s in specs.items() if isinstance(s, MLAAttentionSpec)]
    assert list(groups[0].layer_names) == mla  # MLA group first, whole, in registration order
    buckets = group_and_unify_kv_cache_specs(specs)
    tuples = [b.get_num_layer_tuples() for b in buckets]
    d = approximate_gcd(tuples, tuples[0])
    for g in groups[1:]:
        assert g.kv_cache_spec.get_num_layer_tuples() <= d
    assert sum(g.is_eagle_group for g in groups) == (1 if mtp else 0)
    stride, by_offset = get_packed_kv_cache_layout(groups)
    assert stride == max(g.width_bytes for g in groups) == groups[0].width_bytes
    for g in groups:  # pages of one group never overlap
        spans = sorted(
            (off, off + g.page_size_of(n))
            for off, ns in by_offset.items()
            for n in ns
            if n in g.layer_names
        )
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
        assert spans[-1][1] <= stride


def test_v4_path_is_skipped_without_window_mla_or_with_one_page_size():
    from refimpl.hybrid.kv_cache_interface import SlidingWindowMLASpec

    mla = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=64, dtype="bfloat16")
    swa = SlidingWindowMLASpec(
        block_size=64, num_kv_heads=1, head_size=64, dtype="bfloat16", sliding_window=128
    )
    assert group_and_unify_kv_cache_specs({"a": mla}) is None
    assert group_and_unify_kv_cache_specs({"a": mla, "b": swa}) is None  # same page size
    groups = get_kv_cache_groups_b({"a": mla, "b": swa})  # -> general path, one group per spec
    assert [g.layer_names for g in groups] == [("a",), ("b",)]
    with pytest.raises(ValueError, match="at least one MLAAttentionSpec"):
        big = SlidingWindowMLASpec(
            block_size=64, num_kv_heads=1, head_size=128, dtype="bfloat16", sliding_window=8
        )
        group_and_unify_kv_cache_specs({"b": swa, "c": big})
