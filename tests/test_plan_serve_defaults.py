"""`plan --config` resolves `vllm serve`'s settings as vLLM 0.32 does.

The expected side is vLLM's own code, recorded in tests/data/vllm_serve_defaults_oracle.json
by `tools/crosscheck/vllm_serve_defaults.py record` (run in .venv-vllm): its flag parsers, its
batch defaults per device, what `create_engine_config` on its CPU platform ends with, and the
length its `_auto_fit_max_model_len` picks.
"""

import argparse
import json
from pathlib import Path

import pytest

from refimpl.__main__ import main
from refimpl.models.engine_args import (
    get_batch_defaults,
    human_readable_int,
    human_readable_int_or_auto,
    resolve_scheduler_settings,
)

DATA = Path(__file__).parent / "data"
CONFIGS = DATA / "configs"
ORACLE = json.loads((DATA / "vllm_serve_defaults_oracle.json").read_text())


def plan_json(capsys, *argv) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("case", ORACLE["parse"], ids=lambda c: c["text"])
def test_flag_syntax_is_vllms(case):
    for key, parse in (
        ("int", human_readable_int),
        ("int_or_auto", human_readable_int_or_auto),
    ):
        if isinstance(case[key], str):
            with pytest.raises((ValueError, argparse.ArgumentTypeError)):
                parse(case["text"])
        else:
            assert parse(case["text"]) == case[key], key


@pytest.mark.parametrize("case", ORACLE["batch_defaults"])
def test_batch_defaults_per_device_are_vllms(case):
    got = get_batch_defaults(
        case["world_size"],
        platform=case["platform"],
        device_memory=case.get("device_memory", 0),
        device_name=case.get("device_name", ""),
    )
    assert got == (case["max_num_batched_tokens"], case["max_num_seqs"])


@pytest.mark.parametrize("case", ORACLE["small_len_defaults"])
def test_default_is_capped_by_short_model_lengths(case):
    settings = resolve_scheduler_settings(
        platform="cuda",
        max_model_len=case["max_model_len"],
        use_mla=False,
        device_memory=case["device_memory"],
        device_name=case["device_name"],
    )
    assert settings.max_num_batched_tokens == case["max_num_batched_tokens"]
    assert settings.max_num_seqs == case["max_num_seqs"]


def engine_argv(case: dict) -> list[str]:
    argv = ["--config", str(CONFIGS / case["config"]), "--backend", "cpu_attn"]
    argv += ["--kv-cache-memory-bytes", "256G", "--max-model-len", str(case["max_model_len"])]
    argv += ["--tensor-parallel-size", str(case["tensor_parallel_size"])]
    if case["max_num_batched_tokens"] is not None:
        argv += ["--max-num-batched-tokens", str(case["max_num_batched_tokens"])]
    if case["async_scheduling"] is not None:
        argv.append(
            "--async-scheduling" if case["async_scheduling"] else "--no-async-scheduling"
        )
    return argv


@pytest.mark.parametrize("case", ORACLE["engine"], ids=lambda c: c["config"])
def test_cpu_platform_settings_are_vllms(capsys, monkeypatch, case):
    """vLLM's CPU platform: 2,048 x TP batched tokens, async scheduling off even when asked
    for, MLA without chunked prefill at max(model length, 2,048) batched tokens, and a model
    length above the config's refused unless VLLM_ALLOW_LONG_MAX_MODEL_LEN is set."""
    monkeypatch.setenv(
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1" if case["allow_long_max_model_len"] else "0"
    )
    argv = engine_argv(case)
    if "refused" in case:
        assert main(["plan", *argv]) == 2
        assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in capsys.readouterr().err
        return
    want = case["resolved"]
    got = plan_json(capsys, *argv)
    assert got["max_num_batched_tokens"] == want["max_num_batched_tokens"]
    assert got["async_scheduling"] == want["async_scheduling"]
    assert got["max_model_len"] == want["max_model_len"]
    settings = resolve_scheduler_settings(
        platform="cpu",
        max_model_len=want["max_model_len"],
        use_mla="deepseek" in case["config"],
        tensor_parallel_size=case["tensor_parallel_size"],
        max_num_batched_tokens=case["max_num_batched_tokens"],
        async_scheduling=case["async_scheduling"],
    )
    assert settings.max_num_seqs == want["max_num_seqs"]
    assert settings.enable_chunked_prefill == want["enable_chunked_prefill"]


