"""What `vllm serve` resolves its settings to, asked of vLLM 0.32 itself (inside `.venv-vllm`).

    PYTHONPATH=$PWD .venv-vllm/bin/python -m tools.crosscheck.vllm_serve_defaults record

writes tests/data/vllm_serve_defaults_oracle.json, which tests/test_plan_serve_defaults.py
replays against `refimpl.models.engine_args` and `python -m refimpl plan --config`:

- `parse`: vLLM's `human_readable_int` / `human_readable_int_or_auto` on flag strings;
- `batch_defaults`: `EngineArgs.get_batch_defaults` for `vllm serve` on GPUs described by
  their NVML memory and name (vLLM's platform answers these two; they are stood in for,
  since this machine has no GPU), and on the CPU platform (this machine's, for real);
- `small_len_defaults`: `_set_default_max_num_seqs_and_batched_tokens_args` on such a GPU
  with a short model length (the default is capped at max_num_seqs x max_model_len);
- `engine`: `EngineArgs(...).create_engine_config(OPENAI_API_SERVER)` on the CPU platform for
  stored configs: the batched tokens, async scheduling, chunked prefill and model length the
  scheduler ends with, or vLLM's refusal of a too long --max-model-len (with and without
  VLLM_ALLOW_LONG_MAX_MODEL_LEN);
- `auto_fit`: `--max-model-len -1`: vLLM's model on the meta device, its specs, and
  `get_kv_cache_configs`, which runs `_auto_fit_max_model_len` at a given budget;
- `serve_settings`: `--max-num-seqs`, `--enable-chunked-prefill` and `--dtype` through
  `create_engine_config` on the CPU platform (or vLLM's refusal);
- `mamba_ssm`: `--mamba-ssm-cache-dtype` on vLLM's CPU platform for two CPU kinds;
- `pipeline`: `--pipeline-parallel-size`: per-stage specs through `get_kv_cache_configs`;
- `flags`: every option of vLLM's `vllm serve` parser and how many values it reads, which
  `refimpl.models.serve_flags` must list exactly.

`record SECTION ...` re-records only those sections into the stored oracle.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

ORACLE = (
    Path(__file__).resolve().parents[2] / "tests" / "data" / "vllm_serve_defaults_oracle.json"
)
CONFIG_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "configs"
GIB = 1 << 30

PARSE = ["8192", "8k", "8K", "25.6k", "1.5K", "20G", "20g", "1M", "auto", "-1", "AUTO", "32k"]
#: (NVML total memory, device name, world size): an H100 and an A100 80 GB report ~79.2 GiB,
#: an H200 ~139.8 GiB, a B200 ~178.4 GiB, an L4 ~22 GiB.
GPUS = [
    (85_520_809_984, "NVIDIA H100 80GB HBM3", 1),
    (85_520_809_984, "NVIDIA H100 80GB HBM3", 4),
    (85_094_891_520, "NVIDIA A100-SXM4-80GB", 1),
    (150_110_011_392, "NVIDIA H200", 1),
    (191_514_607_616, "NVIDIA B200", 1),
    (23_580_639_232, "NVIDIA L4", 1),
    (80 * GIB, "", 1),
    (70 * GIB, "", 1),
    (70 * GIB - 1, "", 1),
    (160 * GIB, "", 1),
]
SMALL_LEN = [(85_520_809_984, "NVIDIA H100 80GB HBM3", 4), (23_580_639_232, "NVIDIA L4", 4)]
#: (config, --max-model-len, --max-num-batched-tokens, --async-scheduling, TP)
ENGINE = [
    ("llama-3.1-8b", 32768, None, None, 1),
    ("llama-3.1-8b", 32768, None, None, 2),
    ("llama-3.1-8b", 32768, 4096, True, 1),
    ("gpt-oss-20b", 32768, None, None, 1),
    ("gemma-3-27b-it", 8192, None, None, 1),
    ("deepseek-v2-lite", 32768, None, None, 1),
    ("deepseek-v2-lite", 1024, 512, None, 1),
    ("llama-3.1-8b", -1, None, None, 1),
    ("llama-3.1-8b", 1_000_000, None, None, 1),
]
#: (config, --max-model-len, other EngineArgs): `plan`'s scheduler flags on the CPU platform
SERVE = [
    ("llama-3.1-8b", 32768, {"max_num_seqs": 64}),
    ("llama-3.1-8b", 8192, {"enable_chunked_prefill": False}),
    ("llama-3.1-8b", 1024, {"enable_chunked_prefill": False}),
    ("llama-3.1-8b", 8192, {"enable_chunked_prefill": False, "max_num_batched_tokens": 4096}),
    ("llama-3.1-8b", 8192, {"max_num_seqs": 4096, "max_num_batched_tokens": 2048}),
    ("llama-3.1-8b", 8192, {"max_num_seqs": 300, "max_num_batched_tokens": 2048}),
    ("llama-3.1-8b", 8192, {"dtype": "float16"}),
]
#: (config, budget, --max-model-len, --pipeline-parallel-size): per-stage plans on the CPU
#: platform, with 2,048 batched tokens
PIPELINE = [
    ("llama-3.1-8b", 8 * GIB, 8192, 2),
    ("llama-3.1-8b", 8 * GIB, -1, 3),
    ("gemma-3-27b-it", 8 * GIB, 8192, 2),
    ("gemma-3-27b-it", 4 * GIB, 8192, 4),
    ("gpt-oss-20b", 2 * GIB, 32768, 2),
]
# (Mamba hybrids are left out: on an AVX512-BF16 host vLLM's CPU platform keeps their states
# in float32, which refimpl models only with the host's CPU ISA, issue 36 Deliver 3.)
#: --mamba-ssm-cache-dtype on the CPU platform: (config, CPU kind, dtype)
MAMBA_SSM = [
    (name, isa, dtype)
    for name in ("tiny-granite-h", "tiny-qwen3-next")
    for isa in ("avx512", "avx512_bf16")
    for dtype in ("float32", "float16", "bfloat16")
]
#: (config, budget): --max-model-len -1 on the CPU platform
AUTO_FIT = [("llama-3.1-8b", 8 * GIB), ("gpt-oss-20b", 2 * GIB), ("tiny-llama", 1 << 20)]


def parse_cases() -> list:
    from vllm.utils.argparse_utils import human_readable_int, human_readable_int_or_auto

    out = []
    for text in PARSE:
        row = {"text": text}
        for name, fn in (
            ("int", human_readable_int),
            ("int_or_auto", human_readable_int_or_auto),
        ):
            try:
                row[name] = fn(text)
            except Exception as exc:  # vLLM refuses it
                row[name] = f"error: {type(exc).__name__}"
        out.append(row)
    return out


class _GPU:
    """Answers for a GPU vLLM's platform would query (memory and name); the rest is the real
    platform's."""

    def __init__(self, real, memory: int, name: str) -> None:
        self._real, self._memory, self._name = real, memory, name

    def get_device_total_memory(self, *args) -> int:
        return self._memory

    def get_device_name(self, *args) -> str:
        return self._name

    def is_cpu(self) -> bool:
        return False

    def is_tpu(self) -> bool:
        return False

    def __getattr__(self, name: str):
        return getattr(self._real, name)


