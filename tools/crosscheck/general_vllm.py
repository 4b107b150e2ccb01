"""vLLM's own planner on the general crosscheck's cases (only inside `.venv-vllm`): 0.32, or
0.33 when its source comes first on PYTHONPATH (`make crosscheck-033`, `vllm033.py`).

Every spec is one of vLLM's classes (`FullAttentionSpec`, `SlidingWindowSpec`,
`ChunkedLocalAttentionSpec`, `MLAAttentionSpec`, `MambaSpec`) built from the case's numbers;
a Mamba hybrid's block size and state padding come from vLLM's platform step
(`Platform._align_hybrid_block_size`, fed a stand-in model class that reports the case's
state shapes and a stand-in backend that reports the case's smallest kernel block). The plan
is vLLM's `get_kv_cache_configs` (grouping, the memory check, the tensors; in 0.33 the
grouping is `kv_cache_planning.get_global_kv_cache_groups`, passed in) and the figures vLLM's
`get_kv_cache_capacity`, on a config object carrying the case's settings; the tokens in flight
come from `VllmConfig`'s own properties. Nothing here reads refimpl.
"""

from __future__ import annotations

import contextlib
import copy
import re
from types import SimpleNamespace
from unittest import mock

import torch
from vllm.config import VllmConfig
from vllm.platforms.interface import Platform
from vllm.v1.attention.backend import MultipleOf
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
from vllm.v1.core import kv_cache_utils
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.utils import add_kv_sharing_layers_to_kv_cache_groups

try:  # vLLM 0.33: the planning functions live in their own module
    from vllm.v1.core import kv_cache_planning
except ImportError:  # vLLM 0.32: they are in kv_cache_utils
    kv_cache_planning = None

DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "float8_e4m3fn": torch.float8_e4m3fn,
}


def vllm_config(case: dict, block_size: int | None = None) -> SimpleNamespace:
    """The parts of a VllmConfig the planner reads, with vLLM's own in-flight properties."""
    layout = KVCacheLayout[case["layout"]]
    mode = case.get("mamba", {}).get("cache_mode", "none")
    cfg = SimpleNamespace(
        cache_config=SimpleNamespace(
            get_resolved_kv_cache_layout=lambda: layout,
            num_gpu_blocks_override=None,
            prefix_cache_retention_interval=0,
            mamba_cache_mode=mode,
            block_size=block_size or case["block_size"],
            mamba_page_size_padded=None,
            mamba_block_size=None,
            cache_dtype="auto",
            kv_cache_dtype_skip_layers=None,
            user_specified_block_size=True,
        ),
        scheduler_config=SimpleNamespace(
            disable_hybrid_kv_cache_manager=case["disable_hybrid"],
            max_num_batched_tokens=case["max_num_batched_tokens"],
            async_scheduling=case["async_scheduling"],
            max_num_encoder_input_tokens=0,
        ),
        parallel_config=SimpleNamespace(
            pipeline_parallel_size=1, decode_context_parallel_size=1, tensor_parallel_size=1
        ),
        attention_config=SimpleNamespace(hisparse_config=None),
        speculative_config=None,
        model_config=SimpleNamespace(
            max_model_len=case["max_model_len"],
            original_max_model_len=case["max_model_len"],
            hf_config=SimpleNamespace(model_type="random"),
            supports_kv_cache_grouping=False,  # 0.33's builder asks; no model-declared groups
        ),
        use_v2_model_runner=False,
        num_prefill_lookahead_tokens=0,
    )
    cfg.max_concurrent_batches = VllmConfig.max_concurrent_batches.fget(cfg)
    cfg.max_in_flight_tokens = VllmConfig.max_in_flight_tokens.fget(cfg)
    return cfg


def mamba_shapes(case: dict):
    m = case["mamba"]
    return (tuple(m["conv"]), tuple(m["ssm"])), (torch.bfloat16, DTYPES[m["ssm_dtype"]])


