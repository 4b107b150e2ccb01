"""A DeepSeek V4 config.json in the checkpoints' spelling (`compress_ratios`, one ratio per
layer, as vLLM's V4 model reads it) plans exactly as the built-in `--model` preset it
describes, and transformers, which folds that list into `layer_types`, reads the same layers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from refimpl.__main__ import main
from refimpl.hybrid import deepseek_v4
from refimpl.hybrid.deepseek_v4 import DeepseekV4Config
from refimpl.models import get_kv_cache_spec

FLASH_DIR = Path(__file__).parent / "data" / "configs" / "deepseek-v4-flash"
FLASH = json.loads((FLASH_DIR / "config.json").read_text())


def plan_json(capsys, *argv) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_config_lists_one_ratio_per_layer_and_the_mtp_entry():
    ratios = FLASH["compress_ratios"]
    assert "layer_types" not in FLASH and "compress_rates" not in FLASH
    assert len(ratios) == FLASH["num_hidden_layers"] + FLASH["num_nextn_predict_layers"]
    assert DeepseekV4Config.from_hf_config(FLASH).compress_ratios == tuple(ratios[:-1])


@pytest.mark.parametrize(
    ("kv_cache_dtype", "cache_dtype"), [("auto", "fp8_ds_mla"), ("bfloat16", "bfloat16")]
)
@pytest.mark.parametrize("memory", [20 << 30, 3 << 30])
def test_plan_config_equals_the_flash_preset(capsys, memory, kv_cache_dtype, cache_dtype):
    from refimpl.hybrid.kv_cache_planning import get_kv_cache_config, get_kv_cache_groups

    ours = plan_json(
        capsys,
        "--config",
        str(FLASH_DIR / "config.json"),
        "--kv-cache-memory-bytes",
        str(memory),
        "--kv-cache-dtype",
        kv_cache_dtype,
        "--max-model-len",  # fits in 3 GiB; the length does not change the layout
        "4096",
    )
    groups = get_kv_cache_groups(deepseek_v4.kv_cache_specs("flash", cache_dtype=cache_dtype))
    preset = get_kv_cache_config(groups, memory)
    assert ours["num_cache_layers"] == 167
    assert [(g["block_size"], g["layer_names"]) for g in ours["groups"]] == [
        (g.block_size, list(g.layer_names)) for g in groups
    ]
    assert ours["bytes_per_block"] == preset.block_stride
    assert ours["num_blocks"] == preset.num_blocks


def test_the_packaged_flash_config_is_this_file():
    """`plan --config deepseek-v4-flash` reads the copy that ships with the package."""
    from refimpl.models.engine_args import PACKAGED_CONFIGS

    assert (PACKAGED_CONFIGS / "deepseek-v4-flash" / "config.json").read_text() == (
        FLASH_DIR / "config.json"
    ).read_text()


def test_config_specs_are_the_preset_specs():
    model = get_kv_cache_spec(FLASH_DIR)
    assert model.specs == deepseek_v4.kv_cache_specs("flash")
    assert model.block_size == 256


def test_transformers_reads_the_same_layers_from_compress_ratios():
    # transformers folds the per-layer list into layer_types and compress_rates
    from transformers import DeepseekV4Config as HFConfig

    fields = {k: v for k, v in FLASH.items() if k not in ("architectures", "model_type")}
    folded = HFConfig(**fields)
    assert folded.layer_types[:3] == [
        "sliding_attention",
        "sliding_attention",
        "compressed_sparse_attention",
    ]
    assert DeepseekV4Config.from_hf_config(folded) == DeepseekV4Config.from_hf_config(FLASH)
    # and both spellings in one file, when they agree, are the same config
    both = dict(
        FLASH, layer_types=list(folded.layer_types), compress_rates=dict(folded.compress_rates)
    )
    assert DeepseekV4Config.from_hf_config(both) == DeepseekV4Config.from_hf_config(FLASH)


def test_ratio_one_is_no_compression_as_in_vllm():
    # vLLM's attention takes max(1, ratio): 0 and 1 both mean sliding window only
    ones = dict(FLASH, compress_ratios=[1 if r == 0 else r for r in FLASH["compress_ratios"]])
    assert DeepseekV4Config.from_hf_config(ones) == DeepseekV4Config.from_hf_config(FLASH)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"compress_ratios": [0, 4]}, "lists 2 layers, fewer than num_hidden_layers 43"),
        ({"compress_ratios": [0, 0, 8] + [4] * 41}, "layer 2 has compress ratio 8"),
        ({"compress_ratios": "0,4"}, "must be a list of whole numbers"),
        ({"num_hidden_layers": None}, "needs num_hidden_layers"),
        (
            {
                "layer_types": ["sliding_attention"] * 43,
                "compress_rates": {
                    "compressed_sparse_attention": 4,
                    "heavily_compressed_attention": 128,
                },
            },
            "disagree at layer 2 \\(ratio 4 against 0\\)",
        ),
        (
            {
                "layer_types": ["sliding_attention"] * 40,
                "compress_rates": {},
            },
            "num_hidden_layers is 43 but layer_types lists 40",
        ),
        ({"compress_ratios": None}, "no 'layer_types' and no 'compress_ratios'"),
    ],
)
def test_inconsistent_fields_are_refused(change, words):
    bad = {k: v for k, v in dict(FLASH, **change).items() if v is not None}
    with pytest.raises(ValueError, match=words):
        DeepseekV4Config.from_hf_config(bad)
