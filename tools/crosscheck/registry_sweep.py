"""Every architecture in vLLM 0.32's model registry, planned by vLLM itself (inside
`.venv-vllm`).

For each text-generation and multimodal entry of `ModelRegistry` this writes a config.json
from transformers' config class for the architecture's `model_type` (or vLLM's own config
class, or a Llama config naming the architecture when neither knows it), with the layer
pattern of a real checkpoint where the class's default has none (`LAYER_PATTERNS`) and at most
`MAX_LAYERS` layers. vLLM then does everything itself, as `vllm_models` does for the
committed configs: `EngineArgs` reads the file, the model class is built on the meta device,
the platform settles the block size, every cache layer answers `get_kv_cache_spec`, and
`get_kv_cache_configs` / `get_kv_cache_capacity` plan them at several budgets and lengths, on
the CPU platform and with each CUDA backend class (`vllm_models.cuda_backend_case`).

Results are cached per architecture in `.cache/registry_sweep/` (reruns are incremental);
`record` packs them into tests/data/vllm_registry_oracle.json.gz, which
tests/test_models_registry_oracle.py replays without vLLM. Architectures vLLM cannot build
this way are kept with vLLM's error.

    nice -n 10 python -m tools.crosscheck.registry_sweep sweep [ARCH ...]
    python -m tools.crosscheck.registry_sweep record
"""

from __future__ import annotations

import copy
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import signal
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

from tools.crosscheck import registry_compare
from tools.crosscheck.vllm_models import (
    DENSE_BACKENDS,
    MLA_BACKENDS,
    backend_class,
    build_layers,
    layer_spec_objects,
    quiet,
    spec_record,
)

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "registry_sweep"
MAX_LAYERS = 12
MAX_MODEL_LEN = 4096
#: (KV budget in bytes, max model len) pairs every built model is planned at
PLANS = ((1 << 30, None), (256 << 20, None), (4 << 30, 1024))
TP_SIZES = (1, 2, 4, 8)
#: Sub-configs refimpl never reads (vision / audio towers): dropped from the recorded config
_TOWER_KEYS = (
    "vision_config",
    "audio_config",
    "speech_config",
    "vq_config",
    "perceiver_config",
)

#: A real checkpoint's layer pattern where the config class's default has none (model_type ->
#: keys set on the text config). Phi-3 (mini-4k) slides on every layer; granite-4.0-h has
#: attention layers among the Mamba ones; Llama 4 Scout keeps chunked local attention.
LAYER_PATTERNS = {
    "phi3": {"sliding_window": 2047},
    "phimoe": {"sliding_window": 2047},
    "granitemoehybrid": {
        "layer_types": ["mamba"] * 5 + ["attention"] + ["mamba"] * 5 + ["attention"],
    },
    "mistral": {"sliding_window": 4096},
    "qwen2": {"use_sliding_window": False},
    "cohere2": {"sliding_window": 4096},
    "llama4_text": {"attention_chunk_size": 8192},
    "llama4": {"attention_chunk_size": 8192},
    "jamba": {"attn_layer_period": 4, "attn_layer_offset": 2},
    # LFM2-1.2B: short-conv layers, attention at a few (here 4 of 12, there 6 of 16)
    "lfm2": {
        "layer_types": [
            "full_attention" if i in (2, 5, 8, 10) else "conv" for i in range(MAX_LAYERS)
        ],
        "full_attn_idxs": [2, 5, 8, 10],
    },
    "lfm2_moe": {
        "layer_types": [
            "full_attention" if i in (2, 5, 8, 10) else "conv" for i in range(MAX_LAYERS)
        ],
    },
    # Gemma 4 E2B: the last layers reuse earlier layers' K/V (20 of 35 there)
    "gemma4_text": {"num_kv_shared_layers": 4},
}


