"""The transformers oracle: greedy generation one unpadded prompt at a time, stable top-k.

transformers' DeepSeek V4 is only correct with eager attention and no padding (its compressor
ignores the attention mask), so the reference runs each prompt alone. It runs under
`stable_topk_in_transformers` so both sides break indexer ties the same way.
"""

from __future__ import annotations

import torch

from refimpl.v4.topk import stable_topk_in_transformers


@torch.no_grad()
def reference_generate(hf_model, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy completion ids and the logits (vocab,) that chose each of them."""
    with stable_topk_in_transformers():
        out = hf_model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
            output_logits=True, return_dict_in_generate=True, eos_token_id=None,
            # a pad id that occurs in the prompt would silently mask those tokens: use one that cannot
            pad_token_id=hf_model.config.vocab_size - 1 if hf_model.config.pad_token_id is None else hf_model.config.pad_token_id,
        )
    tokens = out.sequences[0, len(prompt_ids):].tolist()
    return tokens, [step[0] for step in out.logits]


@torch.no_grad()
def reference_prefill(hf_model, prompt_ids: list[int]):
    """One cached forward over the whole prompt; returns (logits (S, vocab), the DynamicCache)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=hf_model.config)
    with stable_topk_in_transformers():
        out = hf_model(torch.tensor([prompt_ids]), cache=cache, use_cache=True)
    return out.logits[0], cache
