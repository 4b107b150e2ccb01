"""refimpl.models and `plan --config` replayed against vLLM 0.32's own answers, without vLLM.

tests/data/vllm_models_oracle.json was written by `make crosscheck-record`
(`tools.crosscheck.vllm_models`): for each config in tests/data/configs, vLLM built its own
model class on the meta device, settled the block size with its platform code, asked every
layer for `get_kv_cache_spec`, and planned the specs with `get_kv_cache_configs` and
`get_kv_cache_capacity` (8 GiB). The CPU platform ran for real; the CUDA backends were asked
with the same layers given that backend class. Each test below rebuilds one case with refimpl
and requires every field to be equal; the mutation tests undo one rule each and require the
check to notice.
"""

from __future__ import annotations

import json

import pytest

from tools.crosscheck import models_compare
from tools.crosscheck.models_compare import (
    ORACLE,
    plan_differences,
    refimpl_case,
    spec_differences,
)

pytestmark = pytest.mark.skipif(not ORACLE.exists(), reason="no recorded vLLM oracle")
ORACLE_DATA = json.loads(ORACLE.read_text()) if ORACLE.exists() else {"cases": []}
CASES = [
    pytest.param(case, backend, id=f"{case['config']}-{case['kv_cache_dtype']}-{backend}")
    for case in ORACLE_DATA["cases"]
    for backend, recorded in case["backends"].items()
    if "unavailable" not in recorded
]


def test_the_oracle_covers_every_family_and_backend():
    configs = {case["config"] for case in ORACLE_DATA["cases"]}
    families = {
        "llama-3.1-8b",
        "qwen2.5-7b-instruct",
        "qwen3-8b",
        "mistral-7b-instruct-v0.3",
        "gemma-2-9b-it",
        "gemma-3-27b-it",
        "gpt-oss-20b",
        "granite-4.0-h-tiny",
        "qwen3-next-80b-a3b-instruct",
        "deepseek-v2-lite",
        "deepseek-v3",
        "deepseek-v4-flash",  # vLLM's own V4 model, built on the meta device
    }
    assert families <= configs, sorted(families - configs)
    backends = {b for _, b in ((p.values[0], p.values[1]) for p in CASES)}
    assert {
        "CPU_ATTN",
        "FLASH_ATTN",
        "FLASHINFER",
        "TRITON_ATTN",
        "FLASH_ATTN_MLA",
        "FLASHMLA",
        "TRITON_MLA",
    } <= backends
    # an fp8 MLA cache, which FlashAttention MLA does not store, is recorded too
    assert any(
        case["kv_cache_dtype"] == "fp8"
        and case["backends"].get("FLASH_ATTN_MLA", {}).get("supports_kv_cache_dtype") is False
        for case in ORACLE_DATA["cases"]
    )
    unavailable = [
        f"{case['config']} {backend}"
        for case in ORACLE_DATA["cases"]
        for backend, recorded in case["backends"].items()
        if "unavailable" in recorded
    ]
    assert unavailable == []


@pytest.mark.parametrize(("case", "backend"), CASES)
def test_every_layer_spec_equals_vllms(case, backend):
    ours = refimpl_case(case, backend)
    assert spec_differences(case, backend, ours) == []


@pytest.mark.parametrize(("case", "backend"), CASES)
def test_plan_tokens_and_concurrency_equal_vllms(case, backend):
    ours = refimpl_case(case, backend)
    assert plan_differences(case, backend, ours) == []


def test_tensor_parallel_heads_and_mamba_shapes_equal_vllms():
    from refimpl.models import HFConfig, get_kv_cache_spec
    from refimpl.models.registry import resolve_family

    checked = 0
    for case in ORACLE_DATA["cases"]:
        cfg = HFConfig.load(models_compare.CONFIG_DIR / case["config"])
        family = resolve_family(cfg.architecture)
        for tp, theirs in case.get("tensor_parallel", {}).items():
            if isinstance(theirs.get("mamba_shapes"), str):  # vLLM refused the split too
                with pytest.raises(ValueError):
                    family.cache_layers(cfg, int(tp))
                continue
            if not hasattr(family, "cache_layers"):  # DeepSeek V4: its own spec builder
                specs = get_kv_cache_spec(cfg, tensor_parallel_size=int(tp)).specs.values()
                assert {s.num_kv_heads for s in specs} == {theirs["num_kv_heads"]}
                checked += 1
                continue
            model = family.cache_layers(cfg, int(tp))
            assert model.num_kv_heads == theirs["num_kv_heads"], (case["config"], tp)
            if "mamba_shapes" in theirs:
                mamba = [layer for layer in model.layers if hasattr(layer, "shapes")]
                assert [list(s) for s in mamba[0].shapes] == theirs["mamba_shapes"]
            checked += 1
    assert checked >= 30


def test_backend_table_equals_vllms_backend_classes():
    from refimpl.models.backends import BACKENDS

    by_vllm_name = {info.name: info for info in BACKENDS.values()}
    assert set(ORACLE_DATA["backends"]) == set(by_vllm_name)
    for name, theirs in ORACLE_DATA["backends"].items():
        ours = by_vllm_name[name]
        sizes = theirs["kernel_block_sizes"]
        fixed = [s for s in sizes if isinstance(s, int)]
        multiple = [s["multiple_of"] for s in sizes if isinstance(s, dict)]
        assert (ours.multiple_of, list(ours.fixed_sizes)) == (
            multiple[0] if multiple else None,
            fixed,
        ), name
        assert ours.preferred_block_size() == theirs["preferred_block_size"], name
        if ours.platform == "cuda":
            assert list(ours.kv_cache_dtypes) == theirs["kv_cache_dtypes"], name


