"""Float32 cache specs from an HF DeepSeek V4 config (Part II's one spec builder, sizes read by
`DeepseekV4Config.from_hf_config`), planned by Part II into one packed slab."""

from __future__ import annotations

import pytest

from refimpl.hybrid import get_kv_cache_groups
from refimpl.hybrid.deepseek_v4 import DeepseekV4Config, kv_cache_specs
from refimpl.hybrid.older_planners import get_kv_cache_groups_b
from refimpl.v4.cache import build_kv_cache
from refimpl.v4.tiny import tiny_v4_config_dict


def kv_cache_specs_from_hf(config, **kwargs):
    return kv_cache_specs(
        DeepseekV4Config.from_hf_config(config), cache_dtype="float32", **kwargs
    )


def test_specs_names_sizes_and_groups():
    # layers 0 sliding, 1 CSA, 2 HCA, 3 CSA; head 32, indexer head 16
    config = tiny_v4_config_dict()
    specs = kv_cache_specs_from_hf(config)
    assert list(specs)[:6] == [
        "layers.0.swa_cache",
        "layers.1.indexer.k_cache",
        "layers.1.indexer.compressor.state_cache",
        "layers.1.swa_cache",
        "layers.1.attn",
        "layers.1.compressor.state_cache",
    ]
    pages = {name: spec.page_size_bytes for name, spec in specs.items()}
    assert pages["layers.0.swa_cache"] == 64 * 32 * 4  # 64 tokens x 32 floats
    assert pages["layers.1.attn"] == 64 * 32 * 4  # 256 tokens / 4 = 64 entries
    assert pages["layers.2.attn"] == 2 * 32 * 4  # 256 / 128 = 2 entries
    assert pages["layers.1.indexer.k_cache"] == 64 * 16 * 4
    # 4 tokens x [kv_a kv_b s_a s_b]
    assert pages["layers.1.compressor.state_cache"] == 4 * (4 * 32) * 4
    assert pages["layers.2.compressor.state_cache"] == 8 * (2 * 32) * 4  # 8 tokens x [kv s]
    assert pages["layers.1.indexer.compressor.state_cache"] == 4 * (4 * 16) * 4
    # planner C, as vLLM 0.32/0.33 run it: sliding-window groups first
    groups = get_kv_cache_groups(specs)
    assert [g.kv_cache_spec.block_size for g in groups] == [64, 64, 256, 4, 8]
    article = get_kv_cache_groups_b(specs)  # the article's version keeps registration order
    assert [g.kv_cache_spec.block_size for g in article] == [256, 64, 64, 4, 8]


def test_views_alias_one_slab():
    kv = build_kv_cache(tiny_v4_config_dict(), num_blocks=8)
    assert kv.config.is_packed
    pointers = {v.untyped_storage().data_ptr() for v in kv.views.values()}
    assert len(pointers) == 1
    swa = kv.layers[0].swa.view
    swa[3, 5] = 7.0  # block 3 of layer 0's window cache ...
    stride = kv.config.block_stride
    assert swa.stride(0) * 4 == stride  # ... is 3 block strides into the slab


@pytest.mark.parametrize(
    "rates",
    [
        {"compressed_sparse_attention": 8, "heavily_compressed_attention": 128},
        {"compressed_sparse_attention": 4, "heavily_compressed_attention": 64},
    ],
)
def test_other_compress_ratios_are_refused(rates):
    config = dict(tiny_v4_config_dict(), compress_rates=rates)
    with pytest.raises(ValueError, match="compress ratio"):
        kv_cache_specs_from_hf(config)


def test_pool_of_one_block_is_refused():
    with pytest.raises(ValueError, match="num_blocks"):
        build_kv_cache(tiny_v4_config_dict(), num_blocks=1)


def test_sizes_from_an_hf_config_object_and_dict_agree():
    from transformers import DeepseekV4Config as HFConfig

    raw = tiny_v4_config_dict(
        compress_ratios=(128, 0, 4), sliding_window=128, index_head_dim=32
    )
    fields = {
        k: v for k, v in raw.items() if k not in ("architectures", "model_type", "torch_dtype")
    }
    sizes = DeepseekV4Config.from_hf_config(raw)
    assert sizes == DeepseekV4Config.from_hf_config(HFConfig(**fields))
    assert (
        sizes.compress_ratios,
        sizes.head_dim,
        sizes.index_head_dim,
        sizes.sliding_window,
    ) == ((128, 0, 4), 32, 32, 128)


def test_float32_rows_have_no_vllm_row_format():
    specs = kv_cache_specs_from_hf(tiny_v4_config_dict())
    assert {spec.dtype for spec in specs.values()} == {"float32"}
    assert all(getattr(spec, "alignment", None) is None for spec in specs.values())
    with pytest.raises(ValueError, match="indexer must be None"):
        kv_cache_specs_from_hf(tiny_v4_config_dict(), indexer="fp8")


@pytest.mark.parametrize("missing", ["layer_types", "compress_rates", "head_dim"])
def test_a_config_without_v4_fields_is_refused(missing):
    config = {k: v for k, v in tiny_v4_config_dict().items() if k != missing}
    with pytest.raises(ValueError, match=f"no '{missing}'"):
        DeepseekV4Config.from_hf_config(config)
