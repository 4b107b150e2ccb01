"""The Part II primer pictures and the toy: exact contents of the text twins, figures build."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from refimpl.course.hybrid_toy import TOY_GROUP_LABELS, TOY_LAYERS, toy_v4_specs
from refimpl.course.v4_inventory import short_name
from refimpl.hybrid import deepseek_v4 as v4
from refimpl.hybrid.kv_cache_planning import get_kv_cache_groups
from refimpl.hybrid.older_planners import get_kv_cache_groups_b, get_packed_kv_cache_layout
from refimpl.plan_summary import group_kind
from refimpl.viz.hybrid_layout import (
    V4_LAYER_CACHES,
    draw_layer_view,
    draw_position_strip,
    draw_v4_layer,
    layer_view_text,
    position_strip_text,
    v4_layer_text,
)


def test_layer_caches_follow_the_registration_order_of_the_model():
    specs = v4.kv_cache_specs("pro")
    for layer in (2, 3):  # Pro's layer 2 has ratio 4, layer 3 ratio 128
        ratio = v4.PRO.compress_ratios[layer]
        registered = [
            short_name(n, s).split(".", 1)[1]
            for n, s in specs.items()
            if v4.parse_layer_name(n)[0] == layer
        ]
        assert registered == [kind for kind, _, _ in V4_LAYER_CACHES[ratio]]


def test_v4_layer_text_lists_every_cache_once():
    text = v4_layer_text((4,))
    assert text.splitlines()[0] == "ratio-4 layer (CSA): 5 caches"
    assert all(len(line) <= 95 for line in v4_layer_text((4, 128)).splitlines())
    assert [line.split()[1] for line in text.splitlines()[1::2]] == [
        "idx",
        "idx_state",
        "swa",
        "c4",
        "c4_state",
    ]
    with pytest.raises(ValueError):
        v4_layer_text((8,))
    assert isinstance(draw_v4_layer(), Figure)


def test_position_strip_marks_ratio_4_entries_and_their_overlapping_windows():
    lines = position_strip_text(8).splitlines()
    assert lines[2] == "pos   2: swa row 2, state rows of c4, idx, c128"
    assert lines[3].endswith("| c4 entry 0 (tokens 0..3), idx key 0")
    assert "c4 entry 1 (tokens 0..7)" in lines[7]  # windows of 8 tokens overlap by 4
    assert "c128 entry" not in lines[7]
    last = position_strip_text(128).splitlines()[127]
    assert "c4 entry 31 (tokens 120..127)" in last and "c128 entry 0 (tokens 0..127)" in last
    assert max(len(line) for line in position_strip_text(100).splitlines()) <= 95
    with pytest.raises(ValueError):
        position_strip_text(0)
    assert isinstance(draw_position_strip(16), Figure)


def test_layer_view_places_one_page_per_block_a_stride_apart():
    text = layer_view_text("L", offset=100, page=50, stride=1000, num_blocks=3).splitlines()
    assert text[1:] == [
        "  block 0: bytes 100..149 of the slab",
        "  block 1: bytes 1,100..1,149 of the slab",
        "  block 2: bytes 2,100..2,149 of the slab",
    ]
    for bad in ({"offset": 990}, {"offset": -1}, {"num_blocks": 0}):
        args = {"offset": 100, "page": 50, "stride": 1000, "num_blocks": 3, **bad}
        with pytest.raises(ValueError):
            layer_view_text("L", **args)
    assert isinstance(draw_layer_view("L", 100, 50, 1000, 3), Figure)


def test_toy_has_the_same_five_groups_as_pro():
    toy = toy_v4_specs()
    assert len(toy) == 19 and {v4.parse_layer_name(n)[0] for n in toy} == set(
        range(TOY_LAYERS)
    )
    # planner C (vLLM's) and the article's B
    for get_groups in (get_kv_cache_groups, get_kv_cache_groups_b):
        pro_groups = get_groups(v4.kv_cache_specs("pro"))
        toy_groups = get_groups(toy)
        assert [group_kind(g) for g in toy_groups] == [group_kind(g) for g in pro_groups]
        assert len(toy_groups) == len(TOY_GROUP_LABELS)
    c_groups = get_kv_cache_groups(toy)
    assert [[short_name(n, toy[n]) for n in g.layer_names] for g in c_groups][:2] == [
        ["L0.swa", "L2.swa", "L4.swa"],
        ["L1.swa", "L3.swa"],
    ]
    assert get_packed_kv_cache_layout(get_kv_cache_groups_b(toy))[0] == max(
        g.width_bytes for g in c_groups
    )
    # four layers are too few for planner C: the ratio-4 state bucket's single layer makes d =
    # 1
    assert len(get_kv_cache_groups(toy_v4_specs(4))) == 9
    for bad in (0, 62, 2.0, True):
        with pytest.raises(ValueError):
            toy_v4_specs(bad)


def test_tiny_toy_is_the_toy_and_plans_into_the_same_five_groups():
    from refimpl.course.hybrid_toy import TOY_COMPRESS_RATIOS
    from refimpl.v4.tiny import tiny_v4_config_dict

    assert TOY_COMPRESS_RATIOS == (128, 128, 4, 128, 4)
    toy = toy_v4_specs()
    assert [toy[f"layers.{i}.attn"].compress_ratio for i in range(TOY_LAYERS)] == list(
        TOY_COMPRESS_RATIOS
    )
    tiny = v4.DeepseekV4Config.from_hf_config(
        tiny_v4_config_dict(compress_ratios=TOY_COMPRESS_RATIOS)
    )
    tiny_specs = v4.kv_cache_specs(tiny, cache_dtype="float32")
    short = lambda specs, groups: [  # noqa: E731
        [short_name(n, specs[n]) for n in g.layer_names] for g in groups
    ]
    assert short(tiny_specs, get_kv_cache_groups(tiny_specs)) == short(
        toy, get_kv_cache_groups(toy)
    )