def aligned_block_size(case: dict) -> tuple[int, int | None]:
    """vLLM's platform step for attention + Mamba models, on the case's numbers."""
    first = next(x for x in case["layers"] if x["kind"] != "mamba")
    shapes, dtypes = mamba_shapes(case)
    kernel = case["mamba"]["min_kernel_block"]

    class Model:  # stands in for the model class vLLM's registry would resolve
        @staticmethod
        def get_mamba_state_shape_from_config(vllm_config):
            return shapes

        @staticmethod
        def get_mamba_state_dtype_from_config(vllm_config):
            return dtypes

    class Backend:  # stands in for the attention backend: reports the case's kernel block
        @staticmethod
        def customize_spec(spec):
            return spec

        @staticmethod
        def get_supported_kernel_block_sizes():
            return [MultipleOf(kernel)]

    cfg = vllm_config(case)
    cfg.model_config.use_mla = False
    cfg.model_config.dtype = DTYPES[first["dtype"]]
    cfg.model_config.architecture = "Stand-in"
    cfg.model_config.get_num_kv_heads = lambda parallel_config: first["heads"]
    cfg.model_config.get_head_size = lambda: first["head_size"]
    patches = [
        mock.patch(
            "vllm.model_executor.models.ModelRegistry.resolve_model_cls",
            return_value=(Model, "Stand-in"),
        ),
        mock.patch.object(Platform, "_find_non_ssm_backends", return_value=[Backend]),
        mock.patch("vllm.config.vllm.set_current_vllm_config"),
    ]
    from vllm.model_executor.layers.mamba import abstract

    if hasattr(abstract, "get_mamba_prefill_checkpoint_alignment"):  # 0.33 (align mode)
        # what the model's Mamba layers declare: None (the default; Mamba1/2, short conv,
        # GDN off FlashInfer), 64 (GDN on FlashInfer), 16 (KDA on FlashKDA)
        patches.append(
            mock.patch.object(
                abstract,
                "get_mamba_prefill_checkpoint_alignment",
                return_value=case["mamba"].get("checkpoint_alignment"),
            )
        )
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        Platform._align_hybrid_block_size(cfg, Backend)
    return cfg.cache_config.block_size, cfg.cache_config.mamba_page_size_padded


def vllm_specs(case: dict) -> dict:
    block_size, padded = case["block_size"], None
    if "mamba" in case and any(x["kind"] != "mamba" for x in case["layers"]):
        block_size, padded = aligned_block_size(case)
    kernel = case["kernel_block"]
    specs = {}
    sharing = case.get("kv_sharing", {})
    for i, layer in enumerate(case["layers"]):
        kind = layer["kind"]
        name = f"layers.{i}.{kind}"
        if name in sharing:  # the model runner makes no spec for a layer that shares
            continue
        if kind == "mamba":
            shapes, dtypes = mamba_shapes(case)
            mode = case["mamba"]["cache_mode"]
            specs[name] = MambaSpec(
                block_size=block_size if mode == "align" else case["max_model_len"],
                shapes=shapes,
                dtypes=dtypes,
                page_size_padded=padded,
                mamba_type=MambaAttentionBackendEnum[case["mamba"]["type"].upper()],
                mamba_cache_mode=mode,
            )
            continue
        common = dict(
            block_size=block_size,
            num_kv_heads=layer["heads"],
            head_size=layer["head_size"],
            dtype=DTYPES[layer["dtype"]],
            block_stride_alignment=MultipleOf(kernel) if kernel else None,
        )
        if kind == "full":
            specs[name] = FullAttentionSpec(
                **common, head_size_v=layer.get("head_size_v", layer["head_size"])
            )
        elif kind == "sliding":
            specs[name] = SlidingWindowSpec(**common, sliding_window=layer["window"])
        elif kind == "chunked":
            specs[name] = ChunkedLocalAttentionSpec(
                **common, attention_chunk_size=layer["chunk"]
            )
        else:
            specs[name] = MLAAttentionSpec(**common)
    return specs


def spec_kind(spec) -> str:
    if isinstance(spec, UniformTypeKVCacheSpecs):
        kinds = sorted({type(s).__name__ for s in spec.kv_cache_specs.values()})
        return "UniformTypeKVCacheSpecs[" + ",".join(kinds) + "]"
    return type(spec).__name__


def plan_vllm(case: dict, cfg=None, specs: dict | None = None) -> dict:
    """vLLM's answer for one case (or for given specs, planned under a given config)."""
    cfg = cfg or vllm_config(case)
    try:
        specs = specs or vllm_specs(case)
        if kv_cache_planning is None:
            (config,) = kv_cache_utils.get_kv_cache_configs(cfg, [specs], [case["memory"]])
        else:
            groups = kv_cache_planning.get_global_kv_cache_groups(cfg, [specs])
            (config,) = kv_cache_planning.get_kv_cache_configs(
                cfg, [specs], [case["memory"]], groups
            )
    except ValueError as e:
        return refusal(e)
    except (AssertionError, NotImplementedError) as e:
        return {"error": f"refused: {type(e).__name__}: {e}"}
    except StopIteration:  # vLLM 0.32's packer on an unbalanced bucket it must split
        return {"error": "refused: unsplittable bucket"}
    tokens, concurrency = kv_cache_utils.get_kv_cache_capacity(cfg, config)
    out = {
        "groups": [
            [
                list(g.layer_names),
                spec_kind(g.kv_cache_spec),
                g.kv_cache_spec.block_size,
                g.kv_cache_spec.page_size_bytes,
            ]
            for g in config.kv_cache_groups
        ],
        "bytes_per_block": (kv_cache_planning or kv_cache_utils)._pool_bytes_per_block(
            cfg, config.kv_cache_groups
        ),
        "num_blocks": config.num_blocks,
        "tensors": [
            [list(t.layers), t.offset, t.layer_stride, t.block_stride, t.size]
            for t in config.kv_cache_tensors
        ],
        "num_tokens": tokens,
        "max_concurrency": concurrency,
    }
    if case.get("kv_sharing"):
        # the model runner's step, on its own copy of the config (`initialize_kv_cache`)
        groups = copy.deepcopy(config.kv_cache_groups)
        add_kv_sharing_layers_to_kv_cache_groups(dict(case["kv_sharing"]), groups)
        out["layer_names"] = [list(g.layer_names) for g in groups]
    return out