@pytest.mark.parametrize("case", ORACLE["auto_fit"], ids=lambda c: c["config"])
def test_auto_fit_picks_vllms_length(capsys, case):
    for spelling in ("-1", "auto"):
        got = plan_json(
            capsys,
            "--config",
            str(CONFIGS / case["config"]),
            "--backend",
            "cpu_attn",
            "--kv-cache-memory-bytes",
            str(case["memory"]),
            "--max-model-len",
            spelling,
        )
        assert got["max_num_batched_tokens"] == case["max_num_batched_tokens"]
        assert got["derived_max_model_len"] == case["derived_max_model_len"]
        assert got["max_model_len"] == case["fitted_max_model_len"]
        assert got["num_blocks"] == case["num_blocks"]
        assert got["kv_cache_size_tokens"] == case["kv_cache_size_tokens"]
        assert got["max_concurrency"] == pytest.approx(case["max_concurrency"], rel=1e-12)


def test_every_vllm_serve_flag_is_known_with_its_arity():
    """`plan` reads a pasted serve command whole: refimpl's flag table is vLLM's parser's."""
    from refimpl.models.serve_flags import VLLM_SERVE_FLAGS

    ours = {
        dest: [list(options), arity] for dest, (options, arity) in VLLM_SERVE_FLAGS.items()
    }
    assert ours == ORACLE["flags"]


@pytest.mark.parametrize("case", ORACLE["serve_settings"], ids=lambda c: str(c["flags"]))
def test_scheduler_flags_resolve_as_vllms(capsys, case):
    """--max-num-seqs, --enable-chunked-prefill and --dtype, as vLLM's create_engine_config
    resolves them on its CPU platform (or refuses them)."""
    flag_names = {
        "max_num_seqs": "--max-num-seqs",
        "max_num_batched_tokens": "--max-num-batched-tokens",
        "dtype": "--dtype",
    }
    argv = ["--config", str(CONFIGS / case["config"]), "--backend", "cpu_attn"]
    argv += ["--kv-cache-memory-bytes", "256G", "--max-model-len", str(case["max_model_len"])]
    for key, value in case["flags"].items():
        if key == "enable_chunked_prefill":
            argv.append("--enable-chunked-prefill" if value else "--no-enable-chunked-prefill")
        else:
            argv += [flag_names[key], str(value)]
    if "refused" in case:
        assert main(["plan", *argv]) == 2
        err = capsys.readouterr().err
        assert "--max-num-batched-tokens" in err and "raise --max-num-batched-tokens" in err
        return
    got = plan_json(capsys, *argv)
    want = case["resolved"]
    assert got["max_num_batched_tokens"] == want["max_num_batched_tokens"]
    assert got["max_num_seqs"] == want["max_num_seqs"]
    assert got["enable_chunked_prefill"] == want["enable_chunked_prefill"]
    assert got["model_dtype"] == want["model_dtype"]


@pytest.mark.parametrize(
    "case", ORACLE["pipeline"], ids=lambda c: f"{c['config']}-pp{c['pp']}"
)
def test_pipeline_stages_plan_as_vllms(capsys, case):
    """Each stage plans its own layers in the whole budget, every stage keeps the smallest
    block count, and vLLM reports the first stage's figures."""
    argv = ["--config", str(CONFIGS / case["config"]), "--backend", "cpu_attn"]
    argv += ["--kv-cache-memory-bytes", str(case["memory"]), "-pp", str(case["pp"])]
    argv += ["--max-model-len", str(case["max_model_len"]), "--max-num-batched-tokens", "2048"]
    got = plan_json(capsys, *argv)
    assert got["max_model_len"] == case["fitted_max_model_len"]
    assert got["num_blocks"] == case["num_blocks"]
    assert len(got["groups"]) == case["num_groups"]
    assert got["kv_cache_size_tokens"] == case["kv_cache_size_tokens"]
    assert got["max_concurrency"] == pytest.approx(case["max_concurrency"], rel=1e-12)
    assert got["pipeline_stage_layers"] == case["stage_layers"]


