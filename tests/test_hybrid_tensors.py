"""Tensor views: one backing slab, strided per-layer views, byte addresses, isolation of
pages."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from refimpl.course.v4_inventory import short_name
from refimpl.errors import InvariantError
from refimpl.hybrid import deepseek_v4 as v4
from refimpl.hybrid.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    UniformTypeKVCacheSpecs,
)
from refimpl.hybrid.kv_cache_planning import get_kv_cache_config, get_kv_cache_groups
from refimpl.hybrid.older_planners import get_kv_cache_config_b, get_kv_cache_groups_b
from refimpl.hybrid.tensors import (
    allocate_kv_cache,
    bind_kv_cache,
    byte_address,
    kv_cache_shape,
    make_layers,
    view_byte_address,
    view_kind,
)

PRO = v4.kv_cache_specs("pro")
GROUPS = get_kv_cache_groups_b(PRO)
CONFIG = get_kv_cache_config_b(GROUPS, 0, num_blocks_override=3)
STRIDE = 1435968


def _raw(view):
    """The int8 backing tensor a view lives in."""
    return torch.empty(0, dtype=torch.int8).set_(view.untyped_storage())


def test_packed_config_has_one_backing_tensor_and_article_shapes():
    views = allocate_kv_cache(CONFIG)
    assert len({v.untyped_storage().data_ptr() for v in views.values()}) == 1
    assert _raw(views["layers.0.attn"]).numel() == 3 * STRIDE
    shapes = {
        short_name(n, PRO[n]).split(".")[1]: (tuple(v.shape), v.dtype)
        for n, v in views.items()
    }
    assert shapes == {
        "swa": ((3, 64, 584), torch.uint8),
        "c4": ((3, 64, 584), torch.uint8),
        "c128": ((3, 2, 584), torch.uint8),
        "idx": ((3, 64, 132), torch.uint8),
        "idx_state": ((3, 4, 512), torch.float32),
        "c4_state": ((3, 4, 2048), torch.float32),
        "c128_state": ((3, 8, 1024), torch.float32),
    }
    for name, view in views.items():
        assert view.stride(0) * view.element_size() == STRIDE, name
        assert view_kind(CONFIG, name) == "packed"


def test_byte_address_matches_view_strides_for_every_layer():
    views = allocate_kv_cache(CONFIG)
    for group in GROUPS:
        for name in group.layer_names:
            entries = views[name].shape[1]
            for block, token in ((0, 0), (2, entries - 1), (1, entries // 2)):
                assert byte_address(CONFIG, name, block, token) == view_byte_address(
                    views[name], block, token
                )
    assert byte_address(CONFIG, "layers.2.attn", 1, 0) == STRIDE + 12096
    with pytest.raises(ValueError, match="block_id"):
        byte_address(CONFIG, "layers.2.attn", 3, 0)
    with pytest.raises(ValueError, match="token_offset"):
        byte_address(CONFIG, "layers.0.attn", 0, 2)


@given(st.integers(0, 4), st.data())
def test_writing_a_page_touches_only_that_layer_in_that_block(group_index, data):
    group = GROUPS[group_index]
    views = allocate_kv_cache(CONFIG)
    name = data.draw(st.sampled_from(group.layer_names))
    block = data.draw(st.integers(0, 2))
    raw = _raw(views[name])
    views[name][block].view(torch.uint8).fill_(7)  # every byte of the page, any dtype
    changed = torch.nonzero(raw).flatten()
    start = byte_address(CONFIG, name, block, 0)
    page = group.layer_spec(name).real_page_size_bytes
    assert changed.min().item() == start and changed.max().item() == start + page - 1
    assert changed.numel() == page
    for other in group.layer_names:
        if other != name:
            assert not views[other].view(torch.uint8).any(), other


def test_two_groups_own_different_blocks_of_one_slab():
    views = allocate_kv_cache(CONFIG)
    mla, swa = "layers.0.attn", "layers.0.swa_cache"  # both at offset 0 of their group
    views[mla][1].fill_(11)  # block 1 belongs to the MLA group
    views[swa][2].fill_(22)  # block 2 belongs to the first SWA group
    assert (views[mla][1] == 11).all() and (views[swa][2] == 22).all()
    changed = torch.nonzero(_raw(views[mla])).flatten()
    expected = torch.cat(
        [torch.arange(STRIDE, STRIDE + 1168), torch.arange(2 * STRIDE, 2 * STRIDE + 37376)]
    )
    assert torch.equal(changed, expected)
    # The same block id would alias: the SWA view of block 1 sees the MLA bytes, and the MLA
    # view of block 2 sees the SWA bytes. That is why a block id belongs to one group at a
    # time.
    assert (views[swa][1][0, :584] == 11).all() and (views[mla][2] == 22).all()


def test_padded_views_use_as_strided_and_skip_padding():
    members = {n: PRO[n] for n in ("layers.0.attn", "layers.2.attn")}
    group = KVCacheGroupSpec(list(members), UniformTypeKVCacheSpecs.from_specs(members))
    cfg = get_kv_cache_config_b([group], 0, num_blocks_override=4)
    views = allocate_kv_cache(cfg)
    c128 = views["layers.0.attn"]
    assert view_kind(cfg, "layers.0.attn") == "padded"
    assert tuple(c128.shape) == (4, 2, 584) and c128.stride(0) == 1728
    c128[1].fill_(5)
    raw = _raw(c128)
    assert raw.numel() == 4 * 1728
    assert (raw[1728 : 1728 + 1168] == 5).all() and not raw[1728 + 1168 : 2 * 1728].any()
    for block, token in ((3, 1), (1, 0)):
        assert byte_address(cfg, "layers.0.attn", block, token) == view_byte_address(
            c128, block, token
        )


def test_contiguous_views_for_ordinary_attention():
    full = FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, dtype="float32")
    cfg = get_kv_cache_config_b(
        [KVCacheGroupSpec(["a", "b"], full)], 2 * full.page_size_bytes * 5
    )
    views = allocate_kv_cache(cfg)
    assert tuple(views["a"].shape) == (5, 2, 4, 2, 8) == kv_cache_shape(full, 5)
    assert view_kind(cfg, "a") == "contiguous" and views["a"].is_contiguous()
    assert views["a"].untyped_storage().data_ptr() != views["b"].untyped_storage().data_ptr()
    for kv in (0, 1):
        assert byte_address(cfg, "a", 3, 2, kv=kv) == view_byte_address(
            views["a"], 3, 2, kv=kv
        )
    with pytest.raises(ValueError, match="kv must be"):
        byte_address(CONFIG, "layers.0.attn", 0, 0, kv=1)


def test_general_layout_shares_tensor_i_between_groups():
    full = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float32")
    groups = [KVCacheGroupSpec(["f.0", "f.1"], full), KVCacheGroupSpec(["g.0", "g.1"], full)]
    cfg = get_kv_cache_config_b(groups, 2 * full.page_size_bytes * 3)
    views = allocate_kv_cache(cfg)
    storage = {n: v.untyped_storage().data_ptr() for n, v in views.items()}
    assert storage["f.0"] == storage["g.0"] != storage["f.1"] == storage["g.1"]
    views["f.0"][1].fill_(1.0)  # group 0 owns block 1, group 1 owns block 2
    views["g.0"][2].fill_(2.0)
    assert (
        (views["f.0"][1] == 1).all()
        and (views["g.0"][2] == 2).all()
        and not views["f.1"].any()
    )
    assert byte_address(cfg, "g.0", 2, 3, kv=1) == view_byte_address(views["g.0"], 2, 3, kv=1)


def test_bind_views_to_layer_objects():
    views = allocate_kv_cache(CONFIG)
    layers = make_layers(CONFIG)
    bind_kv_cache(views, layers)
    assert layers["layers.2.attn"].kv_cache is views["layers.2.attn"]
    assert "shape=(3, 64, 584)" in repr(layers["layers.2.attn"])
    with pytest.raises(ValueError, match="no layer object"):
        bind_kv_cache({"ghost": views["layers.2.attn"]}, layers)


def test_inconsistent_config_is_an_invariant_error():
    broken = KVCacheConfig(3, CONFIG.kv_cache_tensors[1:], CONFIG.kv_cache_groups)
    with pytest.raises(InvariantError, match="disagree"):
        allocate_kv_cache(broken)
    twice = KVCacheConfig(
        3,
        (*CONFIG.kv_cache_tensors, KVCacheTensor(3 * STRIDE, ("layers.0.attn",), 0, STRIDE)),
        CONFIG.kv_cache_groups,
    )
    with pytest.raises(InvariantError, match="two KVCacheTensors"):
        allocate_kv_cache(twice)


def test_planner_c_views_sit_layer_stride_apart_and_match_byte_address():
    groups = get_kv_cache_groups(PRO)  # planner C, the default
    config = get_kv_cache_config(groups, 0, num_blocks_override=3)
    views = allocate_kv_cache(config)
    (mla_c4,) = [t for t in config.kv_cache_tensors if "layers.2.attn" in t.shared_by]
    # the MLA group's third run: 31 ratio-128 pages (1,728 B) and 30 indexer pages (8,640 B)
    # come first
    assert (mla_c4.offset, mla_c4.layer_stride, mla_c4.shared_by[:2]) == (
        312768,
        37440,
        ("layers.2.attn", "layers.4.attn"),
    )
    assert byte_address(config, "layers.4.attn", 1, 0) == 1435968 + 312768 + 37440
    for group in groups:
        for name in group.layer_names[:3] + group.layer_names[-2:]:
            for block, token in ((0, 0), (2, 1)):
                assert byte_address(config, name, block, token) == view_byte_address(
                    views[name], block, token
                )
    # within a group no two layers overlap: pages [start, start + page) are disjoint and inside
    # the stride
    for group in groups:
        spans = sorted(
            (t.layer_offset(n), t.layer_offset(n) + group.page_size_of(n))
            for t in config.kv_cache_tensors
            for n in t.shared_by
            if n in group.layer_names
        )
        assert (
            all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
            and spans[-1][1] <= config.block_stride
        )
