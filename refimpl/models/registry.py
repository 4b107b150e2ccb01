"""Which family module plans which architecture (vLLM's `ModelRegistry`, cache only).

Most architectures need no module of their own: `generic.py` reads everything the cache
depends on from the config's fields (GENERIC lists them). A family with a quirk that its
fields do not say has a small module (Cohere2's window + 1, Falcon's multi-query flag, Mamba
hybrids). Every architecture listed here was checked against vLLM 0.32 itself: DeepSeek V4 by
its own comparison, the others by the registry sweep (`tools/crosscheck/registry_sweep.py`,
replayed by tests/test_models_registry_oracle.py). MISSING_RULES names what refimpl lacks
for the architectures vLLM builds and refimpl does not plan; docs/model-coverage.md lists
all 240 registry entries.
"""

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
    "qwen3_next": (
        "Qwen3NextForCausalLM",
        "Qwen3_5ForCausalLM",
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "MiniCPMV4_6ForConditionalGeneration",
        "MiniCPMV4_7ForConditionalGeneration",
    ),
    "cohere2": (
        "Cohere2ForCausalLM",
        "Cohere2MoeForCausalLM",
        "Cohere2VisionForConditionalGeneration",
    ),
    "falcon": ("FalconForCausalLM",),
    "minicpm3": ("MiniCPM3ForCausalLM",),
    "gemma4": ("Gemma4ForCausalLM",),
    "chatglm": ("ChatGLMModel", "ChatGLMForConditionalGeneration"),
    "longcat": ("LongcatFlashForCausalLM",),
    "iquest": ("IQuestLoopCoderForCausalLM",),
    "hrm": ("HrmTextForCausalLM",),
    "llama4": ("Llama4ForCausalLM", "Llama4ForConditionalGeneration"),
    "lfm2": ("Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Lfm2VlForConditionalGeneration"),
    "mamba": (
        "MambaForCausalLM",
        "FalconMambaForCausalLM",
        "Mamba2ForCausalLM",
        "JambaForCausalLM",
        "FalconH1ForCausalLM",
        "Zamba2ForCausalLM",
    ),
}
#: architectures whose vLLM model file follows the common pattern: one attention (or MLA)
#: layer per decoder layer, heads, head size and windows from the config's fields
GENERIC = GENERIC = (
    "AXK1ForCausalLM",
    "AriaForConditionalGeneration",
    "AudioFlamingo3ForConditionalGeneration",
    "BagelForConditionalGeneration",
    "Blip2ForConditionalGeneration",
    "CohereForCausalLM",
    "DeepseekForCausalLM",
    "Ernie4_5ForCausalLM",
    "Ernie4_5_MoeForCausalLM",
    "Exaone4ForCausalLM",
    "Exaone4_5_ForConditionalGeneration",
    "ExaoneMoEForCausalLM",
    "ExaoneMoeForCausalLM",
    "GPT2LMHeadModel",
    "GPTJForCausalLM",
    "GemmaForCausalLM",
    "Glm4ForCausalLM",
    "Glm4MoeForCausalLM",
    "Glm4MoeLiteForCausalLM",
    "Glm4vForConditionalGeneration",
    "Glm4vMoeForConditionalGeneration",
    "GlmAsrForConditionalGeneration",
    "GlmOcrForConditionalGeneration",
    "GraniteForCausalLM",
    "GraniteMoeForCausalLM",
    "GraniteMoeSWAForCausalLM",
    "GraniteMoeSharedForCausalLM",
    "GraniteSWAForCausalLM",
    "GraniteSpeechForConditionalGeneration",
    "GraniteSpeechPlusForConditionalGeneration",
    "HCXVisionV2ForCausalLM",
    "HYV4ForCausalLM",
    "HyperCLOVAXForCausalLM",
    "IQuestCoderForCausalLM",
    "Idefics3ForConditionalGeneration",
    "InternLM2ForCausalLM",
    "InternLM3ForCausalLM",
    "InternVLForConditionalGeneration",
    "KimiVLForConditionalGeneration",
    "LLaMAForCausalLM",
    "LagunaForCausalLM",
    "LlavaForConditionalGeneration",
    "LlavaNextForConditionalGeneration",
    "LlavaNextVideoForConditionalGeneration",
    "LlavaOnevisionForConditionalGeneration",
    "MiMoForCausalLM",
    "MiniMaxM2ForCausalLM",
    "Ministral3ForCausalLM",
    "Mistral3ForConditionalGeneration",
    "MixtralForCausalLM",
    "MoonshotKimiaForCausalLM",
    "MossTranscribeDiarizeForConditionalGeneration",
    "MuseGlimmerForCausalLM",
    "MuseGlimmerForConditionalGeneration",
    "NemotronForCausalLM",
    "OPTForCausalLM",
    "OlmoeForCausalLM",
    "OrionForCausalLM",
    "PaddleOCRVLForConditionalGeneration",
    "PaliGemmaForConditionalGeneration",
    "PanguEmbeddedForCausalLM",
    "Phi3ForCausalLM",
    "PhiMoEForCausalLM",
    "QianfanOCRForConditionalGeneration",
    "Qwen2AudioForConditionalGeneration",
    "Qwen2MoeForCausalLM",
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5OmniForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen3ASRForConditionalGeneration",
    "Qwen3MoeForCausalLM",
    "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration",
    "SmolVLMForConditionalGeneration",
    "SolarForCausalLM",
    "StableLmForCausalLM",
    "TeleChat3ForCausalLM",
)
_FAMILIES["generic"] = GENERIC
ARCHITECTURES = {arch: family for family, archs in _FAMILIES.items() for arch in archs}
#: architectures vLLM plans that refimpl refuses, with the rule it would need
MISSING_RULES = {
    "WhisperForConditionalGeneration": (
        "encoder-decoder cross-attention (CrossAttentionSpec, sized by the encoder's "
        "length): refimpl plans decoder-only caches"
    ),
}


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
    if architecture in MISSING_RULES:
        raise ValueError(
            f"refimpl cannot plan architecture {architecture!r}: missing rule: "
            f"{MISSING_RULES[architecture]}"
        )
    if family is None:
        raise ValueError(
            f"refimpl cannot plan architecture {architecture!r}: no cache-layer rule for it "
            f"({len(ARCHITECTURES)} architectures are planned; see docs/model-coverage.md)"
        )
    return importlib.import_module(f"refimpl.models.{family}")
