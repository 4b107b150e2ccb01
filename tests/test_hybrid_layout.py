"""Layout: num_blocks, packed offsets and the other KVCacheConfig cases."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.course.v4_inventory import page_size_rows
from refimpl.hybrid import deepseek_v4 as v4
from refimpl.hybrid.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from refimpl.hybrid.kv_cache_planning import (
    GIB,
    get_kv_cache_config,
    get_kv_cache_groups,
)
from refimpl.hybrid.older_planners import (
    bytes_per_block_b,
    bytes_per_block_slots,
    bytes_per_block_v0,
    get_kv_cache_config_b,
    get_kv_cache_groups_b,
    get_packed_kv_cache_layout,
    two_group_layout,
)
from refimpl.plan_cli import parse_memory
from refimpl.plan_summary import summarize_groups

PRO = v4.kv_cache_specs("pro")
PRO_GROUPS = get_kv_cache_groups_b(PRO)


def test_pro_packed_config_in_10_gib():
    cfg = get_kv_cache_config_b(PRO_GROUPS, 10 * GIB)
    assert (cfg.num_blocks, cfg.num_usable_blocks, cfg.block_stride) == (7477, 7476, 1435968)
    assert len(cfg.kv_cache_tensors) == 206
    assert [t.offset for t in cfg.kv_cache_tensors] == sorted(
        t.offset for t in cfg.kv_cache_tensors
    )
    assert all(
        t.size == 7477 * 1435968 and t.block_stride == 1435968 for t in cfg.kv_cache_tensors
    )
    assert sorted(n for t in cfg.kv_cache_tensors for n in t.shared_by) == sorted(PRO)


def test_pro_offsets_follow_registration_order():
    _, by_offset = get_packed_kv_cache_layout(PRO_GROUPS)
    at = {name: off for off, names in by_offset.items() for name in names}
    assert [
        at[f"layers.{n}"]
        for n in (
            "0.attn",
            "1.attn",
            "2.indexer.k_cache",
            "2.attn",
            "3.attn",
            "4.indexer.k_cache",
        )
    ] == [0, 1728, 3456, 12096, 49536, 51264]
    assert [at[f"layers.{i}.swa_cache"] for i in (0, 2, 4, 1, 3)] == [
        0,
        37440,
        74880,
        0,
        37440,
    ]
    assert [at[f"layers.{i}.compressor.state_cache"] for i in (0, 1, 3)] == [0, 32832, 65664]
    assert [
        at[n]
        for n in (
            "layers.2.indexer.compressor.state_cache",
            "layers.2.compressor.state_cache",
            "layers.4.indexer.compressor.state_cache",
            "layers.4.compressor.state_cache",
        )
    ] == [0, 8640, 41472, 50112]
    assert by_offset[0] == [
        "layers.0.attn",
        "layers.0.swa_cache",
        "layers.1.swa_cache",
        "layers.0.compressor.state_cache",
        "layers.2.indexer.compressor.state_cache",
    ]


def test_fp4_indexer_and_flash_block_counts():
    fp4 = v4.kv_cache_specs("pro", indexer="fp4")
    cfg = get_kv_cache_config_b(get_kv_cache_groups_b(fp4), 10 * GIB)
    assert (cfg.block_stride, cfg.num_blocks) == (1315008, 8165)
    flash = get_kv_cache_config(get_kv_cache_groups_b(v4.kv_cache_specs("flash")), 10 * GIB)
    assert (flash.block_stride, flash.num_blocks) == (1002240, 10713)


def test_override_replaces_budget_and_small_budget_fails_clearly():
    cfg = get_kv_cache_config_b(PRO_GROUPS, 10 * GIB, num_blocks_override=5)
    assert cfg.num_blocks == 5 and cfg.kv_cache_tensors[0].size == 5 * 1435968
    assert get_kv_cache_config_b(PRO_GROUPS, 0, num_blocks_override=2).num_blocks == 2
    assert get_kv_cache_config_b(PRO_GROUPS, 1435968).num_blocks == 1
    with pytest.raises(ValueError, match="smaller than one block"):
        get_kv_cache_config_b(PRO_GROUPS, 1435967)
    for bad in (-1, 1.5, "10GiB"):
        with pytest.raises(ValueError, match="available_memory"):
            get_kv_cache_config_b(PRO_GROUPS, bad)
    with pytest.raises(ValueError, match="num_blocks_override"):
        get_kv_cache_config_b(PRO_GROUPS, GIB, num_blocks_override=0)


def test_attention_free_model_gets_one_null_block():
    cfg = get_kv_cache_config_b([], 0)
    assert (cfg.num_blocks, cfg.kv_cache_tensors, cfg.kv_cache_groups) == (1, (), ())


def test_single_uniform_type_group_has_one_tensor_per_layer():
    members = {"a": PRO["layers.0.attn"], "b": PRO["layers.2.attn"]}
    group = KVCacheGroupSpec(["a", "b"], UniformTypeKVCacheSpecs.from_specs(members))
    cfg = get_kv_cache_config_b([group], 10 * (1728 + 37440) + 5)
    assert cfg.num_blocks == 10 and not cfg.is_packed
    assert [(t.shared_by, t.size) for t in cfg.kv_cache_tensors] == [
        (("a",), 17280),
        (("b",), 374400),
    ]


def _full(bs=16):
    return FullAttentionSpec(block_size=bs, num_kv_heads=2, head_size=64, dtype="bfloat16")


def _sw():
    return SlidingWindowSpec(
        block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16", sliding_window=64
    )


def test_general_case_tensor_i_is_shared_by_layer_i_of_each_group():
    groups = [
        KVCacheGroupSpec(["full.0", "full.1"], _full()),
        KVCacheGroupSpec(["sw.0", "sw.2"], _sw()),
        KVCacheGroupSpec(["sw.1"], _sw()),
    ]
    page = _full().page_size_bytes
    cfg = get_kv_cache_config_b(groups, 2 * page * 7 + 1)
    assert cfg.num_blocks == 7
    assert [t.shared_by for t in cfg.kv_cache_tensors] == [
        ("full.0", "sw.0", "sw.1"),
        ("full.1", "sw.2"),
    ]
    assert all(t.size == page * 7 and t.block_stride == 0 for t in cfg.kv_cache_tensors)
    bad = [KVCacheGroupSpec(["f"], _full()), KVCacheGroupSpec(["g"], _full(bs=32))]
    with pytest.raises(ValueError, match="one page size"):
        get_kv_cache_config_b(bad, GIB)
    with pytest.raises(ValueError, match="more than one group"):
        get_kv_cache_config_b(
            [KVCacheGroupSpec(["f"], _full()), KVCacheGroupSpec(["f"], _sw())], GIB
        )


def test_cross_layer_opt_in_packs_non_uniform_groups():
    groups = [
        KVCacheGroupSpec(["full.0", "full.1"], _full()),
        KVCacheGroupSpec(["sw.0", "sw.2"], _sw()),
        KVCacheGroupSpec(["sw.1", "sw.3"], _sw()),
    ]
    page = _full().page_size_bytes
    cfg = get_kv_cache_config_b(groups, 2 * page * 4, enable_cross_layers_blocks=True)
    assert cfg.block_stride == 2 * page and cfg.num_blocks == 4
    assert [(t.offset, t.shared_by) for t in cfg.kv_cache_tensors] == [
        (0, ("full.0", "sw.0", "sw.1")),
        (page, ("full.1", "sw.2", "sw.3")),
    ]


def test_comparison_layouts_for_pro():
    assert bytes_per_block_b(PRO_GROUPS) == 1435968
    assert bytes_per_block_v0(PRO_GROUPS) == 1482048 and 10 * GIB // 1482048 == 7244
    assert bytes_per_block_slots(PRO_GROUPS) == 2491200 and 10 * GIB // 2491200 == 4310
    two = two_group_layout(PRO)
    assert bytes_per_block_b(two) == 2283840
    assert get_kv_cache_config_b(two, 10 * GIB).num_blocks == 4701


def test_summaries():
    rows = summarize_groups(PRO_GROUPS)
    assert [r.unused_tail_bytes for r in rows] == [0, 275328, 312768, 418176, 191808]
    assert rows[0].padding_bytes == 30 * 64 + 31 * 560 + 30 * 192


@pytest.mark.parametrize(
    "text, value",
    [
        ("10GiB", 10 * GIB),
        ("512MiB", 512 << 20),
        ("4GB", 4 * 10**9),
        ("1_000", 1000),
        ("1.5GiB", 3 * GIB // 2),
        (77, 77),
    ],
)
def test_parse_memory(text, value):
    assert parse_memory(text) == value


@pytest.mark.parametrize("text", ["ten", "5XB", "-1GiB", "", "inf", "nanGiB"])
def test_parse_memory_errors(text):
    with pytest.raises(ValueError, match="memory size"):
        parse_memory(text)


@given(st.integers(0, 40 * GIB))
def test_num_blocks_is_the_floor_of_budget_over_stride(memory):
    if memory < 1435968:
        with pytest.raises(ValueError):
            get_kv_cache_config_b(PRO_GROUPS, memory)
        return
    cfg = get_kv_cache_config_b(PRO_GROUPS, memory)
    assert (
        cfg.num_blocks * cfg.block_stride <= memory < (cfg.num_blocks + 1) * cfg.block_stride
    )


@given(st.permutations(list(range(5))))
def test_stride_and_offsets_do_not_depend_on_group_order(order):
    groups = [PRO_GROUPS[i] for i in order]
    stride, by_offset = get_packed_kv_cache_layout(groups)
    _, reference = get_packed_kv_cache_layout(PRO_GROUPS)
    assert stride == 1435968
    assert {o: sorted(n) for o, n in by_offset.items()} == {
        o: sorted(n) for o, n in reference.items()
    }


def test_viz_figures_and_text_twins():
    from matplotlib.figure import Figure

    from refimpl.viz import hybrid_layout as viz

    groups = PRO_GROUPS
    rows = page_size_rows(PRO)
    assert isinstance(viz.draw_pages(rows), Figure)
    assert "idx" in viz.pages_text(rows) and "8,640" in viz.pages_text(rows)
    assert isinstance(viz.draw_grouping(PRO, groups), Figure)
    text = viz.grouping_text(PRO, groups)
    assert "G1 SWA w=128 (block 64, 31 caches): swa x31 at layers 0..60 step 2" in text
    assert (
        "G3 state bs=8 w=128 (block 8, 31 caches): c128_state x31 at layers 0,1..59 step 2"
        in text
    )
    assert isinstance(viz.draw_padding_curve([31, 61, 31, 30], 31), Figure)
    assert "best d = 31 (padding 2)" in viz.padding_curve_text([31, 61, 31, 30], 31)
    assert isinstance(viz.draw_slab(PRO, groups), Figure)
    assert isinstance(viz.draw_slab(PRO, groups, upto=100_000), Figure)
    zoom = viz.slab_text(PRO, groups, upto=100_000)
    assert "L1.c128@1,728 (1,168 + 560 pad)" in zoom and "L5.c128_state@98,496" in zoom
    assert "L7.swa" not in zoom  # starts at 112,320, beyond the window
    flash = v4.kv_cache_specs("flash")
    models = {"Pro": (PRO, groups), "Flash": (flash, get_kv_cache_groups_b(flash))}
    assert isinstance(viz.draw_groupings(models), Figure)
    both = viz.groupings_text(models)
    assert (
        both.startswith("Pro:\nG0 MLA") and "\n\nFlash:\nG0 MLA (block 256, 62 caches)" in both
    )
    slab = viz.slab_text(PRO, groups)
    assert (
        "block stride 1,435,968 B" in slab
        and "unused tail 418,176" in slab
        and "L2.c4@12,096" in slab
    )
    budget = {"five groups": 1435968, "mla+swa": 2283840}
    assert isinstance(viz.draw_blocks_per_budget(budget, 10 * GIB), Figure)
    assert "4,701" in viz.blocks_per_budget_text(budget, 10 * GIB)
    assert viz.slab_text(PRO, groups) == viz.slab_text(PRO, groups)  # deterministic
    for text in (slab, zoom, viz.grouping_text(PRO, groups)):  # listings fit 95 columns
        assert max(len(line) for line in text.splitlines()) <= 95
    assert viz.format_table([]) == "(empty)"


@pytest.mark.parametrize("variant,planner", [("pro", "C"), ("flash", "C"), ("pro", "B")])
def test_groups_in_layout_order_walk_the_planned_offsets(variant, planner):
    """Walking each reordered group page after page lands every layer on its planned offset."""
    from refimpl.course.layout_summary import groups_in_layout_order
    from refimpl.hybrid.older_planners import PLANNERS

    get_groups, get_config = PLANNERS[planner]
    config = get_config(get_groups(v4.kv_cache_specs(variant)), 10 * GIB)
    planned = {n: t.layer_offset(n) for t in config.kv_cache_tensors for n in t.shared_by}
    ordered = groups_in_layout_order(config)
    for before, after in zip(config.kv_cache_groups, ordered):
        assert (
            set(after.layer_names) == set(before.layer_names)
            and after.width_bytes == before.width_bytes
        )
        at = 0
        for name in after.layer_names:
            assert planned[name] == at
            at += after.page_size_of(name)
    # C's MLA group: the 31 ratio-128 pages, then the indexer run
    if (variant, planner) == ("pro", "C"):
        mla = next(g for g in ordered if len(g.layer_names) == 91)
        assert planned[mla.layer_names[31]] == 31 * 1728 and "indexer" in mla.layer_names[31]


@pytest.mark.parametrize("upto", [None, 60_000])
def test_slab_reads_without_a_key(upto):
    """Chapter 10's slab (planner C's groups in layout order): no "1e6" in the corner (the
    full block is in MB), every colour in the legend, and no page so thin that only its black
    border shows (V4-Pro's 31 c128a pages, 1,728 B each, are one outlined run with a count)."""
    from refimpl.course.layout_summary import groups_in_layout_order
    from refimpl.viz import hybrid_layout
    from tests.figure_rules import bordered_slivers, colours_without_legend, offset_texts

    laid_out = groups_in_layout_order(get_kv_cache_config(get_kv_cache_groups(PRO), 10 * GIB))
    fig = hybrid_layout.draw_slab(PRO, laid_out, upto=upto)
    assert offset_texts(fig) == []
    assert colours_without_legend(fig) == set()
    assert bordered_slivers(fig) == []
    if upto is None:
        assert "MB" in fig.axes[0].get_xlabel()
        assert "31 c128a pages" in [t.get_text() for t in fig.axes[0].texts]
