"""refimpl against vLLM 0.32 on every architecture of its model registry, without vLLM.

tests/data/vllm_registry_oracle.json.gz was written by `tools.crosscheck.registry_sweep`: for each
entry of vLLM's `ModelRegistry` (text generation and multimodal) a config from the model type's
config class, with a real layer pattern; vLLM built the model on the meta device and, on the
CPU platform and with each CUDA attention backend, gave every layer's spec and planned them
with its own `get_kv_cache_configs` / `get_kv_cache_capacity` at several budgets and lengths,
and its KV heads per rank at TP 1-8. Here refimpl plans the same configs and every figure must
agree, or refimpl must refuse with the rule it lacks.
"""

from __future__ import annotations

import functools

import pytest

from refimpl.models import registry
from tools.crosscheck import registry_compare

pytestmark = pytest.mark.skipif(
    not registry_compare.ORACLE.exists(), reason="no recorded registry oracle"
)
ORACLE = registry_compare.load_oracle() if registry_compare.ORACLE.exists() else {}
BUILT = {e["architecture"]: e for e in ORACLE.get("built", [])}


@functools.cache
def coverage() -> list[dict]:
    return registry_compare.coverage(ORACLE)


@pytest.mark.parametrize("arch", sorted(BUILT))
def test_refimpl_plans_what_vllm_plans_or_names_the_missing_rule(arch):
    cases, diffs = registry_compare.compare_entry(BUILT[arch])
    if arch in registry.MISSING_RULES:
        assert diffs and all(": refimpl refuses: " in d for d in diffs), diffs[:3]
        assert all(registry.MISSING_RULES[arch] in d for d in diffs), diffs[:1]
        return
    assert cases >= 8
    assert diffs == []


def test_the_sweep_covers_the_whole_registry_and_the_coverage_target():
    rows = coverage()
    assert len(rows) == ORACLE["registry_size"] == 240
    built = [r for r in rows if r["status"] != "not built"]
    equal = [r for r in built if r["status"] == "equal"]
    assert not [r for r in built if r["status"] == "differs"]
    assert len(equal) >= 100
    assert len(equal) >= 0.95 * len(built)
    assert sum(r["cases"] for r in equal) >= 1000


def test_the_generated_table_is_current():
    text = registry_compare.TABLE.read_text()
    assert registry_compare.headline(coverage()) in text


def test_every_case_kind_is_in_the_oracle():
    """CPU and every CUDA backend, fp8-free plans at several budgets, hybrids and MLA."""
    backends = {b for e in BUILT.values() for b, r in e["backends"].items() if "layers" in r}
    assert {"CPU_ATTN", "FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLASHMLA"} <= backends
    kinds = {spec["type"] for e in BUILT.values() for spec in e["specs"]}
    assert {
        "FullAttentionSpec",
        "SlidingWindowSpec",
        "ChunkedLocalAttentionSpec",
        "MLAAttentionSpec",
        "MambaSpec",
    } <= kinds
    mamba = {s["mamba_type"] for e in BUILT.values() for s in e["specs"] if "mamba_type" in s}
    assert {"MAMBA1", "MAMBA2", "GDN_ATTN", "SHORT_CONV"} <= mamba
    budgets = {p[0] for e in BUILT.values() for p in e["backends"]["CPU_ATTN"]["plans"]}
    assert len(budgets) >= 3


