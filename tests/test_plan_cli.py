"""`python -m refimpl plan --config`: the engineer's command, against figures vLLM 0.32 gave.

The expected tokens and concurrency are vLLM's own (`get_kv_cache_configs` and
`get_kv_cache_capacity` on the specs its model classes built, recorded in
tests/data/vllm_models_oracle.json by `make crosscheck-record`), at an 8 GiB budget, max model
length 4096 and vLLM's CPU-build scheduler (2048 batched tokens, no async scheduling).
"""

import json
import re
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
    top = int(80 * 2**30 * 0.9) - result["weights_bytes"]
    estimate = result["estimate"]
    allowance = sum(
        estimate[k] for k in ("activation_bytes", "logits_bytes", "cudagraph_bytes")
    )
    assert estimate["no_overhead_memory"] == top
    assert result["available_memory"] == top - allowance and allowance > 0
    assert estimate["no_overhead_kv_cache_size_tokens"] > result["kv_cache_size_tokens"]
    assert result["max_model_len"] == 131072 and result["max_num_batched_tokens"] == 8192
    text = plan(capsys, "--config", str(CONFIGS / "llama-3.1-8b"), "--gpu-memory", "80GiB")
    assert "ESTIMATED" in text and "KV cache size: ~" in text


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
        (["--kv-cache-memory-bytes", "8GiB"], "give --config"),
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
            "the longest --max-model-len that fits is 65,520",
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


def test_deepseek_v4_plans_through_config(capsys):
    out = plan(
        capsys,
        *["--config", "deepseek-v4-pro", "--kv-cache-memory-bytes", "10GiB"],
        *["--max-model-len", "8192", "--json", "--offsets", "0"],
    )
    assert json.loads(out)["deepseek_v4"]["num_blocks"] == 7477


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


def test_cpu_backend_takes_vllms_cpu_defaults(capsys):
    """vLLM's CPU platform serves with 2,048 batched tokens per rank and turns async
    scheduling off, so the default plan equals the one with those flags given."""
    base = ["--config", str(CONFIGS / "gpt-oss-20b"), "--backend", "cpu_attn"]
    base += ["--kv-cache-memory-bytes", "8GiB", "--max-model-len", "32768"]
    default = json.loads(plan(capsys, *base, "--json"))
    given = json.loads(
        plan(
            capsys,
            *base,
            "--max-num-batched-tokens",
            "2048",
            "--no-async-scheduling",
            "--json",
        )
    )
    assert default["max_in_flight_tokens"] == 2048 and not default["async_scheduling"]
    assert default["kv_cache_size_tokens"] == given["kv_cache_size_tokens"] == 326_484
    # asking for async scheduling on the CPU platform changes nothing: vLLM turns it off
    asked = json.loads(plan(capsys, *base, "--async-scheduling", "--json"))
    assert asked["max_in_flight_tokens"] == 2048
    text = plan(capsys, *base)
    assert "2,048 tokens in flight (2,048 batched x 1 batch)" in text
    assert "Maximum concurrency for 32,768 tokens per request: 9.96x" in text


def test_gpu_memory_and_name_pick_the_batch_default(capsys):
    base = ["--config", str(CONFIGS / "llama-3.1-8b"), "--max-model-len", "8K", "--json"]
    h100 = json.loads(plan(capsys, *base, "--gpu-memory", "80GiB"))
    a100 = json.loads(
        plan(capsys, *base, "--gpu-memory", "80GiB", "--gpu-name", "NVIDIA A100-SXM4-80GB")
    )
    b200 = json.loads(plan(capsys, *base, "--gpu-memory", "180GiB"))
    assert (h100["max_num_batched_tokens"], a100["max_num_batched_tokens"]) == (8192, 2048)
    assert b200["max_num_batched_tokens"] == 16384
    assert h100["max_model_len"] == 8192  # 8K is binary, as vLLM reads it


