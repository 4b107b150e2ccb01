"""refimpl's side of the model crosscheck: the same records as `vllm_models`, from refimpl.

`refimpl_case(case, backend)` rebuilds one recorded case (a config, a kv cache dtype, a
backend) with `refimpl.models.get_kv_cache_spec` and `kv_cache_utils.plan_kv_cache`, in the
shape vLLM's side recorded, so `differences` can list every field that differs. Used by
`python -m tools.crosscheck.vllm_models run` (vLLM's answers fresh) and by
tests/test_models_vllm_oracle.py (vLLM's answers from tests/data/vllm_models_oracle.json).
"""

from __future__ import annotations

import re
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "configs"
ORACLE = Path(__file__).resolve().parents[2] / "tests" / "data" / "vllm_models_oracle.json"
#: vLLM's backend enum names -> refimpl's --backend names
BACKEND_NAMES = {
    "CPU_ATTN": "cpu_attn",
    "FLASH_ATTN": "flash_attn",
    "FLASHINFER": "flashinfer",
    "TRITON_ATTN": "triton_attn",
    "FLASH_ATTN_MLA": "flash_attn_mla",
    "FLASHMLA": "flashmla",
    "TRITON_MLA": "triton_mla",
}
#: The CPU the oracle's CPU_ATTN cases were recorded on when a case does not say: its torch
#: reported neither AVX512-BF16 nor AMX (bf16 Mamba states, 16-token MLA blocks).
RECORDED_CPU_ISA = "avx2"
#: vLLM's Mamba backend enum names -> refimpl's mamba_type
MAMBA_TYPES = {"MAMBA2": "mamba2", "GDN_ATTN": "gdn_attn", "MAMBA1": "mamba1"}


def vllm_layer_name(architecture: str, name: str) -> str:
    """refimpl's layer name as vLLM's model registers it. Only DeepSeek V4 differs: refimpl
    keeps the short names of the vLLM KV-cache article (`layers.2.indexer.k_cache`,
    `layers.2.attn`), vLLM's V4 model nests every cache under the layer's attention module
    (`model.layers.2.attn.indexer.k_cache`, `model.layers.2.attn`)."""
    if architecture != "DeepseekV4ForCausalLM":
        return name
    found = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    if found is None:
        return name
    index, rest = found.groups()
    return f"model.layers.{index}.attn" + ("" if rest == "attn" else f".{rest}")


def spec_record(spec) -> dict:
    """A refimpl spec in the record format of `vllm_models.spec_record`."""
    out = {"type": type(spec).__name__, "block_size": spec.block_size}
    if hasattr(spec, "shapes"):
        out.update(
            shapes=[list(s) for s in spec.shapes],
            dtypes=list(spec.dtypes),
            mamba_type=spec.mamba_type,
            mamba_cache_mode=spec.mamba_cache_mode,
            page_size_padded=spec.page_size_padded,
            num_prefill_checkpoint_blocks=spec.num_prefill_checkpoint_blocks,
        )
    else:
        out.update(
            num_kv_heads=spec.num_kv_heads,
            head_size=spec.head_size,
            head_size_v=spec.head_size_v,
            dtype=spec.dtype,
            sliding_window=getattr(spec, "sliding_window", None),
            kernel_block_size=spec.kernel_block_size,
            page_size_padded=spec.page_size_padded,
        )
    out["page_size_bytes"] = spec.page_size_bytes
    return out


def comparable(record: dict) -> dict:
    """The fields both sides record, normalised (vLLM's enum names, MLA's fp8 dtype)."""
    keep = dict(record)
    if "mamba_type" in keep:
        keep["mamba_type"] = MAMBA_TYPES.get(keep["mamba_type"], keep["mamba_type"])
    for field in ("attention_chunk_size", "cache_dtype_str", "num_speculative_blocks"):
        keep.pop(field, None)
    if keep.get("type") == "MambaSpec":
        keep.pop("kernel_block_size", None)
    return keep