#: Architectures whose auto-mapped config class is not the one their checkpoints use, or whose
#: config class leaves out a field a real checkpoint has (architecture -> (model_type or None,
#: keys set on the text config)); the values are those of a public checkpoint of the family.
REPAIRS = {
    "Llama4ForCausalLM": ("llama4_text", {"attention_chunk_size": 8192}),
    "Glm4MoeForCausalLM": (None, {"head_dim": 128}),  # GLM-4.5-Air
    "Glm4vMoeForConditionalGeneration": (None, {"head_dim": 128, "use_qk_norm": False}),
    "Glm4MoeLiteForCausalLM": (None, {"first_k_dense_replace": 1}),
    "HYV3ForCausalLM": (None, {"first_k_dense_replace": 1}),
    "MiniMaxM2ForCausalLM": (None, {"rotary_dim": 64, "scoring_func": "sigmoid"}),
    "Qwen3VLMoeForConditionalGeneration": (None, {"norm_topk_prob": True}),
    "AfmoeForCausalLM": (None, {"score_func": "sigmoid", "route_norm": True}),
    "NemotronForCausalLM": (None, {"num_key_value_heads": 8}),  # Nemotron-4
    # GLM-4-9B: two K/V groups
    **{
        arch: (
            None,
            {
                "original_rope": True,
                "tie_word_embeddings": False,
                "multi_query_attention": True,
                "multi_query_group_num": 2,
            },
        )
        for arch in ("ChatGLMModel", "ChatGLMForConditionalGeneration")
    },
    "LongcatFlashForCausalLM": (
        None,
        {"mla_scale_q_lora": True, "mla_scale_kv_lora": True, "zero_expert_type": "identity"},
    ),
    "InklingForCausalLM": (
        None,
        {"padded_vocab_size": "@vocab_size", "use_embed_norm": False},
    ),
    # LFM2: the block's width is the hidden size ("@key" copies another field's value)
    **{
        arch: (
            None,
            {
                "block_dim": "@hidden_size",
                "block_multiple_of": 256,
                "block_auto_adjust_ff_dim": True,
                "block_ffn_dim_multiplier": 1.0,
                "conv_dim": "@hidden_size",
            },
        )
        for arch in ("Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Lfm2VlForConditionalGeneration")
    },
}


class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout("building took more than the sweep's time limit")


def registry_entries() -> list[tuple[str, str, str]]:
    """(architecture, vLLM module, "text" or "multimodal") for every entry."""
    from vllm.model_executor.models import registry

    out = [(a, m, "text") for a, (m, _) in registry._TEXT_GENERATION_MODELS.items()]
    out += [(a, m, "multimodal") for a, (m, _) in registry._MULTIMODAL_MODELS.items()]
    return out


def _transformers_model_types() -> dict[str, str]:
    """architecture class name -> model_type, from transformers' auto-model tables."""
    from transformers.models.auto import modeling_auto

    out: dict[str, str] = {}
    for name in dir(modeling_auto):
        if name.startswith("MODEL_") and name.endswith("_MAPPING_NAMES"):
            for model_type, classes in getattr(modeling_auto, name).items():
                if isinstance(classes, str):
                    classes = (classes,)
                for cls in classes:
                    out.setdefault(cls, model_type)
    return out


def config_class(arch: str, module: str, known: dict[str, str]):
    """(source, config class) for an architecture: transformers' class for its model_type,
    vLLM's own config class, or transformers' LlamaConfig as a last resort."""
    from transformers import CONFIG_MAPPING
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    candidates = [known.get(arch), module.rsplit(".", 1)[-1]]
    for model_type in filter(None, candidates):
        if model_type in _CONFIG_REGISTRY:
            return f"vllm:{model_type}", _CONFIG_REGISTRY[model_type]
        if model_type in CONFIG_MAPPING:
            return f"transformers:{model_type}", CONFIG_MAPPING[model_type]
    return "fallback:llama", CONFIG_MAPPING["llama"]


def _truncate(cfg: dict) -> None:
    """At most MAX_LAYERS layers; per-layer lists keep their first entries."""
    for key in ("num_hidden_layers", "num_layers", "n_layer", "n_layers"):
        n = cfg.get(key)
        if isinstance(n, int) and n > MAX_LAYERS:
            cfg[key] = MAX_LAYERS
            for name, value in cfg.items():
                if isinstance(value, list) and len(value) == n:
                    cfg[name] = value[:MAX_LAYERS]
                elif (
                    isinstance(value, dict) and value and all(str(k).isdigit() for k in value)
                ):
                    # per-layer settings keyed by layer index (Gemma 4's per_layer_config)
                    cfg[name] = {k: v for k, v in value.items() if int(str(k)) < MAX_LAYERS}


_NOT_CONFIG = (
    "id2label",
    "label2id",
    "transformers_version",
    "_name_or_path",
    "output_attentions",
)


def _drop_bookkeeping(cfg: dict) -> None:
    """transformers' bookkeeping keys, which some config classes refuse as unknown kwargs
    when they come back inside a sub-config (DBRX's attn_config)."""
    for key in _NOT_CONFIG:
        cfg.pop(key, None)
    for value in cfg.values():
        if isinstance(value, dict):
            _drop_bookkeeping(value)


