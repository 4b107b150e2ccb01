"""The config schema: malformed config.json values are refused in one line, never planned.

Each probe is a real config with one field broken the way issue 35 found it broken. The
refusal must be a one-line ValueError that names the field, shows its value and states the
rule. Consistency rules come from transformers' own config classes (`validate_architecture`,
`validate_layer_type`) and vLLM's attention layer.
"""

import json
import time
import tracemalloc
from pathlib import Path

import pytest

from refimpl.__main__ import main
from refimpl.hybrid.kv_cache_utils import plan_kv_cache
from refimpl.models import HFConfig, get_kv_cache_spec
from refimpl.models.weights import estimate_weight_bytes

CONFIGS = Path(__file__).parent / "data" / "configs"


def load(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


def broken(name: str, **fields) -> dict:
    raw = load(name)
    target = raw.get("text_config", raw)
    for key, value in fields.items():
        target[key] = value
    return raw


# (config, broken fields, words the one-line message must hold)
PROBES = [
    # integers are integers: no floats, bools or strings
    ("tiny-llama", {"num_hidden_layers": 1e9}, ["num_hidden_layers", "1000000000.0", "float"]),
    ("tiny-llama", {"num_hidden_layers": 10**9}, ["num_hidden_layers", "1,000,000,000"]),
    ("tiny-llama", {"num_hidden_layers": 3.5}, ["num_hidden_layers", "3.5", "integer"]),
    ("tiny-llama", {"num_hidden_layers": True}, ["num_hidden_layers", "True", "bool"]),
    ("tiny-qwen3", {"num_hidden_layers": "36"}, ["num_hidden_layers", "'36'", "str"]),
    ("tiny-llama", {"num_key_value_heads": True}, ["num_key_value_heads", "True"]),
    ("tiny-gemma2", {"head_dim": 64.0}, ["head_dim", "64.0", "integer"]),
    ("tiny-granite-h", {"mamba_d_state": "16"}, ["mamba_d_state", "'16'"]),
    ("tiny-qwen3-next", {"linear_num_value_heads": 2.5}, ["linear_num_value_heads", "2.5"]),
    ("tiny-deepseek-v2", {"kv_lora_rank": "512"}, ["kv_lora_rank", "'512'"]),
    ("tiny-qwen3", {"use_sliding_window": "false"}, ["use_sliding_window", "true or false"]),
    # 0 is never a fallback: an explicit 0 is refused, not replaced by another field
    ("tiny-llama", {"num_key_value_heads": 0}, ["num_key_value_heads", "= 0", "from 1"]),
    ("tiny-qwen3", {"head_dim": 0}, ["head_dim", "= 0", "from 1"]),
    ("tiny-deepseek-v2", {"qk_rope_head_dim": 0}, ["qk_rope_head_dim", "= 0"]),
    ("tiny-gemma3", {"sliding_window_pattern": 0}, ["sliding_window_pattern", "= 0"]),
    ("tiny-qwen3-next", {"full_attention_interval": 0}, ["full_attention_interval", "= 0"]),
    # bounds on layers, heads, sizes and context
    ("tiny-llama", {"num_attention_heads": 1 << 20}, ["num_attention_heads", "out of range"]),
    ("tiny-llama", {"hidden_size": 1 << 40}, ["hidden_size", "out of range"]),
    ("tiny-llama", {"max_position_embeddings": 10**12}, ["max_position_embeddings", "range"]),
    ("tiny-llama", {"num_hidden_layers": -4}, ["num_hidden_layers", "-4"]),
    ("tiny-llama", {"rope_scaling": {"rope_type": "linear", "factor": 0}}, ["factor", "= 0"]),
    # layer_types: names from transformers' list that this model builds, one per layer
    ("tiny-gemma2", {"layer_types": ["sliding_attention", "bogus"] * 2}, ["'bogus'", "[1]"]),
    ("tiny-qwen3-next", {"layer_types": ["mamba"] * 4}, ["layer_types[0]", "'mamba'"]),
    ("tiny-granite-h", {"layer_types": ["mamba", "moe", "attention", "mamba"]}, ["'moe'"]),
    ("tiny-llama", {"layer_types": ["full_attention"] * 9}, ["layer_types", "9", "4"]),
    ("tiny-llama", {"layer_types": "full_attention"}, ["layer_types", "list"]),
    # transformers' consistency rules for the families planned
    ("tiny-granite-h", {"mamba_n_heads": 6}, ["mamba_n_heads", "mamba_expand * hidden_size"]),
    ("tiny-granite-h", {"mamba_d_head": 32}, ["mamba_d_head", "32", "mamba_n_heads"]),
    ("tiny-llama", {"num_attention_heads": 6}, ["num_attention_heads", "hidden_size", "= 6"]),
    ("tiny-llama", {"num_key_value_heads": 3}, ["num_key_value_heads", "= 3", "query heads"]),
    ("tiny-gemma3", {"num_attention_heads": 7}, ["num_attention_heads", "= 7"]),
    ("tiny-deepseek-v2", {"num_attention_heads": 7}, ["num_attention_heads", "hidden_size"]),
    # DeepSeek V4 reads its own fields; the schema checks them first
    ("deepseek-v4-flash", {"num_hidden_layers": 0}, ["num_hidden_layers", "= 0"]),
    ("deepseek-v4-flash", {"num_hidden_layers": True}, ["num_hidden_layers", "bool"]),
    ("deepseek-v4-flash", {"head_dim": "512"}, ["head_dim", "'512'"]),
]


def refusal(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize(
    ("name", "fields", "words"), PROBES, ids=[f"{p[0]}-{next(iter(p[1]))}" for p in PROBES]
)
def test_malformed_config_is_refused_in_one_line(name, fields, words):
    with pytest.raises(ValueError) as excinfo:
        get_kv_cache_spec(broken(name, **fields), backend="cpu_attn")
    message = refusal(excinfo)
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        ("tiny-llama", {"num_hidden_layers": 1e9}),
        ("tiny-llama", {"head_dim": 0}),
        ("tiny-deepseek-v2", {"q_lora_rank": 2.5}),
        ("tiny-llama", {"vocab_size": "1024"}),
    ],
)
def test_weights_estimate_reads_the_same_schema(name, fields):
    with pytest.raises(ValueError) as excinfo:
        estimate_weight_bytes(HFConfig.load(broken(name, **fields)), "bfloat16", 1)
    assert next(iter(fields)) in refusal(excinfo)


