"""Per-step attention metadata, shared by every attention layer of one forward pass.

The model runner fills a `Context` before the forward pass (`set_context`) and clears it after
(`reset_context`); each attention layer reads it with `get_context`. This is nano-vllm's
design: the model's `forward(input_ids, positions)` stays as simple as a plain transformer's,
while the paging details travel beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Context:
    """What the attention layers need to find K/V slots and pages for this step.

    Prefill (sequences packed one after another, "varlen"):
      cu_seqlens_q  [batch+1] int32: where each sequence's new tokens start in the packed
      batch. cu_seqlens_k  [batch+1] int32: the same over whole contexts (cached prefix + new
      tokens). max_seqlen_q / max_seqlen_k: the longest of each (kernels size their loops with
      them).
    Decode (one new token per sequence):
      context_lens  [batch] int32: tokens of context including the new one.
    Both:
      slot_mapping  [num_tokens] int32: the cache slot (block_id * block_size + offset) where
      each
        new token's K/V is written.
      block_tables  [batch, max_blocks] int32: each sequence's block table, padded with -1.
    """

    is_prefill: bool = False
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    slot_mapping: torch.Tensor | None = None
    context_lens: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None
    # The step's arguments are known good: checked by the model runner on the lists they came
    # from, or by the first attention layer of the step (backends with `check_once_per_step`).
    checked: bool = False


_CONTEXT = Context()


def get_context() -> Context:
    return _CONTEXT


def set_context(context: Context) -> None:
    global _CONTEXT
    _CONTEXT = context


def reset_context() -> None:
    global _CONTEXT
    _CONTEXT = Context()