def test_vllm_size_syntax(capsys):
    base = ["--config", str(CONFIGS / "llama-3.1-8b"), "--json"]
    binary = json.loads(
        plan(capsys, *base, "--kv-cache-memory-bytes", "20G", "--max-model-len", "8k")
    )
    assert binary["available_memory"] == 20 << 30 and binary["max_model_len"] == 8000
    decimal = json.loads(
        plan(capsys, *base, "--kv-cache-memory-bytes", "20g", "--max-model-len", "8K")
    )
    assert decimal["available_memory"] == 20 * 10**9 and decimal["max_model_len"] == 8192
    batched = json.loads(
        plan(
            capsys, *base, "--kv-cache-memory-bytes", "20GiB", "--max-num-batched-tokens", "4K"
        )
    )
    assert batched["max_num_batched_tokens"] == 4096


def test_auto_fit_is_printed(capsys):
    out = plan(
        capsys,
        "--config",
        str(CONFIGS / "llama-3.1-8b"),
        "--kv-cache-memory-bytes",
        "8GiB",
        "--max-model-len",
        "auto",
    )
    assert "max model len 65,520 (auto-fit)" in out
    assert "reduced from 131,072 to 65,520 tokens" in out


def test_too_long_max_model_len_needs_vllms_variable(capsys, monkeypatch):
    argv = [
        "plan",
        "--config",
        str(CONFIGS / "llama-3.1-8b"),
        "--kv-cache-memory-bytes",
        "200G",
    ]
    argv += ["--max-model-len", "1000000"]
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "greater than the length the config allows (131,072)" in err
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "true")
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["max_model_len"] == 1_000_000
    assert any("VLLM_ALLOW_LONG_MAX_MODEL_LEN" in note for note in result["notes"])