@pytest.mark.parametrize(
    ("arch", "module", "undone"),
    [
        # Cohere2's window is one token longer than the config's
        ("Cohere2ForCausalLM", "cohere2", "generic"),
        # Falcon-7B shares one K/V head (multi_query)
        ("FalconForCausalLM", "falcon", "generic"),
        # MiniCPM3 caches qk_nope + qk_rope values per head, not head_dim
        ("MiniCPM3ForCausalLM", "minicpm3", "generic"),
        # Gemma 4: 512-value global heads (per_layer_config) and KV-shared last layers
        ("Gemma4ForCausalLM", "gemma4", "generic"),
        # Falcon-H1: a Mamba2 mixer beside every attention layer
        ("FalconH1ForCausalLM", "mamba", "generic"),
        # LFM2: short-conv layers among the attention layers
        ("Lfm2ForCausalLM", "lfm2", "generic"),
        # LongCat-Flash: two MLA caches per layer
        ("LongcatFlashForCausalLM", "longcat", "generic"),
        # IQuest-LoopCoder: a second, 64-token sliding pass over every layer
        ("IQuestLoopCoderForCausalLM", "iquest", "generic"),
        # HRM-Text: a cache per run of a layer in its nested cycles
        ("HrmTextForCausalLM", "hrm", "generic"),
    ],
)
def test_a_quirk_undone_is_noticed(monkeypatch, arch, module, undone):
    import importlib

    quirk = importlib.import_module(f"refimpl.models.{module}")
    plain = importlib.import_module(f"refimpl.models.{undone}")
    monkeypatch.setattr(quirk, "cache_layers", plain.cache_layers)
    _, diffs = registry_compare.compare_entry(BUILT[arch])
    assert diffs


def test_the_field_driven_window_rule_undone_is_noticed(monkeypatch):
    """Exaone 4 mixes sliding and full layers by `layer_types`; Phi-3 slides on every layer
    with no `layer_types`: both come from the same field-driven rule."""
    from refimpl.models import generic

    for arch in ("Exaone4ForCausalLM", "Phi3ForCausalLM"):
        assert registry_compare.compare_entry(BUILT[arch])[1] == []
    monkeypatch.setattr(
        generic, "per_layer_attention", lambda cfg, n, window: [(None, None)] * n
    )
    for arch in ("Exaone4ForCausalLM", "Phi3ForCausalLM"):
        assert registry_compare.compare_entry(BUILT[arch])[1]


def test_fp8_caches_are_in_the_oracle():
    fp8 = [e for e in BUILT.values() if "backends" in e.get("fp8", {})]
    assert len(fp8) >= 90


def test_llama4_keeps_the_hybrid_manager_unless_an_eagle_drafter_turns_it_off():
    """vLLM 0.32 keeps its hybrid manager for chunked local attention by default
    (VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1) and turns it off with EAGLE; off,
    the chunked layers are planned as full attention in one group."""
    from refimpl.models import hybrid_kv_cache_manager_disabled

    entry = BUILT["Llama4ForConditionalGeneration"]
    assert entry["disable_hybrid"] is False
    model = registry_compare.refimpl_model(registry_compare.unpack(entry), "FLASH_ATTN")
    assert hybrid_kv_cache_manager_disabled(model) == (False, None)
    off, why = hybrid_kv_cache_manager_disabled(model, speculative_method="eagle")
    assert off and "EAGLE" in why
    assert hybrid_kv_cache_manager_disabled(model, allow_chunked_local_with_hybrid=False)[0]
    plan = registry_compare.unpack(entry)["backends"]["FLASH_ATTN"]["plans"][0]
    assert len(plan["groups"]) > 1  # vLLM's own plan keeps chunked and full groups apart


def test_an_architecture_without_a_rule_is_refused_in_one_line():
    with pytest.raises(ValueError, match="refimpl cannot plan") as exc:
        registry.resolve_family("NoSuchModelForCausalLM")
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"layer_types": ["full_attention", "mamba"]}, "layer type 'mamba'"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "no sliding_window"),
        ({"layer_types": ["full_attention"]}, "lists 1 of 2 layers"),
        ({"num_hidden_layers": None}, "sets none of num_hidden_layers"),
    ],
)
def test_the_field_driven_rules_refuse_bad_fields_in_one_line(change, words):
    from refimpl.models import get_kv_cache_spec

    config = {
        "architectures": ["Glm4ForCausalLM"],  # a GENERIC architecture
        "model_type": "glm4",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "torch_dtype": "bfloat16",
        **change,
    }
    with pytest.raises(ValueError, match=words) as exc:
        get_kv_cache_spec({k: v for k, v in config.items() if v is not None})
    assert "\n" not in str(exc.value)
