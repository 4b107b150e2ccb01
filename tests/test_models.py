"""refimpl.models: config.json -> per-layer KV cache specs (rules read from vLLM 0.32)."""

from pathlib import Path

import pytest

from refimpl.hybrid.kv_cache_interface import (
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from refimpl.models import get_kv_cache_spec
from refimpl.models.backends import BACKENDS, get_backend

CONFIGS = Path(__file__).parent / "data" / "configs"


def specs(name, **kwargs):
    return get_kv_cache_spec(CONFIGS / name, **kwargs)


def test_llama_31_8b_is_32_full_attention_layers_of_8_heads():
    model = specs("llama-3.1-8b")
    assert list(model.specs) == [f"model.layers.{i}.self_attn.attn" for i in range(32)]
    assert set(model.specs.values()) == {
        FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    }
    # 2 (K and V) x 16 tokens x 8 heads x 128 x 2 bytes
    assert model.specs["model.layers.0.self_attn.attn"].page_size_bytes == 65536
    assert model.max_model_len == 131072  # llama3 rope scaling does not stretch the length


@pytest.mark.parametrize(("tp", "heads"), [(1, 8), (2, 4), (4, 2), (8, 1), (16, 1), (32, 1)])
def test_tensor_parallel_divides_kv_heads_and_replicates_below_one(tp, heads):
    model = specs("llama-3.1-8b", tensor_parallel_size=tp)
    assert {s.num_kv_heads for s in model.specs.values()} == {heads}


def test_tensor_parallel_that_does_not_divide_the_heads_is_refused():
    with pytest.raises(ValueError, match="8 KV heads cannot be split over 3"):
        specs("llama-3.1-8b", tensor_parallel_size=3)
    with pytest.raises(ValueError, match="cannot replicate"):
        specs("qwen2.5-7b-instruct", tensor_parallel_size=6)  # 4 heads


@pytest.mark.parametrize(
    ("kv_cache_dtype", "dtype", "page"),
    [("auto", "bfloat16", 65536), ("fp8", "uint8", 32768), ("fp8_e5m2", "uint8", 32768)],
)
def test_kv_cache_dtype(kv_cache_dtype, dtype, page):
    spec = specs("llama-3.1-8b", kv_cache_dtype=kv_cache_dtype).specs[
        "model.layers.0.self_attn.attn"
    ]
    assert (spec.dtype, spec.page_size_bytes) == (dtype, page)


def test_float32_checkpoint_is_served_in_bfloat16():
    model = specs("gemma-2-9b-it")  # torch_dtype float32 in its config.json
    assert model.model_dtype == "bfloat16" and model.kv_dtype == "bfloat16"


def test_gemma3_reads_text_config_and_every_sixth_layer_is_global():
    model = specs("gemma-3-27b-it")
    names = list(model.specs)
    assert len(names) == 62 and names[0] == "language_model.model.layers.0.self_attn.attn"
    full = [i for i, s in enumerate(model.specs.values()) if type(s) is FullAttentionSpec]
    assert full == list(range(5, 62, 6))
    sliding = [s for s in model.specs.values() if isinstance(s, SlidingWindowSpec)]
    assert {(s.sliding_window, s.num_kv_heads, s.head_size) for s in sliding} == {
        (1024, 16, 128)
    }
    assert model.max_model_len == 131072  # gemma3: its linear rope factor is not applied


def test_gemma2_alternates_from_the_first_layer():
    kinds = [type(s).__name__ for s in specs("gemma-2-9b-it").specs.values()]
    assert kinds[:4] == ["SlidingWindowSpec", "FullAttentionSpec"] * 2 and len(kinds) == 42


def test_gpt_oss_slides_even_layers():
    model = specs("gpt-oss-20b")
    windows = [getattr(s, "sliding_window", None) for s in model.specs.values()]
    assert windows == [128, None] * 12
    assert list(model.specs)[1] == "model.layers.1.attn.attn"


def test_qwen2_window_off_without_use_sliding_window():
    model = specs("qwen2.5-7b-instruct")  # sliding_window 131072, use_sliding_window false
    assert all(type(s) is FullAttentionSpec for s in model.specs.values())


def test_deepseek_v3_is_mla_with_one_576_wide_row_in_flash_attn_mla_blocks():
    # vLLM 0.32 on Hopper tries FlashAttention MLA first: any multiple of 16 tokens
    model = specs("deepseek-v3", tensor_parallel_size=8)
    spec = model.specs["model.layers.0.self_attn.attn"]
    assert isinstance(spec, MLAAttentionSpec) and len(model.specs) == 61
    assert model.backend.name == "FLASH_ATTN_MLA"
    assert (spec.num_kv_heads, spec.head_size, spec.block_size) == (1, 576, 16)
    assert spec.page_size_bytes == 16 * 576 * 2 and spec.kernel_block_size is None
    assert model.max_model_len == 163840


def test_an_fp8_mla_cache_goes_to_flashmla_and_its_64_token_blocks():
    # FlashAttention MLA stores no fp8 cache; FlashMLA, next in vLLM's order, does
    for dtype in ("fp8", "fp8_e4m3"):
        model = specs("deepseek-v3", kv_cache_dtype=dtype)
        spec = model.specs["model.layers.0.self_attn.attn"]
        assert model.backend.name == "FLASHMLA"
        assert (spec.block_size, spec.kernel_block_size) == (64, 64)
        assert spec.page_size_bytes == 64 * 576


def test_default_backend_follows_vllms_hopper_order_for_the_cache_dtype():
    from refimpl.models.backends import default_backend

    assert default_backend(mla=True) == "flash_attn_mla"
    assert default_backend(mla=True, kv_cache_dtype="bfloat16") == "flash_attn_mla"
    assert default_backend(mla=True, kv_cache_dtype="fp8") == "flashmla"
    assert default_backend(mla=False, kv_cache_dtype="fp8") == "flash_attn"
    assert default_backend(mla=False, kv_cache_dtype="fp8_e5m2") == "flashinfer"
    # no Hopper MLA backend stores fp8_e5m2: vLLM finds no valid backend
    with pytest.raises(ValueError, match="no MLA backend .* 'fp8_e5m2'.*fp8_e4m3"):
        specs("deepseek-v3", kv_cache_dtype="fp8_e5m2")
    with pytest.raises(ValueError, match="'flash_attn_mla' does not store a 'fp8' KV cache"):
        specs("deepseek-v3", backend="flash_attn_mla", kv_cache_dtype="fp8")


def test_granite_h_block_is_aligned_to_the_mamba_state():
    model = specs("granite-4.0-h-tiny")
    mamba = model.specs["model.layers.0.mixer"]
    attention = model.specs["model.layers.5.self_attn.attn"]
    assert isinstance(mamba, MambaSpec) and type(attention) is FullAttentionSpec
    # conv (3, 2*1536 + 2*128) and SSM (48, 64, 128), bf16: 806,400 B per request
    assert mamba.shapes == ((3, 3328), (48, 64, 128)) and mamba.real_page_size_bytes == 806400
    # 2 x 4 heads x 128 x 2 B = 2,048 B per token; 16 * cdiv(806400, 16 * 2048) = 400 tokens
    assert model.block_size == attention.block_size == mamba.block_size == 400
    assert mamba.page_size_bytes == attention.page_size_bytes == 400 * 2048
    assert "raised from 16 to 400" in model.notes[0]


def test_qwen3_next_gated_delta_net_states():
    model = specs("qwen3-next-80b-a3b-instruct", tensor_parallel_size=2)
    gdn = model.specs["model.layers.0.linear_attn"]
    assert gdn.mamba_type == "gdn_attn"
    # conv dim 2*16*128 + 32*128 = 8192, split over 2 ranks; 32 value heads -> 16
    assert gdn.shapes == ((3, 4096), (16, 128, 128))
    full = [n for n, s in model.specs.items() if not isinstance(s, MambaSpec)]
    assert full == [f"model.layers.{i}.self_attn.attn" for i in range(3, 48, 4)]


def test_no_prefix_caching_gives_one_mamba_state_per_request():
    model = specs("granite-4.0-h-tiny", enable_prefix_caching=False, max_model_len=8192)
    mamba = model.specs["model.layers.0.mixer"]
    assert mamba.mamba_cache_mode == "none" and mamba.block_size == 8192


def test_deepseek_v4_config_gives_the_v4_builder_plan():
    from refimpl.hybrid import deepseek_v4

    config = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "layer_types": ["sliding_attention"] * 2
        + ["compressed_sparse_attention", "heavily_compressed_attention"] * 20
        + ["compressed_sparse_attention"],
        "compress_rates": {
            "compressed_sparse_attention": 4,
            "heavily_compressed_attention": 128,
        },
        "head_dim": 512,
        "index_head_dim": 128,
        "sliding_window": 128,
        "torch_dtype": "bfloat16",
    }
    model = get_kv_cache_spec(config)
    assert model.specs == deepseek_v4.kv_cache_specs("flash")
    assert model.block_size == 256


