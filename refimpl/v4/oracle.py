"""The transformers oracle: greedy generation one unpadded prompt at a time, stable top-k.

transformers' DeepSeek V4 is only correct with eager attention and no padding (its compressor
ignores the attention mask), so the oracle runs each prompt alone. It runs under
`stable_topk_in_transformers` so both sides break indexer ties the same way.
"""

from __future__ import annotations

import contextlib

import torch

from refimpl.v4.topk import stable_topk_in_transformers


def _greedy(hf_model, prompt_ids: list[int], max_new_tokens: int):
    """transformers' greedy `generate` with the logits of every step, never stopping at EOS."""
    config = hf_model.config
    return hf_model.generate(
        torch.tensor([prompt_ids]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        eos_token_id=None,
        # a pad id that occurs in the prompt would silently mask those tokens: use one that
        # cannot
        pad_token_id=config.vocab_size - 1
        if config.pad_token_id is None
        else config.pad_token_id,
    )


@torch.no_grad()
def oracle_generate(
    hf_model, prompt_ids: list[int], max_new_tokens: int
) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy completion ids and the logits (vocab,) that chose each of them."""
    with stable_topk_in_transformers():
        out = _greedy(hf_model, prompt_ids, max_new_tokens)
    tokens = out.sequences[0, len(prompt_ids) :].tolist()
    return tokens, [step[0] for step in out.logits]


@torch.no_grad()
def oracle_prefill(hf_model, prompt_ids: list[int]):
    """One cached forward over the whole prompt; returns (logits (S, vocab), the
    DynamicCache)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=hf_model.config)
    with stable_topk_in_transformers():
        out = hf_model(torch.tensor([prompt_ids]), cache=cache, use_cache=True)
    return out.logits[0], cache


@torch.no_grad()
def cached_vs_recompute(
    hf_model, prompt_ids: list[int], max_new_tokens: int, stable: bool = True
) -> float:
    """Largest logit difference between transformers' cached greedy `generate()` and one full
    forward over the same final sequence: the two should be the same model.

    With `stable=False` transformers' own `torch.topk` breaks the indexer's ties, and with few
    indexer heads (many scores exactly 0.0) the cached steps pick other entries than the
    recompute does; with `stable=True` both use the stable rule and agree to float rounding.
    """
    guard = stable_topk_in_transformers() if stable else contextlib.nullcontext()
    with guard:
        out = _greedy(hf_model, prompt_ids, max_new_tokens)
        full = hf_model(out.sequences).logits[0]
    cached = torch.stack([step[0] for step in out.logits])
    n = len(prompt_ids)
    return (full[n - 1 : n - 1 + max_new_tokens] - cached).abs().max().item()
