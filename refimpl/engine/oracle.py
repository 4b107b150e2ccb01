"""transformers as the oracle: the same checkpoint run by Hugging Face's own Qwen3 code.

Notebooks, tests and the benchmark compare refimpl's engine with these results. transformers
runs one prompt at a time with no padding, so its output is the plain definition of greedy
decoding; refimpl must match it token for token whatever its block size, batching or caching.
"""

from __future__ import annotations

import os

import torch


def load_hf_model(model_dir: str | os.PathLike, dtype: torch.dtype = torch.float32):
    """`AutoModelForCausalLM` in eval mode, loaded without transformers' progress bar."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()
    return model.eval()


@torch.no_grad()
def hf_greedy(model, token_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy continuation of one prompt (stops at EOS like refimpl does)."""
    input_ids = torch.tensor([list(token_ids)], device=model.device)
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
    )
    return out[0, input_ids.shape[1] :].tolist()


@torch.no_grad()
def hf_keys_values(
    model, token_ids: list[int], layer: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V transformers caches for one prompt at one layer, `[tokens, kv_heads,
    head_dim]`.

    These are the rows refimpl's paged cache must hold (after q/k norm and rotary embedding).
    """
    out = model(torch.tensor([list(token_ids)], device=model.device), use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    # [1, kv_heads, tokens, head_dim]
    keys, values = cache.layers[layer].keys, cache.layers[layer].values
    return keys[0].transpose(0, 1), values[0].transpose(0, 1)
