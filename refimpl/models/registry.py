"""Which family module plans which architecture (vLLM's `ModelRegistry`, cache only)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from refimpl.models.layers import AttentionLayer, Layer, MambaLayer, MLALayer

#: architecture name in config.json -> the family module that lists its cache layers
_FAMILIES = {
    "llama": (
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
    ),
    "gemma": ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
    "gpt_oss": ("GptOssForCausalLM",),
    "deepseek_v2": ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"),
    "deepseek_v4": ("DeepseekV4ForCausalLM",),
    "granitemoehybrid": ("GraniteMoeHybridForCausalLM",),
    "qwen3_next": ("Qwen3NextForCausalLM",),
}
ARCHITECTURES = {arch: family for family, archs in _FAMILIES.items() for arch in archs}


@dataclass
class ModelLayers:
    """A model's cache layers in registration order, and the model-wide numbers vLLM's
    platform uses to align a hybrid's block size (`num_kv_heads` per rank, `head_size`)."""

    layers: list[Layer]
    num_kv_heads: int = 1
    head_size: int = 0
    use_mla: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def is_hybrid(self) -> bool:
        """Attention and Mamba layers together (vLLM's `ModelConfig.is_hybrid`)."""
        kinds = {type(layer) for layer in self.layers}
        return MambaLayer in kinds and bool(kinds & {AttentionLayer, MLALayer})


def resolve_family(architecture: str):
    """The family module for an architecture; a one-line ValueError when there is none."""
    family = ARCHITECTURES.get(architecture)
    if family is None:
        raise ValueError(
            f"refimpl cannot plan architecture {architecture!r}: no cache-layer rules for it "
            f"(supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    return importlib.import_module(f"refimpl.models.{family}")