def make_config(arch: str, module: str, known: dict[str, str]) -> tuple[str, dict]:
    model_type, repairs = REPAIRS.get(arch, (None, {}))
    if model_type is not None:
        known = {**known, arch: model_type}
    source, cls = config_class(arch, module, known)
    cfg = cls().to_dict()
    _drop_bookkeeping(cfg)
    cfg["architectures"] = [arch]
    cfg["torch_dtype"] = "bfloat16"
    parts = [cfg] + [v for k, v in cfg.items() if k.endswith("text_config") and v]
    for part in parts:
        if isinstance(part, dict):
            part.update(LAYER_PATTERNS.get(part.get("model_type"), {}))
            _truncate(part)
    parts[-1].update(
        {k: parts[-1].get(v[1:]) if str(v).startswith("@") else v for k, v in repairs.items()}
    )
    return source, cfg


def _write(cfg: dict) -> str:
    out = Path(tempfile.mkdtemp(prefix="refimpl-registry-"))
    (out / "config.json").write_text(json.dumps(cfg))
    return str(out)


def engine_config(path: str, kv_cache_dtype: str, max_model_len: int):
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=path,
        load_format="dummy",
        skip_tokenizer_init=True,
        max_model_len=max_model_len,
        kv_cache_dtype=kv_cache_dtype,
        enforce_eager=True,
    )
    return args.create_engine_config()