class _Device:
    """While open, `EngineArgs` sees the GPU `_GPU` describes (it alone is stood in for)."""

    def __init__(self, memory: int, name: str) -> None:
        self.memory, self.name = memory, name

    def __enter__(self):
        from vllm.engine import arg_utils

        self.saved = arg_utils.current_platform
        arg_utils.current_platform = _GPU(self.saved, self.memory, self.name)
        return self

    def __exit__(self, *exc) -> None:
        from vllm.engine import arg_utils

        arg_utils.current_platform = self.saved


def batch_default_cases() -> list:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    serve = UsageContext.OPENAI_API_SERVER
    out = []
    for memory, name, world in GPUS:
        with _Device(memory, name):
            batched, seqs = EngineArgs.get_batch_defaults(world)
        out.append(
            {
                "platform": "cuda",
                "device_memory": memory,
                "device_name": name,
                "world_size": world,
                "max_num_batched_tokens": batched[serve],
                "max_num_seqs": seqs[serve],
            }
        )
    for world in (1, 2, 4):
        batched, seqs = EngineArgs.get_batch_defaults(world)  # this machine: vLLM's CPU
        out.append(
            {
                "platform": "cpu",
                "world_size": world,
                "max_num_batched_tokens": batched[serve],
                "max_num_seqs": seqs[serve],
            }
        )
    return out


