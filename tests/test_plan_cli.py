"""`python -m refimpl plan --config`: the engineer's command, against figures vLLM 0.32 gave.

The expected tokens and concurrency are vLLM's own (`get_kv_cache_configs` and
`get_kv_cache_capacity` on the specs its model classes built, recorded in
tests/data/vllm_models_oracle.json by `make crosscheck-record`), at an 8 GiB budget, max model
length 4096 and vLLM's CPU-build scheduler (2048 batched tokens, no async scheduling).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from refimpl.__main__ import main

CONFIGS = Path(__file__).parent / "data" / "configs"
VLLM_SETTINGS = [
    "--kv-cache-memory-bytes",
    "8GiB",
    "--max-model-len",
    "4096",
    "--max-num-batched-tokens",
    "2048",
    "--no-async-scheduling",
]


def plan(capsys, *argv):
    assert main(["plan", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(
    ("config", "backend", "tokens", "concurrency"),
    [
        # vLLM: 32,768 blocks of 128 tokens / 32 blocks per request = 1024.00x
        ("tiny-llama", "cpu_attn", 4_194_304, "1024.00x"),
        # five sliding layers reserve cdiv(255 + 2048, 128) + 1 = 19 blocks each, the full one 32
        ("tiny-gemma3", "cpu_attn", 4_227_330, "1032.06x"),
        ("tiny-gemma3", "flash_attn", 4_378_152, "1068.88x"),
        # block 400 (FlashAttention) / 512 (CPU): 9 Mamba groups x 3 blocks + the attention group
        ("granite-4.0-h-tiny", "flash_attn", 282_516, "68.97x"),
        ("granite-4.0-h-tiny", "cpu_attn", 239_674, "58.51x"),
    ],
)
def test_tokens_and_concurrency_equal_vllms(capsys, config, backend, tokens, concurrency):
    out = plan(capsys, "--config", str(CONFIGS / config), "--backend", backend, *VLLM_SETTINGS)
    assert f"KV cache size: {tokens:,} tokens" in out
    assert f"Maximum concurrency for 4,096 tokens per request: {concurrency}" in out
    assert "~" not in out  # an exact budget gives exact figures


def test_llama_text_explains_each_number(capsys):
    out = plan(
        capsys,
        "--config",
        str(CONFIGS / "llama-3.1-8b"),
        "--kv-cache-memory-bytes",
        "20GiB",
        "--max-model-len",
        "8192",
    )
    for text in (
        "32 cache layers",
        "block size 16 tokens",
        "16,384 tokens in flight (8,192 batched x 2 (async scheduling))",
        "FullAttentionSpec         16     32      65,536",  # one layer's page
        "one block id costs 2,097,152 B",  # 32 layers x 65,536 B
        "10,240 blocks",  # 20 GiB / 2 MiB
        "holds 512 blocks",  # 8192 / 16
        "KV cache size: 163,840 tokens",
        "Maximum concurrency for 8,192 tokens per request: 20.00x",
        "every layer keeps every token",
    ):
        assert text in out, text


def test_gpu_memory_gives_a_labelled_estimate(capsys):
    out = plan(
        capsys, "--config", str(CONFIGS / "llama-3.1-8b"), "--gpu-memory", "80GiB", "--json"
    )
    result = json.loads(out)
    assert result["available_memory_is_estimate"] and result["weights_is_estimate"]
    # Llama-3.1-8B has 8.03 B parameters; bf16 weights are about 16 GB
    assert 15.5e9 < result["weights_bytes"] < 16.5e9
    assert result["available_memory"] == int(80 * 2**30 * 0.9) - result["weights_bytes"]
    assert result["max_model_len"] == 131072 and result["max_num_batched_tokens"] == 8192
    text = plan(capsys, "--config", str(CONFIGS / "llama-3.1-8b"), "--gpu-memory", "80GiB")
    assert "ESTIMATE" in text and "KV cache size: ~" in text


def test_sliding_window_reservation_follows_async_scheduling(capsys):
    base = ["--config", str(CONFIGS / "gpt-oss-20b"), "--kv-cache-memory-bytes", "10GiB"]
    on = json.loads(plan(capsys, *base, "--max-model-len", "32768", "--json"))
    off = json.loads(
        plan(capsys, *base, "--max-model-len", "32768", "--no-async-scheduling", "--json")
    )
    sliding = [g for g in on["groups"] if g["sliding_window"]]
    # window 128: min(127 + 16,384, 32,768) tokens -> cdiv(16,511, 16) + 1 = 1,033 blocks
    assert {g["blocks_per_request"] for g in sliding} == {1033}
    assert {g["blocks_per_request"] for g in off["groups"] if g["sliding_window"]} == {521}
    assert off["max_concurrency"] > on["max_concurrency"]


def test_tensor_parallel_and_fp8_shrink_the_pages(capsys):
    base = [
        "--config",
        str(CONFIGS / "llama-3.1-8b"),
        "--kv-cache-memory-bytes",
        "8GiB",
        "--max-model-len",
        "8192",
        "--json",
    ]
    one = json.loads(plan(capsys, *base))
    two = json.loads(plan(capsys, *base, "--tensor-parallel-size", "2"))
    fp8 = json.loads(plan(capsys, *base, "--kv-cache-dtype", "fp8"))
    assert one["groups"][0]["page_size_bytes"] == 65536
    assert two["groups"][0]["page_size_bytes"] == fp8["groups"][0]["page_size_bytes"] == 32768
    assert two["num_blocks"] == fp8["num_blocks"] == 2 * one["num_blocks"]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--config", "/nonexistent/config.json", "--gpu-memory", "80GiB"], "no config.json"),
        (["--config", str(CONFIGS / "llama-3.1-8b")], "give --kv-cache-memory-bytes"),
        (
            ["--config", str(CONFIGS / "llama-3.1-8b"), "--gpu-memory", "8GiB"],
            "leaves nothing for the KV cache",
        ),
        (
            [
                "--config",
                str(CONFIGS / "llama-3.1-8b"),
                "--gpu-memory",
                "80GiB",
                "--tensor-parallel-size",
                "3",
            ],
            "8 KV heads cannot be split over 3",
        ),
        (
            ["--config", str(CONFIGS / "llama-3.1-8b"), "--kv-cache-memory-bytes", "8GiB"],
            # vLLM refuses to start: 131,072 tokens need 16 GiB; it names the longest that fits
            "The longest --max-model-len that fits is 65520",
        ),
        (
            [
                "--config",
                str(CONFIGS / "llama-3.1-8b"),
                "--gpu-memory",
                "80GiB",
                "--kv-cache-dtype",
                "int3",
            ],
            "unsupported kv cache dtype 'int3'",
        ),
    ],
)
def test_bad_input_is_one_line(capsys, argv, words):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_deepseek_v4_model_flag_still_works(capsys):
    out = plan(capsys, "--model", "deepseek-v4-pro", "--json", "--offsets", "0")
    assert json.loads(out)["num_blocks"] == 7477


def test_config_path_does_not_import_torch():
    code = (
        "import sys; from refimpl.__main__ import main; "
        f"main(['plan', '--config', {str(CONFIGS / 'gemma-3-27b-it')!r}, "
        "'--gpu-memory', '80GiB', '--json']); "
        "sys.stderr.write(str('torch' in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stderr == "False"
