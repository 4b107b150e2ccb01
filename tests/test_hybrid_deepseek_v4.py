"""DeepSeek V4 inventory: which caches each layer registers, in which order, with which
pages."""

import pytest

from refimpl.course.v4_inventory import layer_kinds, short_name
from refimpl.hybrid import deepseek_v4 as v4
from refimpl.hybrid.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec


def test_pro_and_flash_layer_ratios():
    assert v4.PRO.num_hidden_layers == 61 and v4.FLASH.num_hidden_layers == 43
    pro = v4.PRO.compress_ratios
    assert pro[:4] == (128, 128, 4, 128) and pro[-1] == 4
    assert (pro.count(4), pro.count(128)) == (30, 31)
    flash = v4.FLASH.compress_ratios
    assert flash[:3] == (0, 0, 4) and flash[-1] == 4
    assert (flash.count(0), flash.count(4), flash.count(128)) == (2, 21, 20)


def test_pro_registration_order_inside_layers():
    names = list(v4.kv_cache_specs("pro"))
    assert names[:8] == [
        "layers.0.swa_cache",
        "layers.0.attn",
        "layers.0.compressor.state_cache",
        "layers.1.swa_cache",
        "layers.1.attn",
        "layers.1.compressor.state_cache",
        "layers.2.indexer.k_cache",
        "layers.2.indexer.compressor.state_cache",
    ]
    assert names[8:11] == [
        "layers.2.swa_cache",
        "layers.2.attn",
        "layers.2.compressor.state_cache",
    ]
    assert names[-1] == "layers.60.compressor.state_cache"
    assert len(names) == 61 + 31 * 2 + 30 * 4


def test_kind_counts_and_pages_pro_fp8():
    specs = v4.kv_cache_specs("pro")
    assert layer_kinds(specs) == {
        "swa": 61,
        "c128": 31,
        "c128_state": 31,
        "idx": 30,
        "idx_state": 30,
        "c4": 30,
        "c4_state": 30,
    }
    pages = {
        short_name(n, s).split(".")[1]: (s.real_page_size_bytes, s.page_size_bytes)
        for n, s in specs.items()
    }
    assert pages == {
        "swa": (37376, 37440),
        "c128": (1168, 1728),
        "c4": (37376, 37440),
        "idx": (8448, 8640),
        "idx_state": (8192, 8640),
        "c4_state": (32768, 32832),
        "c128_state": (32768, 32832),
    }


def test_spec_details_follow_the_model_code():
    specs = v4.kv_cache_specs("pro")
    swa = specs["layers.0.swa_cache"]
    assert isinstance(swa, SlidingWindowMLASpec)
    assert (swa.block_size, swa.sliding_window, swa.model_version, swa.storage_block_size) == (
        64,
        128,
        "deepseek_v4",
        64,
    )
    idx = specs["layers.2.indexer.k_cache"]
    assert (
        isinstance(idx, MLAAttentionSpec)
        and idx.model_version is None
        and idx.cache_dtype_str is None
    )
    assert (idx.head_size, idx.compress_ratio, idx.storage_block_size) == (132, 4, 64)
    c4_state = specs["layers.2.compressor.state_cache"]
    c128_state = specs["layers.3.compressor.state_cache"]
    idx_state = specs["layers.2.indexer.compressor.state_cache"]
    assert [
        (s.block_size, s.sliding_window, s.head_size, s.dtype)
        for s in (idx_state, c4_state, c128_state)
    ] == [(4, 8, 512, "float32"), (4, 8, 2048, "float32"), (8, 128, 1024, "float32")]
    assert all(
        s.compress_ratio == 1 and s.model_version is None
        for s in (idx_state, c4_state, c128_state)
    )


def test_fp4_indexer_and_bf16_cache():
    idx = v4.kv_cache_specs("pro", indexer="fp4")["layers.2.indexer.k_cache"]
    assert (idx.real_page_size_bytes, idx.page_size_bytes) == (64 * 68, 4608)
    bf16 = v4.kv_cache_specs("pro", cache_dtype="bfloat16")
    assert bf16["layers.2.attn"].page_size_bytes == 64 * 512 * 2
    assert bf16["layers.0.attn"].page_size_bytes == 2 * 512 * 2
    assert bf16["layers.2.indexer.k_cache"].page_size_bytes == 8704  # 8448 rounded up to 512
    assert bf16["layers.0.swa_cache"].page_size_bytes == 65536
    assert bf16["layers.3.compressor.state_cache"].page_size_bytes == 32768


def test_mtp_layer_registers_last_and_only_swa():
    pro = v4.kv_cache_specs("pro", mtp=True)
    assert list(pro)[-1] == "layers.61.swa_cache" and "layers.61.attn" not in pro
    flash = v4.kv_cache_specs("flash", mtp=True)
    assert list(flash)[-1] == "layers.43.swa_cache"
    assert list(v4.kv_cache_specs("flash"))[:3] == [
        "layers.0.swa_cache",
        "layers.1.swa_cache",
        "layers.2.indexer.k_cache",
    ]


def test_block_size_changes_storage_entries():
    specs = v4.kv_cache_specs("pro", block_size=512)
    assert specs["layers.2.attn"].storage_block_size == 128
    assert specs["layers.0.attn"].storage_block_size == 4
    assert specs["layers.0.swa_cache"].block_size == 64  # hard-coded


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(variant="ultra"), "variant"),
        (dict(cache_dtype="fp16"), "cache_dtype"),
        (dict(indexer="int4"), "indexer"),
        (dict(block_size=100), "multiple of 128"),
    ],
)
def test_bad_arguments(kwargs, words):
    with pytest.raises(ValueError, match=words):
        v4.kv_cache_specs(**kwargs)


def test_names_round_trip():
    specs = v4.kv_cache_specs("flash")
    for name, spec in specs.items():
        layer, kind = v4.parse_layer_name(name)
        assert v4.layer_name(layer, kind) == name
        assert short_name(name, spec).startswith(f"L{layer}.")
    with pytest.raises(ValueError):
        v4.parse_layer_name("model.norm")
    assert short_name("layers.3.attn", specs["layers.3.attn"]) == "L3.c128"
    assert (
        short_name("layers.2.compressor.state_cache", specs["layers.2.compressor.state_cache"])
        == "L2.c4_state"
    )