def test_unknown_architecture_is_one_line_naming_what_is_missing():
    with pytest.raises(ValueError) as info:
        get_kv_cache_spec({"architectures": ["BertModel"], "model_type": "bert"})
    message = str(info.value)
    assert "\n" not in message and "'BertModel'" in message
    assert "docs/model-coverage.md" in message  # the table of what is planned


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"model_type": "llama"}, "names no 'architectures'"),
        (
            {"architectures": ["LlamaForCausalLM"], "hidden_size": 64},
            "no 'num_attention_heads'",
        ),
    ],
)
def test_incomplete_configs_say_which_key_is_missing(config, words):
    with pytest.raises(ValueError, match=words):
        get_kv_cache_spec(config)


def test_missing_file_and_bad_settings_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        get_kv_cache_spec(tmp_path)
    with pytest.raises(ValueError, match="unsupported kv cache dtype 'fp4'"):
        specs("llama-3.1-8b", kv_cache_dtype="fp4")
    with pytest.raises(ValueError, match="unknown attention backend 'xformers'"):
        specs("llama-3.1-8b", backend="xformers")
    with pytest.raises(ValueError, match="cannot serve a model without MLA"):
        specs("llama-3.1-8b", backend="flashmla")
    with pytest.raises(ValueError, match="not a multiple of any kernel block FLASHMLA"):
        specs("deepseek-v3", backend="flashmla", block_size=16)


def test_backend_table_block_sizes():
    assert {k: b.preferred_block_size() for k, b in BACKENDS.items()} == {
        "flash_attn": 16,
        "flashinfer": 16,
        "triton_attn": 16,
        "flash_attn_mla": 16,
        "flashmla": 64,
        "triton_mla": 16,
        "cpu_attn": 32,
    }
    flashinfer = get_backend("flashinfer", mla=False)
    assert flashinfer.kernel_block_size == 64  # a larger block is split into 64s
    assert flashinfer.sliding_window_block_size(128) == 64
    assert get_backend("flash_attn", mla=False).sliding_window_block_size(128) == 128


def test_cpu_platform_block_sizes():
    assert specs("tiny-llama", backend="cpu_attn").block_size == 128
    assert specs("deepseek-v2-lite", backend="cpu").block_size == 16  # CPU MLA kernel
    assert specs("tiny-llama", backend="cpu_attn", block_size=64).block_size == 64