def plan_records(vc, layers: dict, specs: dict) -> list[dict]:
    """vLLM's planner and capacity functions at each (budget, length) of PLANS; a refusal
    is kept as vLLM's message."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core import kv_cache_utils

    out = []
    backends = []
    for layer in layers.values():
        if layer.get_attn_backend() not in backends:
            backends.append(layer.get_attn_backend())
    names = [layout.name for layout in get_supported_kv_cache_layouts(backends)]
    vc.cache_config = copy.copy(vc.cache_config)
    vc.cache_config.kv_cache_layout = None
    with set_current_vllm_config(vc):
        layout = resolve_kv_cache_layout(vc, [names], specs.values())
    vc.cache_config.kv_cache_layout = layout.name
    built_len = vc.model_config.max_model_len
    for memory, length in PLANS:
        vc.model_config.max_model_len = min(length or built_len, built_len)
        row = {"memory": memory, "max_model_len": vc.model_config.max_model_len}
        try:
            with set_current_vllm_config(vc):
                config = kv_cache_utils.get_kv_cache_configs(vc, [specs], [memory])[0]
                tokens, concurrency = kv_cache_utils.get_kv_cache_capacity(vc, config)
            row.update(
                num_blocks=config.num_blocks,
                tokens=tokens,
                concurrency=concurrency,
                groups=[
                    [
                        type(g.kv_cache_spec).__name__,
                        g.kv_cache_spec.block_size,
                        len(g.layer_names),
                    ]
                    for g in config.kv_cache_groups
                ],
            )
        except ValueError as exc:
            row["refused"] = str(exc).split("\n")[0][:300]
        out.append(row)
    vc.model_config.max_model_len = built_len
    return out


def tp_records(vc) -> dict:
    """KV heads per rank and Mamba state shapes at each TP size (vLLM's own functions)."""
    from vllm.config import ParallelConfig
    from vllm.model_executor.models import ModelRegistry

    model_cls, _ = ModelRegistry.resolve_model_cls(
        vc.model_config.architecture, model_config=vc.model_config
    )
    out = {}
    for tp in TP_SIZES:
        pc = ParallelConfig(tensor_parallel_size=tp)
        row = {"num_kv_heads": vc.model_config.get_num_kv_heads(pc)}
        try:
            vc.model_config.verify_with_parallel_config(pc)
        except Exception as exc:  # noqa: BLE001 - vLLM's engine would not start
            row["refused"] = str(exc).splitlines()[0][:200]
        if hasattr(model_cls, "get_mamba_state_shape_from_config"):
            tvc = copy.copy(vc)
            tvc.parallel_config = pc
            try:
                shapes = model_cls.get_mamba_state_shape_from_config(tvc)
                row["mamba_shapes"] = [list(s) for s in shapes]
            except Exception as exc:  # noqa: BLE001 - vLLM refuses a size that won't split
                row["mamba_shapes"] = f"error: {type(exc).__name__}"
        out[str(tp)] = row
    return out


def build(path: str, kv_cache_dtype: str):
    """vLLM's engine config for the file (at MAX_MODEL_LEN, or the model's own shorter
    length), its model built on the meta device, and the layers' specs."""
    try:
        vc = engine_config(path, kv_cache_dtype, MAX_MODEL_LEN)
    except Exception:  # noqa: BLE001 - a shorter model: its own length
        vc = engine_config(path, kv_cache_dtype, None)
    layers = build_layers(vc)
    specs = layer_spec_objects(vc, layers)
    if not specs:
        raise RuntimeError("vLLM registers no KV cache layer for this model")
    return vc, layers, specs


def backend_records(vc, layers: dict, specs: dict) -> dict:
    """The CPU platform's block size, specs and plans, then each CUDA backend's."""
    cpu_vc = copy.copy(vc)
    cpu_vc.cache_config = copy.copy(vc.cache_config)
    out = {
        "CPU_ATTN": {
            "block_size": vc.cache_config.block_size,
            "mamba_block_size": vc.cache_config.mamba_block_size,
            "layers": [[n, spec_record(s)] for n, s in specs.items()],
            "plans": plan_records(cpu_vc, layers, specs),
        }
    }
    for backend in MLA_BACKENDS if vc.model_config.use_mla else DENSE_BACKENDS:
        try:
            out[backend] = backend_case(vc, layers, backend)
        except ImportError as exc:
            out[backend] = {"unavailable": str(exc)[:200]}
        except Exception as exc:  # noqa: BLE001 - vLLM refuses this backend
            out[backend] = {"refused": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return out


def _error(exc: BaseException) -> dict:
    last = traceback.extract_tb(exc.__traceback__)[-1]
    text = str(exc).splitlines()[0][:240] if str(exc) else ""
    return {
        "error": f"{type(exc).__name__}: {text}" if text else type(exc).__name__,
        "where": f"{Path(last.filename).name}:{last.lineno}",
    }


def sweep_one(arch: str, module: str, kind: str, known: dict[str, str]) -> dict:
    source, cfg = make_config(arch, module, known)
    result = {"architecture": arch, "kind": kind, "source": source}
    path = _write(cfg)
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(120)
    try:
        with quiet():
            vc, layers, specs = build(path, "auto")
            result["config"] = registry_compare.compact_config(
                json.loads(Path(path, "config.json").read_text()), _TOWER_KEYS
            )
            result.update(
                vllm_model=vc.model_config.architecture,
                max_model_len=vc.model_config.max_model_len,
                model_dtype=str(vc.model_config.dtype).removeprefix("torch."),
                mamba_cache_mode=vc.cache_config.mamba_cache_mode,
                cpu_mamba_ssm_cache_dtype=vc.cache_config.mamba_ssm_cache_dtype,
                enable_prefix_caching=vc.cache_config.enable_prefix_caching,
                disable_hybrid=bool(vc.scheduler_config.disable_hybrid_kv_cache_manager),
                max_in_flight_tokens=vc.max_in_flight_tokens,
                backends=backend_records(vc, layers, specs),
                tensor_parallel=tp_records(vc),
                status="built",
            )
            try:  # the same model with an fp8 cache (a second build: the layers keep it)
                result["fp8"] = {"backends": backend_records(*build(path, "fp8"))}
            except (Exception, Timeout) as exc:  # noqa: BLE001
                result["fp8"] = _error(exc)
    except (Exception, Timeout) as exc:  # noqa: BLE001 - vLLM's own error is the result
        result.update(status="error", **_error(exc))
    finally:
        signal.alarm(0)
    return result


def backend_case(vc_cpu, layers: dict, backend_name: str) -> dict:
    """The same layers asked again with a CUDA backend class, at the block size vLLM's
    platform code gives that backend (`_preferred_block_size_for_backends`, and
    `_align_hybrid_block_size` for hybrids), then planned (as `vllm_models.cuda_backend_case`
    does for the committed configs)."""
    from vllm.config import set_current_vllm_config
    from vllm.config.cache import CacheConfig
    from vllm.platforms.interface import Platform

    backend = backend_class(backend_name)
    vc = copy.copy(vc_cpu)
    vc.cache_config = copy.copy(vc_cpu.cache_config)
    vc.model_config = copy.copy(vc_cpu.model_config)
    cc = vc.cache_config
    cc.mamba_page_size_padded = None
    cc.block_size = CacheConfig.DEFAULT_BLOCK_SIZE
    attention = {n: lay for n, lay in layers.items() if not lay.get_attn_backend().is_ssm()}
    saved = {n: lay.attn_backend for n, lay in attention.items()}
    # the CPU platform resets the SSM state dtype to float32 on this host; a CUDA platform
    # leaves the user's setting ("auto"), which the Mamba layers read from the shared config
    ssm_dtype = vc_cpu.cache_config.mamba_ssm_cache_dtype
    try:
        vc_cpu.cache_config.mamba_ssm_cache_dtype = cc.mamba_ssm_cache_dtype = "auto"
        for lay in attention.values():
            lay.attn_backend = backend
        with set_current_vllm_config(vc):
            cc.block_size = Platform._preferred_block_size_for_backends(
                [backend], CacheConfig.DEFAULT_BLOCK_SIZE, vc
            )
            if vc.model_config.is_hybrid:
                if cc.mamba_cache_mode != "align":
                    cc.mamba_block_size = vc.model_config.max_model_len
                Platform._align_hybrid_block_size(vc, backend)
        specs = layer_spec_objects(vc, layers)
        return {
            "block_size": cc.block_size,
            "mamba_block_size": cc.mamba_block_size,
            "supports_kv_cache_dtype": cc.cache_dtype in backend.supported_kv_cache_dtypes,
            "layers": [[n, spec_record(s)] for n, s in specs.items()],
            "plans": plan_records(vc, layers, specs),
        }
    finally:
        vc_cpu.cache_config.mamba_ssm_cache_dtype = ssm_dtype
        for n, lay in attention.items():
            lay.attn_backend = saved[n]


def _inspect_in_process() -> None:
    """vLLM inspects each model class in a fresh subprocess (so that CUDA is not initialised
    in the parent), which costs a whole vLLM import per architecture; a CPU-only process has
    no CUDA to protect, so the same inspection runs here."""
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()


class _AnyMeta(type):
    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return cls


class _Anything(metaclass=_AnyMeta):
    """Whatever a module-level line of an image processor asks torchvision for."""

    def __init__(self, *args, **kwargs) -> None:
        pass


class _TorchvisionStandIn(types.ModuleType):
    """torchvision, which the CPU venv does not ship: vLLM's multimodal model files import
    image processors at their top (never called when a model is only built on the meta
    device, which needs the module to import and nothing more)."""

    __path__: list[str] = []

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything


class _TorchvisionFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _TorchvisionStandIn(spec.name)

    def exec_module(self, module) -> None:
        pass


def sweep(selected: list[str], retry: bool = False) -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    _inspect_in_process()
    if importlib.util.find_spec("torchvision") is None:
        sys.meta_path.append(_TorchvisionFinder())
    CACHE.mkdir(parents=True, exist_ok=True)
    known = _transformers_model_types()
    for arch, module, kind in registry_entries():
        if selected and arch not in selected:
            continue
        out = CACHE / f"{arch}.json"
        if out.exists() and not selected:
            if not retry or json.loads(out.read_text())["status"] == "built":
                continue
        start = time.time()
        result = sweep_one(arch, module, kind, known)
        out.write_text(json.dumps(result, separators=(",", ":")))
        print(
            f"{arch:50s} {result['status']:6s} {time.time() - start:5.1f}s "
            f"{result.get('error', '')[:100]}",
            flush=True,
        )


def host_cpu_isa() -> str:
    """The recording host as vLLM's CPU platform sees it (the torch probes it calls), in
    refimpl's `--cpu-isa` names: the CPU cases replay with that CPU, wherever they replay."""
    import torch

    if torch.cpu._is_avx512_bf16_supported():
        return "avx512_bf16_amx" if torch.cpu._is_amx_tile_supported() else "avx512_bf16"
    return "avx512" if torch.cpu._is_avx512_supported() else "avx2"


def record() -> None:
    """Pack the cache into the oracle file (sorted, compact)."""
    import vllm

    entries = [json.loads(p.read_text()) for p in sorted(CACHE.glob("*.json"))]
    oracle = registry_compare.pack(entries, vllm.__version__, len(registry_entries()))
    oracle["cpu_isa"] = host_cpu_isa()
    registry_compare.write_oracle(oracle)
    print(f"wrote {registry_compare.ORACLE} ({registry_compare.ORACLE.stat().st_size:,} B)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command, selected = (argv[0], argv[1:]) if argv else ("sweep", [])
    if command in ("sweep", "retry"):
        sweep(selected, retry=command == "retry")
    elif command == "record":
        record()
    else:
        raise SystemExit("usage: registry_sweep sweep [ARCH ...] | record")
    return 0


if __name__ == "__main__":
    sys.exit(main())