@pytest.mark.parametrize(
    ("flag", "words"),
    [
        # DeepSeek V4's old second set of budget flags: gone, with the flag to use instead
        (["--memory", "10GiB"], "unknown flag --memory; did you mean --gpu-memory?"),
        (["--num-blocks", "100"], "unknown flag --num-blocks; did you mean"),
        (["--mtp"], "unknown flag --mtp"),
        # the V4 slab's views are options of a V4 plan only
        (["--layout", "B"], "views of a DeepSeek V4 plan"),
        (["--grouping", "mla+swa"], "views of a DeepSeek V4 plan"),
        (["--offsets", "3"], "views of a DeepSeek V4 plan"),
    ],
)
def test_deepseek_v4_views_and_old_flags_are_refused_for_other_models(capsys, flag, words):
    argv = ["--config", str(CONFIGS / "llama-3.1-8b"), "--kv-cache-memory-bytes", "20GiB"]
    assert main(["plan", *argv, "--max-model-len", "8192", *flag]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_num_gpu_blocks_override(capsys):
    out = json.loads(
        plan(
            capsys,
            "--config",
            str(CONFIGS / "llama-3.1-8b"),
            "--kv-cache-memory-bytes",
            "20GiB",
            "--max-model-len",
            "8192",
            "--num-gpu-blocks-override",
            "1000",
            "--json",
        )
    )
    # vLLM: 1,000 blocks / (8,192 / 16 = 512 blocks per request)
    assert out["num_blocks"] == 1000 and out["max_concurrency"] == 1000 / 512


def test_disable_hybrid_kv_cache_manager(capsys):
    """Gemma 3 27B: without the hybrid manager every layer is full attention in one group
    (62 layers x 16 KV heads x 128 x 2 x 2 B x 16 tokens = 8,126,464 B a block), so 20 GiB holds
    2,642 blocks. At 8k the hybrid manager loses: a 1,024-token window plus 16,384 tokens in
    flight covers the whole request, and 7 groups of 10 layer slots pad 62 layers to 70. At
    32k it wins: the windows stop at 1,089 blocks of the full layers' 2,048."""
    base = ["--config", str(CONFIGS / "gemma-3-27b-it"), "--kv-cache-memory-bytes", "20GiB"]
    for length, hybrid_wins in ((8192, False), (32768, True)):
        argv = [*base, "--max-model-len", str(length), "--json"]
        hybrid = json.loads(plan(capsys, *argv))
        single = json.loads(plan(capsys, *argv, "--disable-hybrid-kv-cache-manager"))
        assert len(hybrid["groups"]) == 7 and len(single["groups"]) == 1
        assert single["bytes_per_block"] == 62 * 16 * 128 * 2 * 2 * 16
        assert single["num_blocks"] == (20 << 30) // single["bytes_per_block"] == 2642
        assert single["kv_cache_size_tokens"] == int(2642 / (length // 16) * length)
        assert (hybrid["max_concurrency"] > single["max_concurrency"]) == hybrid_wins


def test_out_of_memory_hint_names_the_flag_used(capsys):
    argv = ["plan", "--config", str(CONFIGS / "llama-3.1-8b"), "--max-model-len", "131072"]
    assert main([*argv, "--kv-cache-memory-bytes", "8GiB"]) == 2
    err = capsys.readouterr().err
    assert "Raise --kv-cache-memory-bytes" in err and "utilization" not in err
    assert main([*argv, "--gpu-memory", "24GiB"]) == 2
    assert "Raise --gpu-memory-utilization" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("config", "tp", "low", "high"),
    [
        # the published checkpoints: gpt-oss-20b 13.8 GB (MXFP4 experts, the rest bf16),
        # DeepSeek-V3 about 680 GB in fp8 (its MTP layer, which vLLM loads only for
        # speculative decoding, is not counted), over 8 GPUs
        ("gpt-oss-20b", 1, 13.0e9, 14.5e9),
        ("deepseek-v3", 8, 80e9, 88e9),
        ("llama-3.1-8b", 1, 15.5e9, 16.5e9),
    ],
)
def test_weights_estimate_honours_quantisation(capsys, config, tp, low, high):
    out = json.loads(
        plan(
            capsys,
            "--config",
            str(CONFIGS / config),
            "--gpu-memory",
            "141GiB",
            "--tensor-parallel-size",
            str(tp),
            "--max-model-len",
            "4096",
            "--json",
        )
    )
    assert low < out["weights_bytes"] < high and out["weights_is_estimate"]


def test_request_plan_figure_text_twin():
    from refimpl.models import EngineArgs, plan_model
    from refimpl.viz.request_plan import request_plan_text

    granite = plan_model(
        EngineArgs(
            CONFIGS / "granite-4.0-h-tiny", kv_cache_memory_bytes=20 << 30, max_model_len=8192
        )
    )
    text = request_plan_text(granite, "Granite 4.0-H Tiny").splitlines()
    assert len(text) == 1 + len(granite.groups) + 1 == 12
    assert text[1].split()[2:] == [
        "MambaSpec",
        "4",
        "layers",
        "3",
        "blocks",
        "of",
        "400",
        "tokens",
    ]
    assert text[-1].startswith("6,553 blocks / 48 per request = 136.52x at 8,192 tokens")


# --- one typed pipeline


def test_settings_are_resolved_once_and_typed():
    """`derived_max_model_len` is the config's length, not the requested one; the plan's
    figures are the planner's, and the planner runs once, with async scheduling as resolved."""
    from refimpl.hybrid import kv_cache_utils
    from refimpl.models import EngineArgs, ModelKVCachePlan, plan_model, planning

    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return kv_cache_utils.plan_kv_cache(*args, **kwargs)

    settings = EngineArgs(
        CONFIGS / "llama-3.1-8b", kv_cache_memory_bytes=20 << 30, max_model_len=4096
    )
    original = planning.plan_kv_cache
    planning.plan_kv_cache = spy
    try:
        plan = plan_model(settings)
    finally:
        planning.plan_kv_cache = original
    assert isinstance(plan, ModelKVCachePlan)
    assert plan.config.derived_max_model_len == 131072 and plan.max_model_len == 4096
    assert plan.to_dict()["derived_max_model_len"] == 131072
    assert len(calls) == 1
    assert calls[0]["async_scheduling"] is True and calls[0]["max_num_batched_tokens"] == 8192
    assert plan.kv.max_in_flight_tokens == 16384
    assert (plan.num_tokens, plan.max_concurrency) == (plan.kv.num_tokens, 40.0)


def test_engine_args_refuse_bools_and_bad_numbers():
    from refimpl.models import EngineArgs

    for bad in (
        {"tensor_parallel_size": True},
        {"max_num_seqs": 1.0},
        {"num_gpu_blocks_override": 1},
        {"gpu_memory_utilization": 1.5},
        {"max_model_len": 0},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            EngineArgs(CONFIGS / "llama-3.1-8b", **bad)


# --- one vocabulary: output width, errors that name the fix


def _lines(capsys, *argv):
    return plan(capsys, *argv).splitlines()


@pytest.mark.parametrize(
    "config",
    sorted(p.name for p in CONFIGS.iterdir() if (p / "config.json").is_file()),
)
def test_output_fits_100_columns(capsys, config):
    argv = ["--config", str(CONFIGS / config), "--max-model-len", "4096"]
    if config.startswith("deepseek-v4"):
        argv += ["--kv-cache-memory-bytes", "20G", "--offsets", "-1", "--layout", "B"]
    if config in ("deepseek-v3", "qwen3-next-80b-a3b-instruct"):  # too big for one H100
        argv += ["-tp", "8", "--gpu-name", "h200"]
    for budget in ([], ["--kv-cache-memory-bytes", "40G"]):
        lines = _lines(capsys, *argv, *budget, "--port", "8000", "--trust-remote-code")
        assert max(len(line) for line in lines) <= 100, max(lines, key=len)


def test_wide_lifts_the_limit(capsys):
    argv = ["--config", "deepseek-v4-pro", "--kv-cache-memory-bytes", "20G"]
    argv += ["--max-model-len", "4096", "--offsets", "-1", "--layout", "B"]
    assert max(len(line) for line in _lines(capsys, *argv)) <= 100
    assert max(len(line) for line in _lines(capsys, *argv, "--wide")) > 100


def test_out_of_memory_suggests_tensor_parallelism_with_separators(capsys):
    argv = ["plan", "--config", str(CONFIGS / "llama-3.1-8b"), "--max-model-len", "131072"]
    assert main([*argv, "--kv-cache-memory-bytes", "8GiB"]) == 2
    err = capsys.readouterr().err
    assert "--max-model-len 131,072 needs 16.00 GiB" in err
    assert "--tensor-parallel-size (now 1)" in err
    # an MLA latent is not split by TP: no such advice for DeepSeek V4
    v4 = ["plan", "--config", "deepseek-v4-pro", "--kv-cache-memory-bytes", "4GiB"]
    assert main(v4) == 2
    assert "--tensor-parallel-size" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "words"),
    [
        (["--num-gpu-blocks-override", "1e30"], "expected a whole number, got '1e30'"),
        (["--num-gpu-blocks-override", "1.0"], "expected a whole number, got '1.0'"),
        (["--num-gpu-blocks-override", "True"], "expected a whole number, got 'True'"),
        (["-tp", "1.5"], "argument --tensor-parallel-size/-tp: expected a whole number"),
        (["--max-num-seqs", "true"], "expected a whole number"),
        (["--gpu-memory-utilization", "2"], "must be in (0, 1]"),
        # (vLLM's parser takes unambiguous prefixes, so these typos are not prefixes)
        (["--max-num-batch-tokens", "4096"], "did you mean --max-num-batched-tokens?"),
        (["--kv-cache-mem-bytes", "1G"], "did you mean --kv-cache-memory-bytes?"),
        (["--speculative-config", "{bad"], "not valid JSON"),
    ],
)
def test_flags_are_strict_and_unknown_ones_name_the_nearest(capsys, flag, words):
    argv = [
        "plan",
        "--config",
        str(CONFIGS / "llama-3.1-8b"),
        "--kv-cache-memory-bytes",
        "20G",
    ]
    assert main([*argv, *flag]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


# --- the serve command line


def test_short_forms_and_a_pasted_serve_command_plan_the_same(capsys):
    llama = str(CONFIGS / "llama-3.1-8b")
    common = ["--kv-cache-memory-bytes", "20G", "--max-model-len", "8k", "--json"]
    long = json.loads(plan(capsys, "--config", llama, "--tensor-parallel-size", "2", *common))
    short = json.loads(plan(capsys, "--model", llama, "-tp", "2", *common))
    pasted = json.loads(
        plan(
            capsys,
            "--",
            "vllm",
            "serve",
            llama,
            "-tp",
            "2",
            "--host",
            "0.0.0.0",
            "--port",
            "8000",
            "--served-model-name",
            "llama",
            "--enable-auto-tool-choice",
            *common,
        )
    )
    for key in ("num_blocks", "kv_cache_size_tokens", "max_concurrency", "groups"):
        assert long[key] == short[key] == pasted[key], key
    assert long["tensor_parallel_size"] == 2 and long["no_effect_flags"] == []
    assert pasted["no_effect_flags"] == [
        "--enable-auto-tool-choice",
        "--host",
        "--port",
        "--served-model-name",
    ]
    text = plan(capsys, "--config", llama, "--kv-cache-memory-bytes", "20G", "--port", "1")
    assert text.count("--port") == 1 and "no effect on the KV plan: --port" in text


def test_a_pasted_command_must_be_vllm_serve(capsys):
    assert main(["plan", "--", "python", "serve.py"]) == 2
    assert "give a vllm serve command" in capsys.readouterr().err


# --- honest estimates from GPU memory


def test_gpu_name_uses_the_memory_that_gpu_reports(capsys):
    base = ["--config", str(CONFIGS / "llama-3.1-8b"), "--max-model-len", "8K", "--json"]
    default = json.loads(plan(capsys, *base))
    h100 = json.loads(plan(capsys, *base, "--gpu-name", "h100"))
    a100 = json.loads(plan(capsys, *base, "--gpu-name", "NVIDIA A100-SXM4-80GB"))
    assert default["gpu_name"] == h100["gpu_name"] == "NVIDIA H100 80GB HBM3"
    assert default["gpu_memory"] == h100["gpu_memory"] == 85_520_809_984  # 79.65 GiB
    assert default["available_memory"] == h100["available_memory"]
    assert a100["gpu_memory"] == 85_094_891_520 and a100["max_num_batched_tokens"] == 2048
    assert main(["plan", *base, "--gpu-name", "h1000"]) == 2
    assert "did you mean 'h100'?" in capsys.readouterr().err


def test_an_estimate_is_a_range_and_names_the_budget_that_pins_it(capsys):
    llama = ["--config", str(CONFIGS / "llama-3.1-8b"), "--max-model-len", "8K"]
    text = plan(capsys, *llama)
    assert "ESTIMATED" in text and "no overhead:" in text and "with an allowance of" in text
    pinned = re.search(r"--kv-cache-memory-bytes (\d+)", text).group(1)
    estimate = json.loads(plan(capsys, *llama, "--json"))
    exact = json.loads(plan(capsys, *llama, "--kv-cache-memory-bytes", pinned, "--json"))
    assert not exact["available_memory_is_estimate"]
    for key in ("num_blocks", "kv_cache_size_tokens", "max_concurrency"):
        assert exact[key] == estimate[key], key
    top = estimate["estimate"]
    assert top["no_overhead_kv_cache_size_tokens"] > estimate["kv_cache_size_tokens"]
    # the allowance grows with the batch: activations of max_num_batched_tokens tokens
    small = json.loads(plan(capsys, *llama, "--max-num-batched-tokens", "2048", "--json"))
    assert small["estimate"]["activation_bytes"] * 4 == top["activation_bytes"]


def test_packaged_configs_are_package_data():
    """A non-editable install has the DeepSeek V4 configs: pyproject's package-data globs
    match them."""
    import tomllib

    root = Path(__file__).parents[1]
    data = tomllib.loads((root / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["refimpl.models"]
    found = {p.parent.name for g in globs for p in (root / "refimpl" / "models").glob(g)}
    assert {"deepseek-v4-pro", "deepseek-v4-flash"} <= found


def test_plan_answers_within_a_second(capsys):
    import time

    argv = ["--config", str(CONFIGS / "gemma-3-27b-it"), "--max-model-len", "8K"]
    plan(capsys, *argv)  # imports
    start = time.perf_counter()
    plan(capsys, *argv)
    plan(capsys, "--config", "deepseek-v4-pro", "--kv-cache-memory-bytes", "20G")
    assert time.perf_counter() - start < 2.0


def test_mamba_cache_mode_follows_prefix_caching_as_in_vllm(capsys):
    """'align' keeps a state block per attention block (prefix caching on), 'none' one state
    per request, a block as long as the request (off). vLLM 0.32's MambaModelConfig sets the
    mode from prefix caching whatever --mamba-cache-mode says (checked against vLLM's
    `EngineArgs(...).create_engine_config()` on tiny-granite-h: mode none with caching on
    becomes align, align with caching off becomes none)."""
    base = ["--config", str(CONFIGS / "granite-4.0-h-tiny"), "--kv-cache-memory-bytes", "20G"]
    base += ["--max-model-len", "8K", "--json"]
    none = json.loads(plan(capsys, *base, "--mamba-cache-mode", "none"))
    off = json.loads(plan(capsys, *base, "--no-enable-prefix-caching"))
    align_off = json.loads(
        plan(capsys, *base, "--mamba-cache-mode", "align", "--no-enable-prefix-caching")
    )
    align = json.loads(plan(capsys, *base, "--mamba-cache-mode", "align"))
    default = json.loads(plan(capsys, *base))
    assert none["groups"] == align["groups"] == default["groups"]
    assert align_off["groups"] == off["groups"] != default["groups"]
    mamba = [g for g in off["groups"] if g["kind"] == "MambaSpec"]
    assert {g["block_size"] for g in mamba} == {8192}


def test_vllm_spellings_are_read_as_vllm_reads_them(capsys):
    """Underscores in flag names and -O3 / -O 3, as vLLM's FlexibleArgumentParser takes them,
    also inside a pasted serve command."""
    llama = str(CONFIGS / "llama-3.1-8b")
    dashed = json.loads(
        plan(
            capsys,
            "--config",
            llama,
            "--kv-cache-memory-bytes",
            "20G",
            "--max-model-len",
            "8K",
            "--json",
        )
    )
    underscored = json.loads(
        plan(
            capsys,
            "--config",
            llama,
            "--kv_cache_memory_bytes",
            "20G",
            "--max_model_len=8K",
            "-O3",
            "--json",
        )
    )
    pasted = json.loads(
        plan(
            capsys,
            "--json",
            "--",
            "vllm",
            "serve",
            llama,
            "--kv_cache_memory_bytes",
            "20G",
            "-O",
            "3",
            "--max_model_len",
            "8K",
        )
    )
    for key in ("num_blocks", "kv_cache_size_tokens", "max_model_len"):
        assert dashed[key] == underscored[key] == pasted[key], key
    assert (
        underscored["no_effect_flags"] == pasted["no_effect_flags"] == ["--optimization-level"]
    )
    assert main(["plan", "--config", llama, "--", "vllm", "serve", llama]) == 2
    assert "not both" in capsys.readouterr().err
