"""Turn prompts into checked token ids: the request checks both engines (Part I and Part III)
share.

Both reject bad input the same way, before anything is queued: a prompt must be a string (with
a tokenizer) or a list of ints, non-empty, inside the vocabulary, and short enough that the
prompt plus `max_tokens` fits `max_model_len`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from refimpl.paged.sequence import SamplingParams


def prompt_token_ids(
    prompt: str | list[int], tokenizer: Any | None, model: object
) -> list[int]:
    """The prompt's token ids: strings through `tokenizer` (ValueError naming `model` if it has
    none)."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError(f"{model} has no tokenizer; pass prompts as lists of token ids")
        return tokenizer.encode(prompt, add_special_tokens=False)
    if not isinstance(prompt, (list, tuple)) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        raise ValueError(
            f"a prompt must be a string or a list of token ids (ints), got {prompt!r:.80}"
        )
    return list(prompt)


def checked_request_tokens(
    prompt: str | list[int],
    sampling_params: SamplingParams,
    tokenizer: Any | None,
    model: object,
    vocab_size: int,
    max_model_len: int,
) -> list[int]:
    """`prompt_token_ids` plus the checks on the ids and on the request's longest length."""
    if not isinstance(sampling_params, SamplingParams):
        raise ValueError(
            f"sampling_params must be a SamplingParams, got {type(sampling_params).__name__}"
        )
    token_ids = prompt_token_ids(prompt, tokenizer, model)
    if not token_ids:
        raise ValueError("a prompt must have at least one token, got an empty prompt")
    bad = [t for t in token_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    longest = len(token_ids) + sampling_params.max_tokens
    if longest > max_model_len:
        raise ValueError(
            f"prompt of {len(token_ids)} tokens + max_tokens={sampling_params.max_tokens} "
            "exceeds "
            f"max_model_len={max_model_len}"
        )
    return token_ids


def pair_prompts_with_params(
    prompts: Sequence[str | list[int]],
    sampling_params: SamplingParams | Sequence[SamplingParams] | None,
) -> tuple[list[str | list[int]], list[SamplingParams]]:
    """`generate`'s arguments as two equal-length lists: one SamplingParams (or None, the
    default) applies to every prompt; a single prompt passed bare is refused rather than read
    token by token."""
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
        raise ValueError(
            "prompts must be a list of prompts (strings or token-id lists), not a single "
            "prompt"
        )
    prompts = list(prompts)
    if sampling_params is None:
        sampling_params = SamplingParams()
    if isinstance(sampling_params, SamplingParams):
        sampling_params = [sampling_params] * len(prompts)
    sampling_params = list(sampling_params)
    if len(sampling_params) != len(prompts):
        raise ValueError(
            f"got {len(sampling_params)} SamplingParams for {len(prompts)} prompts"
        )
    return prompts, sampling_params