def refimpl_case(case: dict, backend: str) -> dict:
    """refimpl's specs and plan for one recorded case at one backend."""
    from refimpl.hybrid.kv_cache_utils import plan_kv_cache
    from refimpl.models import get_kv_cache_spec

    recorded = case["backends"][backend]
    try:
        model = get_kv_cache_spec(
            case.get("config_json") or CONFIG_DIR / case["config"],
            backend=BACKEND_NAMES[backend],
            kv_cache_dtype=case["kv_cache_dtype"],
            max_model_len=case["max_model_len"],
            enable_prefix_caching=case["enable_prefix_caching"],
            cpu_isa=case.get("cpu_isa", RECORDED_CPU_ISA),
        )
    except ValueError as exc:  # vLLM refuses such a backend too, when its class says so
        return {"refused": str(exc)}
    rename = lambda name: vllm_layer_name(model.architecture, name)  # noqa: E731
    out = {
        "block_size": model.block_size,
        "mamba_block_size": model.mamba_block_size,
        "layers": [[rename(name), spec_record(spec)] for name, spec in model.specs.items()],
    }
    plan = recorded.get("plan")
    if plan is not None:
        result = plan_kv_cache(
            model.specs,
            max_model_len=case["max_model_len"],
            max_num_batched_tokens=plan["max_in_flight_tokens"],  # recorded: one batch
            async_scheduling=False,
            kv_cache_memory_bytes=plan["memory"],
        )
        # the group specs' own classes (a group of unlike layers is vLLM's
        # UniformTypeKVCacheSpecs; `plan --config` prints its members' kind instead)
        out["plan"] = {
            "groups": [
                {
                    "type": type(g.kv_cache_spec).__name__,
                    "block_size": g.block_size,
                    "layers": [rename(n) for n in g.layer_names],
                }
                for g in result.groups
            ],
            "num_blocks": result.num_blocks,
            "block_stride": result.bytes_per_block,
            "kv_cache_size_tokens": result.num_tokens,
            "max_concurrency": result.max_concurrency,
        }
    return out


def spec_differences(case: dict, backend: str, ours: dict) -> list[str]:
    """Every per-layer field where refimpl's specs differ from vLLM's, as readable lines."""
    theirs = case["backends"][backend]
    where = f"{case['config']} ({case['kv_cache_dtype']}, {backend})"
    supported = theirs.get("supports_kv_cache_dtype", True)
    if not supported or "refused" in ours:
        if supported:
            return [
                f"{where}: vLLM's class stores this cache, refimpl refuses: {ours['refused']}"
            ]
        if "refused" not in ours:
            return [f"{where}: vLLM's class does not store this cache dtype, refimpl plans it"]
        return []
    out = []
    if theirs["block_size"] != ours["block_size"]:
        out.append(
            f"{where}: block size vLLM {theirs['block_size']}, refimpl {ours['block_size']}"
        )
    names_theirs = [n for n, _ in theirs["layers"]]
    names_ours = [n for n, _ in ours["layers"]]
    if names_theirs != names_ours:
        out.append(
            f"{where}: layer names/order differ: vLLM {names_theirs[:3]}..., refimpl "
            f"{names_ours[:3]}..."
        )
        return out
    for (name, t), (_, o) in zip(theirs["layers"], ours["layers"], strict=True):
        t, o = comparable(t), comparable(o)
        keys = sorted(k for k in set(t) | set(o) if t.get(k) != o.get(k))
        if keys:
            out.append(
                f"{where} {name}: "
                + ", ".join(f"{k} vLLM {t.get(k)!r} refimpl {o.get(k)!r}" for k in keys)
            )
    return out


def plan_differences(case: dict, backend: str, ours: dict) -> list[str]:
    """Every planned figure (groups, blocks, stride, tokens, concurrency) that differs."""
    theirs = case["backends"][backend].get("plan")
    if theirs is None or "refused" in ours:  # a refusal is judged by spec_differences
        return []
    where = f"{case['config']} ({case['kv_cache_dtype']}, {backend}) plan"
    out = []
    mine = ours["plan"]
    # (vLLM's KVCacheTensor.block_stride is one layer's page in its layout, refimpl's the
    # bytes of a whole block id: not the same quantity, so the stride is not compared)
    for key in ("num_blocks", "kv_cache_size_tokens"):
        if theirs[key] != mine[key]:
            out.append(f"{where}: {key} vLLM {theirs[key]:,}, refimpl {mine[key]:,}")
    if abs(theirs["max_concurrency"] - mine["max_concurrency"]) > 1e-9:
        out.append(
            f"{where}: concurrency vLLM {theirs['max_concurrency']:.4f}, refimpl "
            f"{mine['max_concurrency']:.4f}"
        )
    shape = [(g["type"], g["block_size"], len(g["layers"])) for g in theirs["groups"]]
    mine_shape = [(g["type"], g["block_size"], len(g["layers"])) for g in mine["groups"]]
    if shape != mine_shape:
        out.append(f"{where}: groups vLLM {shape}, refimpl {mine_shape}")
    return out