def vllm_hopper_choice(mla: bool, kv_cache_dtype: str) -> str | None:
    """The backend vLLM 0.32 selects on a Hopper GPU, from what it recorded: the first in its
    priority order whose class serves the model kind, is not sparse, runs on SM90 and lists
    the dtype (the hardware probes a Hopper GPU with FlashAttention 3 passes are not asked)."""
    hopper = ORACLE_DATA["hopper"]
    for name in hopper["order"]["mla" if mla else "attention"][kv_cache_dtype]:
        facts = hopper["facts"][name]
        assert "unavailable" not in facts, name
        if (
            facts["is_mla"] == mla
            and not facts["is_sparse"]
            and facts["sm90"]
            and kv_cache_dtype in facts["kv_cache_dtypes"]
        ):
            return name
    return None


@pytest.mark.parametrize("mla", [False, True], ids=["attention", "mla"])
def test_default_backend_is_vllms_hopper_choice_for_each_cache_dtype(mla):
    from refimpl.models.backends import BACKENDS, VLLM_CACHE_DTYPES, default_backend

    assert set(ORACLE_DATA["hopper"]["order"]["mla"]) == set(VLLM_CACHE_DTYPES)
    for dtype in VLLM_CACHE_DTYPES:
        theirs = vllm_hopper_choice(mla, dtype)
        if theirs is None:  # vLLM finds no valid backend and refuses to start
            with pytest.raises(ValueError, match="no .* backend"):
                default_backend(mla=mla, kv_cache_dtype=dtype)
            continue
        assert BACKENDS[default_backend(mla=mla, kv_cache_dtype=dtype)].name == theirs, dtype
    # the cases the audit was about: 16-token FlashAttention MLA unless the cache is fp8
    assert vllm_hopper_choice(True, "auto") == "FLASH_ATTN_MLA"
    assert vllm_hopper_choice(True, "fp8") == "FLASHMLA"


def _case(config, backend="FLASH_ATTN", dtype="auto"):
    for case in ORACLE_DATA["cases"]:
        if case["config"] == config and case["kv_cache_dtype"] == dtype:
            return case, backend
    pytest.skip(f"{config} not recorded")


def _gemma_alternate(cfg, n):
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]


@pytest.mark.parametrize(
    ("target", "replacement", "config", "backend"),
    [
        # Gemma 3: every sixth layer global -> alternate
        (
            "refimpl.models.gemma.default_layer_types",
            _gemma_alternate,
            "gemma-3-27b-it",
            "FLASH_ATTN",
        ),
        # hybrid alignment off: Mamba states in 16-token pages
        (
            "refimpl.models.align_hybrid_block_size",
            lambda model, backend, block, size: (block, None, []),
            "granite-4.0-h-tiny",
            "FLASH_ATTN",
        ),
        # TP replication: more ranks than KV heads would give 0 heads
        (
            "refimpl.models.config.kv_heads_per_rank",
            lambda heads, tp: heads,
            "tiny-llama",
            "CPU_ATTN",
        ),
        # float32 checkpoints served as float32
        (
            "refimpl.models.config._MODEL_DTYPES",
            {"bfloat16": "bfloat16", "float32": "float32"},
            "gemma-2-9b-it",
            "FLASH_ATTN",
        ),
        # the CPU platform's 128-token default -> CUDA's 16
        ("refimpl.models.CPU_DEFAULT_BLOCK_SIZE", 16, "tiny-llama", "CPU_ATTN"),
    ],
)
def test_undoing_a_rule_makes_the_check_fail(
    monkeypatch, target, replacement, config, backend
):
    case, backend = _case(config, backend)
    module, name = target.rsplit(".", 1)
    import importlib

    monkeypatch.setattr(importlib.import_module(module), name, replacement)
    if name == "kv_heads_per_rank":  # the families import it by name
        for family in ("llama", "gemma", "gpt_oss", "granitemoehybrid", "qwen3_next"):
            monkeypatch.setattr(f"refimpl.models.{family}.kv_heads_per_rank", replacement)
        case = dict(case, backends={backend: case["backends"][backend]})
        model = importlib.import_module("refimpl.models.llama")
        from refimpl.models import HFConfig

        cfg = HFConfig.load(models_compare.CONFIG_DIR / config)
        theirs = case.get("tensor_parallel") or ORACLE_DATA["cases"][0]["tensor_parallel"]
        assert model.cache_layers(cfg, 16).num_kv_heads != theirs["16"]["num_kv_heads"]
        return
    ours = refimpl_case(case, backend)
    assert spec_differences(case, backend, ours) + plan_differences(case, backend, ours)


def test_mamba2_prefill_checkpoint_block_matters(monkeypatch):
    case, backend = _case("granite-4.0-h-tiny")
    from refimpl.models import layers

    original = layers.MambaLayer.get_kv_cache_spec

    def without_checkpoint(self, ctx):
        from dataclasses import replace

        return replace(original(self, ctx), num_prefill_checkpoint_blocks=0)

    monkeypatch.setattr(layers.MambaLayer, "get_kv_cache_spec", without_checkpoint)
    ours = refimpl_case(case, backend)
    assert any(
        "kv_cache_size_tokens" in line for line in plan_differences(case, backend, ours)
    )