#: vLLM 0.32's refusals whose message is fixed text, by the name the comparison uses.
FIXED_REFUSALS = {
    "No available memory for the cache blocks.": "no memory for blocks",
    "All attention layers in the same KV cache group must have the same window size.": (
        "refused: one group, several window sizes"
    ),
    "Failed to promote local KV cache specs to one unified type.": (
        "refused: local layers cannot be promoted to one type"
    ),
}
_NOT_ENOUGH = re.compile(
    r"max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed, .* available KV cache "
    r"memory \(([\d.]+) GiB\)\. (?:Based on the available memory, the estimated maximum "
    r"model length is (\d+)\. )?"
)


def refusal(e: ValueError) -> dict:
    """vLLM's refusal as data: its memory message's figures (max length, GiB needed and
    available, the estimated longest length), or the name of a fixed message. Any other
    message is kept whole, so it can equal no answer of refimpl's."""
    message = str(e)
    for text, name in FIXED_REFUSALS.items():
        if message.startswith(text):
            return {"error": name}
    found = _NOT_ENOUGH.search(message)
    if found:
        return {
            "error": "not enough memory",
            "max_model_len": int(found[1]),
            "needed_gib": found[2],
            "available_gib": found[3],
            "estimated_max_len": int(found[4] or 0),
        }
    return {"error": f"refused: {type(e).__name__}: {message}"}


def crosscheck_general(num_cases: int) -> tuple[int, list[str], dict[str, int]]:
    """(agreeing cases, failure reports, {cause: agreeing cases}) over cases 0..n-1 and the
    issue's named cases. The causes count "planned" and "refused" fuzzed cases (by vLLM's
    answer) too."""
    from collections import Counter

    from tools.crosscheck.general_planner import (
        NAMED_CASES,
        case_causes,
        named_case,
        plan_refimpl,
        random_case,
    )

    cases = [(str(s), random_case(s)) for s in range(num_cases)]
    cases += [(name, named_case(name)) for name in NAMED_CASES]
    agreed, failures, causes = 0, [], Counter()
    for label, case in cases:
        theirs, ours = plan_vllm(case), plan_refimpl(case)
        if label.isdigit():
            causes["fuzzed, refused" if "error" in theirs else "fuzzed, planned"] += 1
        if theirs == ours:
            agreed += 1
            causes.update(case_causes(case, theirs))
            continue
        keys = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        failures.append(
            f"case {label}: differs in {keys}\n"
            f"    vLLM:    { {k: str(theirs.get(k))[:200] for k in keys} }\n"
            f"    refimpl: { {k: str(ours.get(k))[:200] for k in keys} }"
        )
    return agreed, failures, dict(causes)


def record_general(num_cases: int) -> dict:
    """vLLM's answers for the named cases and the first `num_cases` fuzzed ones."""
    from tools.crosscheck.general_planner import NAMED_CASES, named_case, random_case

    named = [
        {"name": n, "case": named_case(n), "plan": plan_vllm(named_case(n))}
        for n in NAMED_CASES
    ]
    fuzzed = [
        {"seed": s, "case": random_case(s), "plan": plan_vllm(random_case(s))}
        for s in range(num_cases)
    ]
    return {"named": named, "fuzzed": fuzzed}


def mutation_figures(num_cases: int) -> dict[str, int]:
    """{rule: cases (of the fuzzed and named ones) where refimpl with the rule undone no
    longer equals vLLM}."""
    from tools.crosscheck.general_planner import (
        NAMED_CASES,
        RULES,
        named_case,
        plan_refimpl,
        random_case,
        undo_rule,
    )

    cases = [random_case(s) for s in range(num_cases)] + [named_case(n) for n in NAMED_CASES]
    theirs = [plan_vllm(c) for c in cases]
    figures = {}
    for rule in RULES:
        with undo_rule(rule):
            figures[rule] = sum(plan_refimpl(c) != t for c, t in zip(cases, theirs))
    return figures
