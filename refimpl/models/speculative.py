"""`--speculative-config`: what speculative decoding adds to the KV cache plan (vLLM 0.32).

A drafter that is a model of its own keeps a KV cache of its own, planned with the target's:
its attention layers register after the target's and join the same groups. vLLM names them
as its drafter classes do: an EAGLE / EAGLE-3 head continues the target's layer numbering
(`model.layers.{target layers + i}.self_attn.attn`, vLLM's `start_layer_id`), a separate
draft model keeps its own under the prefix `draft_model.`. MTP layers come from the target's
own checkpoint (its family lists them). The number of speculative tokens reaches the plan in
two places: a Mamba layer keeps one more state per speculative token
(`MambaSpec.num_speculative_blocks`), and a multi-module MTP chain keeps
`num_speculative_tokens - 1` more tokens below every sliding window
(`SlidingWindowSpec.extra_retained_tokens`, from `VllmConfig.num_prefill_lookahead_tokens`).
The scheduler's lookahead (`num_lookahead_tokens`) reserves slots per step at run time and
does not change the block count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from refimpl.models.config import HFConfig

#: Methods refimpl plans, as vLLM spells them.
METHODS = ("mtp", "eagle", "eagle3", "draft_model")
#: Methods whose drafter reads the target's hidden states (vLLM's `use_eagle`): their group
#: drops its last cached block on a prefix hit.
EAGLE_METHODS = ("eagle", "eagle3", "mtp")
#: Mamba kinds whose convolution state keeps the speculative tokens' rows too (vLLM's
#: Mamba2, gated delta net, short conv and KDA state shapes take `num_spec`; Mamba1's not).
SPECULATIVE_CONV_TYPES = ("mamba2", "gdn_attn", "short_conv", "kda")
#: Architectures of EAGLE heads vLLM builds as Llama decoder layers (llama_eagle*.py).
LLAMA_HEAD_TYPES = ("llama",)


@dataclass(frozen=True)
class SpeculativeConfig:
    """The speculative settings the plan depends on, resolved as vLLM's `SpeculativeConfig`
    does: the method (named, or told from the draft's path), the draft config and the number
    of speculative tokens."""

    method: str
    num_speculative_tokens: int
    draft: HFConfig | None = None  # the drafter's config (None for MTP: the target's own)
    num_mtp_layers: int = 0

    @property
    def use_eagle(self) -> bool:
        return self.method in EAGLE_METHODS

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots the scheduler reserves past a request's scheduled tokens each step."""
        return self.num_speculative_tokens

    @property
    def num_prefill_lookahead_tokens(self) -> int:
        """Prompt tokens past the computed range the drafter reads: the whole chain for a
        multi-module MTP (more than one MTP layer used), else one for EAGLE-style drafters,
        none for a draft model."""
        if not self.use_eagle:
            return 0
        if self.method == "mtp" and min(self.num_mtp_layers, self.num_speculative_tokens) > 1:
            return self.num_speculative_tokens
        return 1

    @property
    def extra_retained_tokens(self) -> int:
        """Tokens every sliding window keeps below itself for re-prefilling the chain."""
        return max(0, self.num_prefill_lookahead_tokens - 1)


def with_speculative_conv_rows(layers: list, num_speculative_tokens: int) -> list:
    """The layers with each convolution state (a Mamba layer's first state, its rows the
    kernel's width - 1) grown by one row per speculative token, as vLLM sizes it when it
    verifies drafts: the state then holds the drafted tokens' inputs as well."""
    from dataclasses import replace

    from refimpl.models.layers import MambaLayer

    out = []
    for layer in layers:
        if isinstance(layer, MambaLayer) and layer.mamba_type in SPECULATIVE_CONV_TYPES:
            rows, *rest = layer.shapes[0]
            conv = (rows + num_speculative_tokens, *rest)
            layer = replace(layer, shapes=(conv, *layer.shapes[1:]))
        out.append(layer)
    return out


def resolve_speculative_config(spec: Any, target: HFConfig) -> SpeculativeConfig:
    """vLLM's reading of `--speculative-config` for the methods refimpl plans; a one-line
    ValueError for anything else."""
    if not isinstance(spec, dict):
        raise ValueError(f"speculative_config must be a JSON object, got {spec!r}")
    method, model = spec.get("method"), spec.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"speculative_config model must be a config path, got {model!r}")
    if method is None:  # vLLM: a model without a method is a draft model, told by its name
        method = "draft_model" if model is not None else None
        if model is not None and "eagle-" in model.lower():
            method = "eagle"
        elif model is not None and "eagle3" in model.lower():
            method = "eagle3"
    if method not in METHODS:
        raise ValueError(
            f"speculative_config method {method!r} is not planned; planned: "
            f"{', '.join(METHODS)}"
        )
    n = spec.get("num_speculative_tokens", 1 if method == "mtp" else None)
    if n is None:
        raise ValueError(
            "speculative_config gives a draft model but no num_speculative_tokens "
            "(vLLM requires it)"
        )
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"num_speculative_tokens must be a whole number >= 1, got {n!r}")
    if method == "mtp":
        num_mtp = int(target.get("num_nextn_predict_layers") or 0)
        if not num_mtp:
            raise ValueError(
                f"{target.source} has no MTP layers (num_nextn_predict_layers) for "
                "--speculative-config method mtp"
            )
        return SpeculativeConfig(method, n, None, num_mtp)
    if model is None:
        raise ValueError(
            f"speculative_config method {method} needs model: the drafter's config.json "
            "path (or its directory)"
        )
    draft = HFConfig.load(model)
    if method in ("eagle", "eagle3") and draft.model_type not in LLAMA_HEAD_TYPES:
        raise ValueError(
            f"an {method} head of model_type {draft.model_type!r} is not planned; planned: "
            "Llama-style heads (model_type llama)"
        )
    return SpeculativeConfig(method, n, draft)


def draft_layer_name(method: str, target_layers: int, name: str) -> str:
    """The name vLLM registers a drafter's cache layer under: an EAGLE head's layer i is
    the target's layer `target_layers + i`; a draft model's layers keep their own numbers
    under `draft_model.`."""
    if method == "draft_model":
        return f"draft_model.{name}"
    found = re.search(r"\blayers\.(\d+)\.", name)
    if found is None:
        raise ValueError(f"cannot tell which decoder layer the drafter's {name!r} is")
    index = int(found.group(1)) + target_layers
    return f"{name[: found.start(1)]}{index}{name[found.end(1) :]}"


def eagle_head_config(draft: HFConfig) -> HFConfig:
    """An EAGLE head's config as vLLM builds it: Llama decoder layers (its EAGLEConfig
    renames the architecture to its Eagle class, whose layers are `LlamaDecoderLayer`s)."""
    raw = {**draft.raw, "architectures": ["LlamaForCausalLM"]}
    return HFConfig(raw, raw.get("text_config") or raw, draft.source)