def test_flags_that_change_the_plan_are_refused_not_ignored(capsys):
    from refimpl.models.serve_flags import NOT_PLANNED, VLLM_SERVE_FLAGS

    assert set(NOT_PLANNED) <= set(VLLM_SERVE_FLAGS)
    argv = ["--config", str(CONFIGS / "gemma-3-27b-it"), "--kv-cache-memory-bytes", "20G"]
    assert main(["plan", *argv, "--disable-sliding-window"]) == 2
    err = capsys.readouterr().err
    assert "--disable-sliding-window changes the plan (sliding-window layers" in err
    assert "plan without it" in err and len(err.splitlines()) == 1


CPU_ISA = json.loads((DATA / "vllm_cpu_isa_oracle.json").read_text())


@pytest.mark.parametrize(
    "case",
    [c for c in CPU_ISA["cases"] if (CONFIGS / c["config"]).is_dir()],
    ids=lambda c: f"{c['config']}-{c['cpu_isa']}",
)
def test_cpu_isa_plans_as_vllms_cpu_platform(capsys, case):
    """`--cpu-isa` reaches the specs and the scheduler: on an AMX CPU vLLM runs MLA on its AMX
    kernels and keeps chunked prefill (2,048 batched tokens), elsewhere its reference MLA
    kernel turns chunked prefill off (max(max model len, 2,048) batched tokens)."""
    want = case["backends"]["CPU_ATTN"]
    argv = ["--config", str(CONFIGS / case["config"]), "--backend", "cpu_attn"]
    argv += ["--cpu-isa", case["cpu_isa"], "--kv-cache-dtype", case["kv_cache_dtype"]]
    argv += ["--kv-cache-memory-bytes", str(want["plan"]["memory"])]
    argv += ["--max-model-len", str(case["max_model_len"])]
    if not case["enable_prefix_caching"]:
        argv.append("--no-enable-prefix-caching")
    got = plan_json(capsys, *argv)
    assert got["block_size"] == want["block_size"]
    for key in ("max_num_batched_tokens", "num_blocks", "kv_cache_size_tokens"):
        assert got[key] == want["plan"][key], key
    assert got["max_concurrency"] == pytest.approx(want["plan"]["max_concurrency"], rel=1e-12)


@pytest.mark.parametrize(
    "case",
    ORACLE["mamba_ssm"],
    ids=lambda c: f"{c['config']}-{c['cpu_isa']}-{c['mamba_ssm_cache_dtype']}",
)
def test_mamba_ssm_cache_dtype_is_vllms(capsys, case):
    """--mamba-ssm-cache-dtype stores the SSM state in the dtype given (a float32 state
    doubles the Qwen3-Next page, so its block grows to 256 tokens), as vLLM's CPU platform
    ends up doing on both CPU kinds."""
    from refimpl.models import get_kv_cache_spec

    argv = ["--config", str(CONFIGS / case["config"]), "--backend", "cpu_attn"]
    argv += ["--cpu-isa", case["cpu_isa"], "--max-model-len", str(case["max_model_len"])]
    argv += ["--mamba-ssm-cache-dtype", case["mamba_ssm_cache_dtype"]]
    argv += ["--kv-cache-memory-bytes", str(case["plan"]["memory"])]
    got = plan_json(capsys, *argv)
    assert got["block_size"] == case["block_size"]
    assert got["num_blocks"] == case["plan"]["num_blocks"]
    assert got["kv_cache_size_tokens"] == case["plan"]["kv_cache_size_tokens"]
    model = get_kv_cache_spec(
        CONFIGS / case["config"],
        backend="cpu_attn",
        cpu_isa=case["cpu_isa"],
        max_model_len=case["max_model_len"],
        mamba_ssm_cache_dtype=case["mamba_ssm_cache_dtype"],
    )
    states = sorted({tuple(s.dtypes) for s in model.specs.values() if hasattr(s, "dtypes")})
    assert [list(s) for s in states] == case["state_dtypes"]


def test_flags_that_change_only_the_estimate_pass_with_an_exact_budget(capsys):
    argv = ["--config", str(CONFIGS / "llama-3.1-8b"), "--max-model-len", "8K"]
    assert main(["plan", *argv, "--enforce-eager"]) == 2
    assert "or give --kv-cache-memory-bytes" in capsys.readouterr().err
    exact = plan_json(capsys, *argv, "--kv-cache-memory-bytes", "20G", "--enforce-eager")
    assert exact["no_effect_flags"] == ["--enforce-eager"]
