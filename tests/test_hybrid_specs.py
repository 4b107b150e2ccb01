"""Spec types: page sizes, alignment padding, hashing, uniform-type merging."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from refimpl.hybrid.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    UniformTypeKVCacheSpecs,
    round_up,
)


def v4_mla(ratio, alignment=576):
    return MLAAttentionSpec(
        block_size=256,
        num_kv_heads=1,
        head_size=512,
        dtype="uint8",
        compress_ratio=ratio,
        cache_dtype_str="fp8_ds_mla",
        alignment=alignment,
        model_version="deepseek_v4",
    )


def test_v4_main_attention_pages():
    c4, c128 = v4_mla(4), v4_mla(128)
    assert (c4.storage_block_size, c4.real_page_size_bytes, c4.page_size_bytes) == (
        64,
        37376,
        37440,
    )
    assert (c128.storage_block_size, c128.real_page_size_bytes, c128.page_size_bytes) == (
        2,
        1168,
        1728,
    )
    assert c4.page_size_padded == 37440 and c4.entry_bytes == 584


def test_alignment_only_sets_padding_when_it_adds_bytes():
    spec = MLAAttentionSpec(
        block_size=256,
        num_kv_heads=1,
        head_size=512,
        dtype="bfloat16",
        compress_ratio=4,
        alignment=512,
    )
    assert spec.real_page_size_bytes == 64 * 1024
    assert spec.page_size_padded is None and spec.page_size_bytes == 65536


def test_v32_layout_and_plain_rows():
    v32 = MLAAttentionSpec(
        block_size=64,
        num_kv_heads=1,
        head_size=576,
        dtype="uint8",
        cache_dtype_str="fp8_ds_mla",
    )
    assert v32.real_page_size_bytes == 64 * 656
    # V3.2's 656-byte rows count every token of the logical block, even with a compress ratio
    # set
    v32_ratio = MLAAttentionSpec(
        block_size=64,
        num_kv_heads=1,
        head_size=576,
        dtype="uint8",
        cache_dtype_str="fp8_ds_mla",
        compress_ratio=4,
    )
    assert v32_ratio.real_page_size_bytes == 64 * 656
    full = FullAttentionSpec(
        block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16
    )
    assert full.dtype == "bfloat16"
    assert full.real_page_size_bytes == 2 * 16 * 8 * 128 * 2  # key and value


def test_sliding_window_mla_state_pages():
    idx_state = SlidingWindowMLASpec(
        block_size=4,
        num_kv_heads=1,
        head_size=512,
        dtype="float32",
        sliding_window=8,
        alignment=576,
    )
    c4_state = SlidingWindowMLASpec(
        block_size=4,
        num_kv_heads=1,
        head_size=2048,
        dtype="float32",
        sliding_window=8,
        alignment=576,
    )
    c128_state = SlidingWindowMLASpec(
        block_size=8,
        num_kv_heads=1,
        head_size=1024,
        dtype="float32",
        sliding_window=128,
        alignment=576,
    )
    assert [s.real_page_size_bytes for s in (idx_state, c4_state, c128_state)] == [
        8192,
        32768,
        32768,
    ]
    assert [s.page_size_bytes for s in (idx_state, c4_state, c128_state)] == [
        8640,
        32832,
        32832,
    ]


def test_specs_are_frozen_hashable_and_readable():
    a, b = v4_mla(4), v4_mla(4)
    assert a == b and hash(a) == hash(b) and len({a, b, v4_mla(128)}) == 2
    with pytest.raises(AttributeError):
        a.block_size = 64
    assert "compress_ratio=4" in repr(a) and "page_size_padded=37440" in repr(a)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(block_size=0), "block_size"),
        (dict(compress_ratio=3), "multiple of compress_ratio"),
        (dict(dtype="int3"), "unsupported cache dtype"),
        (dict(alignment=0), "alignment"),
    ],
)
def test_bad_spec_arguments(kwargs, words):
    base = dict(block_size=256, num_kv_heads=1, head_size=512, dtype="uint8")
    with pytest.raises(ValueError, match=words):
        MLAAttentionSpec(**{**base, **kwargs})


def test_padded_page_smaller_than_real_is_rejected():
    with pytest.raises(ValueError, match="smaller than the real page"):
        FullAttentionSpec(
            block_size=16, num_kv_heads=1, head_size=8, dtype="float32", page_size_padded=10
        )


def test_uniform_type_specs_sum_pages_and_count_tuples():
    members = {"a": v4_mla(128), "b": v4_mla(4), "c": v4_mla(128)}
    u = UniformTypeKVCacheSpecs.from_specs(members)
    assert u.page_size_bytes == 2 * 1728 + 37440
    assert u.get_num_layer_tuples() == 2
    assert u.page_size_counts() == {1728: 2, 37440: 1}
    assert hash(u) == hash(UniformTypeKVCacheSpecs.from_specs(dict(members)))
    assert u.kv_cache_specs["b"] == v4_mla(4)
    assert "layers=[2x1728, 1x37440]" in repr(u)


def test_uniform_type_refuses_mixed_families_windows_and_block_sizes():
    swa8 = SlidingWindowMLASpec(
        block_size=4, num_kv_heads=1, head_size=8, dtype="float32", sliding_window=8
    )
    swa128 = SlidingWindowMLASpec(
        block_size=4, num_kv_heads=1, head_size=8, dtype="float32", sliding_window=128
    )
    assert UniformTypeKVCacheSpecs.from_specs({"m": v4_mla(4), "s": swa8}) is None
    assert UniformTypeKVCacheSpecs.from_specs({"s": swa8, "t": swa128}) is None
    swa_bs8 = SlidingWindowMLASpec(
        block_size=8, num_kv_heads=1, head_size=8, dtype="float32", sliding_window=8
    )
    assert UniformTypeKVCacheSpecs.from_specs({"s": swa8, "t": swa_bs8}) is None
    with pytest.raises(ValueError, match="not of one uniform type"):
        UniformTypeKVCacheSpecs(block_size=4, kv_cache_specs={"s": swa8, "t": swa128})


def test_group_and_config_records():
    u = UniformTypeKVCacheSpecs.from_specs({"a": v4_mla(128), "b": v4_mla(4)})
    g = KVCacheGroupSpec(["a", "b"], u)
    assert g.layer_names == ("a", "b") and g.width_bytes == 1728 + 37440
    assert g.page_size_of("b") == 37440 and hash(g) == hash(KVCacheGroupSpec(("a", "b"), u))
    with pytest.raises(ValueError, match="no spec"):
        KVCacheGroupSpec(["a", "zzz"], u)
    t = KVCacheTensor(size=10, shared_by=["a"], offset=0, block_stride=5)
    cfg = KVCacheConfig(2, [t], [g])
    assert cfg.num_usable_blocks == 1 and cfg.block_stride == 5 and cfg.is_packed


@given(st.integers(1, 4096), st.integers(1, 4096))
def test_round_up_property(x, m):
    r = round_up(x, m)
    assert r % m == 0 and x <= r < x + m


@given(
    st.sampled_from([1, 2, 4, 8, 16]),
    st.integers(1, 64),
    st.sampled_from([None, 64, 512, 576]),
)
def test_page_size_is_aligned_and_at_least_real(ratio, head, alignment):
    spec = SlidingWindowMLASpec(
        block_size=16 * ratio,
        num_kv_heads=1,
        head_size=head,
        dtype="bfloat16",
        sliding_window=8,
        compress_ratio=ratio,
        alignment=alignment,
    )
    assert spec.page_size_bytes >= spec.real_page_size_bytes
    if alignment:
        assert spec.page_size_bytes % alignment == 0
        assert spec.page_size_bytes - spec.real_page_size_bytes < alignment
    else:
        assert spec.page_size_bytes == spec.real_page_size_bytes
    assert spec.storage_block_size == 16