def test_a_missing_key_still_takes_transformers_default():
    """Only an explicit 0 is refused: an absent num_key_value_heads / head_dim falls back to
    the attention heads / hidden_size // heads, as transformers' LlamaConfig does."""
    raw = load("tiny-llama")
    full = get_kv_cache_spec(raw, backend="cpu_attn")
    heads, size = raw["num_attention_heads"], raw["hidden_size"] // raw["num_attention_heads"]
    for key in ("num_key_value_heads", "head_dim"):
        raw.pop(key, None)
    spec = get_kv_cache_spec(raw, backend="cpu_attn").specs["model.layers.0.self_attn.attn"]
    assert (spec.num_kv_heads, spec.head_size) == (heads, size)
    assert len(full.specs) == raw["num_hidden_layers"]


def test_a_billion_layers_is_refused_fast_and_small(tmp_path, capsys):
    """Issue 35: `num_hidden_layers: 1e9` ran for ever and grew to 6 GB; it must be refused
    in under a second and 200 MB, through the Python API and `plan --config` alike."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(broken("tiny-llama", num_hidden_layers=10**9)))
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(ValueError, match="num_hidden_layers"):
        get_kv_cache_spec(path)
    argv = ["plan", "--config", str(path), "--kv-cache-memory-bytes", "8GiB"]
    assert main(argv) == 2
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 1.0 and peak < 200 << 20, (elapsed, peak)
    assert "num_hidden_layers" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("tensor_parallel_size", True),
        ("tensor_parallel_size", 2.0),
        ("tensor_parallel_size", "2"),
        ("tensor_parallel_size", 0),
        ("block_size", True),
        ("max_model_len", 4096.0),
        ("max_model_len", 10**12),
        ("kv_cache_dtype", 8),
        ("backend", 1),
    ],
)
def test_get_kv_cache_spec_keywords_are_typed(keyword, value):
    with pytest.raises(ValueError) as excinfo:
        get_kv_cache_spec(CONFIGS / "tiny-llama", **{keyword: value})
    assert keyword in refusal(excinfo)


def test_get_kv_cache_spec_flag_must_be_a_bool():
    with pytest.raises(TypeError, match="enable_prefix_caching"):
        get_kv_cache_spec(CONFIGS / "tiny-llama", enable_prefix_caching="no")


@pytest.mark.parametrize(
    ("keyword", "value", "error"),
    [
        ("max_model_len", True, ValueError),
        ("max_num_batched_tokens", 2048.0, ValueError),
        ("num_gpu_blocks_override", 1e30, ValueError),
        ("async_scheduling", "no", TypeError),
        ("auto_fit", 1, TypeError),
    ],
)
def test_plan_kv_cache_keywords_are_typed(keyword, value, error):
    specs = get_kv_cache_spec(CONFIGS / "tiny-llama", backend="cpu_attn").specs
    kwargs = {"max_model_len": 4096, "max_num_batched_tokens": 2048, keyword: value}
    with pytest.raises(error, match=keyword):
        plan_kv_cache(specs, kv_cache_memory_bytes=1 << 30, **kwargs)