def small_len_cases() -> list:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    out = []
    for memory, name, max_model_len in SMALL_LEN:
        args = EngineArgs(model="unused", enable_chunked_prefill=True)
        model_config = SimpleNamespace(
            max_model_len=max_model_len, is_multimodal_model=False, is_mm_prefix_lm=False
        )
        with _Device(memory, name):
            args._set_default_max_num_seqs_and_batched_tokens_args(
                UsageContext.OPENAI_API_SERVER,
                model_config,
                SimpleNamespace(use_batched_dp_moe=False),
            )
        out.append(
            {
                "device_memory": memory,
                "device_name": name,
                "max_model_len": max_model_len,
                "max_num_batched_tokens": args.max_num_batched_tokens,
                "max_num_seqs": args.max_num_seqs,
            }
        )
    return out


def engine_cases() -> list:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    from tools.crosscheck.vllm_models import model_dir

    out = []
    for name, max_len, batched, asynchronous, tp in ENGINE:
        for allow in (False, True) if max_len == 1_000_000 else (False,):
            os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1" if allow else "0"
            row = {
                "config": name,
                "max_model_len": max_len,
                "max_num_batched_tokens": batched,
                "async_scheduling": asynchronous,
                "tensor_parallel_size": tp,
                "allow_long_max_model_len": allow,
            }
            kwargs = {"max_num_batched_tokens": batched, "async_scheduling": asynchronous}
            try:
                vc = EngineArgs(
                    model=model_dir(name),
                    load_format="dummy",
                    skip_tokenizer_init=True,
                    max_model_len=max_len,
                    tensor_parallel_size=tp,
                    enforce_eager=True,
                    **{k: v for k, v in kwargs.items() if v is not None},
                ).create_engine_config(UsageContext.OPENAI_API_SERVER)
            except Exception as exc:  # vLLM refuses the settings
                row["refused"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            else:
                sc = vc.scheduler_config
                row["resolved"] = {
                    "max_num_batched_tokens": sc.max_num_batched_tokens,
                    "max_num_seqs": sc.max_num_seqs,
                    "async_scheduling": sc.async_scheduling,
                    "enable_chunked_prefill": sc.enable_chunked_prefill,
                    "max_model_len": vc.model_config.max_model_len,
                }
            out.append(row)
    os.environ.pop("VLLM_ALLOW_LONG_MAX_MODEL_LEN", None)
    return out


def pipeline_cases() -> list:
    """`--pipeline-parallel-size`: vLLM's model on the meta device, its specs split over the
    stages by its own `get_pp_indices` and `extract_layer_index`, and `get_kv_cache_configs`
    on the list of per-stage specs (each stage with the whole budget); the figures are those
    of the scheduler's config (`generate_scheduler_kv_cache_config`)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed.utils import get_pp_indices
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.utils import extract_layer_index
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core import kv_cache_utils

    from tools.crosscheck import vllm_models

    out = []
    for name, memory, max_len, pp in PIPELINE:
        vc = EngineArgs(
            model=vllm_models.model_dir(name),
            load_format="dummy",
            skip_tokenizer_init=True,
            max_model_len=max_len,
            max_num_batched_tokens=2048,
            enforce_eager=True,
        ).create_engine_config(UsageContext.OPENAI_API_SERVER)
        layers = vllm_models.build_layers(vc)
        specs = vllm_models.layer_spec_objects(vc, layers)
        n = vc.model_config.hf_text_config.num_hidden_layers
        stages = []
        for rank in range(pp):
            lo, hi = get_pp_indices(n, rank, pp)
            stages.append(
                {k: v for k, v in specs.items() if lo <= extract_layer_index(k) < hi}
            )
        backends = []
        for layer in layers.values():
            if layer.get_attn_backend() not in backends:
                backends.append(layer.get_attn_backend())
        names = [layout.name for layout in get_supported_kv_cache_layouts(backends)]
        row = {"config": name, "memory": memory, "max_model_len": max_len, "pp": pp}
        row["stage_layers"] = [len(stage) for stage in stages]
        try:
            with set_current_vllm_config(vc):
                layout = resolve_kv_cache_layout(vc, [names], specs.values())
                vc.cache_config.kv_cache_layout = layout.name
                configs = kv_cache_utils.get_kv_cache_configs(vc, stages, [memory] * pp)
                scheduler = kv_cache_utils.generate_scheduler_kv_cache_config(configs)
                tokens, concurrency = kv_cache_utils.get_kv_cache_capacity(vc, scheduler)
        except Exception as exc:  # vLLM refuses the plan
            row["refused"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        else:
            row.update(
                fitted_max_model_len=vc.model_config.max_model_len,
                max_num_batched_tokens=vc.scheduler_config.max_num_batched_tokens,
                num_blocks=scheduler.num_blocks,
                num_groups=len(scheduler.kv_cache_groups),
                kv_cache_size_tokens=tokens,
                max_concurrency=concurrency,
            )
        out.append(row)
    return out


def mamba_ssm_cases() -> list:
    """`--mamba-ssm-cache-dtype`: vLLM's engine config on its CPU platform with torch's probes
    answered as each CPU kind would (`vllm_cpu_isa.host_isa`: on AVX512-BF16 the platform
    resets the state to float32, except a 16-bit state its gated-delta-net kernel takes), its
    model on the meta device, the Mamba layers' own specs, and its planner."""
    from tools.crosscheck import vllm_models
    from tools.crosscheck.vllm_cpu_isa import host_isa

    out = []
    for name, isa, dtype in MAMBA_SSM:
        with vllm_models.quiet(), host_isa(isa):
            vc = vllm_models.engine_config(name, "auto", mamba_ssm_cache_dtype=dtype)
            layers = vllm_models.build_layers(vc)
            specs = vllm_models.layer_spec_objects(vc, layers)
            states = sorted(
                {
                    tuple(str(d).removeprefix("torch.") for d in spec.dtypes)
                    for spec in specs.values()
                    if hasattr(spec, "dtypes")
                }
            )
            plan = vllm_models.plan_record(vc, layers, specs)
        out.append(
            {
                "config": name,
                "cpu_isa": isa,
                "mamba_ssm_cache_dtype": dtype,
                "resolved": vc.cache_config.mamba_ssm_cache_dtype,
                "max_model_len": vc.model_config.max_model_len,
                "block_size": vc.cache_config.block_size,
                "state_dtypes": [list(s) for s in states],
                "plan": {k: plan[k] for k in ("memory", "num_blocks", "kv_cache_size_tokens")},
            }
        )
    return out


def serve_setting_cases() -> list:
    """`create_engine_config` on the CPU platform for the scheduler flags `plan` takes
    (--max-num-seqs, --enable-chunked-prefill, --dtype): what the scheduler ends with, or
    vLLM's refusal."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    from tools.crosscheck.vllm_models import model_dir

    out = []
    for name, max_len, kwargs in SERVE:
        row = {"config": name, "max_model_len": max_len, "flags": kwargs}
        try:
            vc = EngineArgs(
                model=model_dir(name),
                load_format="dummy",
                skip_tokenizer_init=True,
                max_model_len=max_len,
                enforce_eager=True,
                **kwargs,
            ).create_engine_config(UsageContext.OPENAI_API_SERVER)
        except Exception as exc:  # vLLM refuses the settings
            row["refused"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        else:
            sc = vc.scheduler_config
            row["resolved"] = {
                "max_num_batched_tokens": sc.max_num_batched_tokens,
                "max_num_seqs": sc.max_num_seqs,
                "enable_chunked_prefill": sc.enable_chunked_prefill,
                "model_dtype": str(vc.model_config.dtype).removeprefix("torch."),
            }
        out.append(row)
    return out


def serve_flag_cases() -> dict:
    """Every option `vllm serve` takes: {destination: [option strings, arity]}, from vLLM's
    own parser (`make_arg_parser`); arity "switch" (no value), "value", "values" (nargs +
    or *) or "optional" (nargs ?)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    out = {}
    for action in make_arg_parser(FlexibleArgumentParser())._actions:
        if not action.option_strings or action.dest == "help":
            continue
        if action.nargs == 0:
            arity = "switch"
        elif action.nargs in ("+", "*"):
            arity = "values"
        elif action.nargs == "?":
            arity = "optional"
        else:
            arity = "value"
        out[action.dest] = [list(action.option_strings), arity]
    return dict(sorted(out.items()))


def auto_fit_cases() -> list:
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core import kv_cache_utils

    from tools.crosscheck import vllm_models

    out = []
    for name, memory in AUTO_FIT:
        vc = EngineArgs(
            model=vllm_models.model_dir(name),
            load_format="dummy",
            skip_tokenizer_init=True,
            max_model_len=-1,
            enforce_eager=True,
        ).create_engine_config(UsageContext.OPENAI_API_SERVER)
        derived = vc.model_config.max_model_len
        layers = vllm_models.build_layers(vc)
        specs = vllm_models.layer_spec_objects(vc, layers)
        backends = []
        for layer in layers.values():
            if layer.get_attn_backend() not in backends:
                backends.append(layer.get_attn_backend())
        names = [layout.name for layout in get_supported_kv_cache_layouts(backends)]
        with set_current_vllm_config(vc):
            layout = resolve_kv_cache_layout(vc, [names], specs.values())
            vc.cache_config.kv_cache_layout = layout.name
            config = kv_cache_utils.get_kv_cache_configs(vc, [specs], [memory])[0]
            tokens, concurrency = kv_cache_utils.get_kv_cache_capacity(vc, config)
        out.append(
            {
                "config": name,
                "memory": memory,
                "derived_max_model_len": derived,
                "max_num_batched_tokens": vc.scheduler_config.max_num_batched_tokens,
                "fitted_max_model_len": vc.model_config.max_model_len,
                "num_blocks": config.num_blocks,
                "kv_cache_size_tokens": tokens,
                "max_concurrency": concurrency,
            }
        )
    return out


def record(sections: list[str] | None = None) -> dict:
    import vllm

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    if sections:
        makers = {
            "serve_settings": serve_setting_cases,
            "pipeline": pipeline_cases,
            "mamba_ssm": mamba_ssm_cases,
            "flags": serve_flag_cases,
            "engine": engine_cases,
            "auto_fit": auto_fit_cases,
        }
        oracle = json.loads(ORACLE.read_text())
        with vllm_quiet():
            oracle.update({name: makers[name]() for name in sections})
        oracle["vllm_version"] = vllm.__version__
        return oracle
    with vllm_quiet():
        return {
            "vllm_version": vllm.__version__,
            "parse": parse_cases(),
            "batch_defaults": batch_default_cases(),
            "small_len_defaults": small_len_cases(),
            "engine": engine_cases(),
            "auto_fit": auto_fit_cases(),
            "serve_settings": serve_setting_cases(),
            "pipeline": pipeline_cases(),
            "mamba_ssm": mamba_ssm_cases(),
            "flags": serve_flag_cases(),
        }


def vllm_quiet():
    from tools.crosscheck.vllm_models import quiet

    return quiet()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    oracle = record(argv[1:] if argv[:1] == ["record"] else None)
    if argv[:1] == ["record"]:
        ORACLE.write_text(json.dumps(oracle, indent=1) + "\n")
        print(f"wrote {ORACLE}")
    else:
        print(json.dumps(oracle, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
