"""A stable top-k: among equal scores the lowest entry index wins.

The Lightning Indexer scores compressed entries with a sum of ReLU'd dot products, so with few
indexer heads many scores are exactly 0.0. `torch.topk` gives no promise about which of several
equal scores it returns, and on CPU its choice changes with the row length: a query scored
against 12 entries (one-shot prefill) can pick a different tied entry than the same query
scored against 16 entries (chunked prefill, or a cached decode step). The attention output then
differs, and so can the next token. One documented rule removes the ambiguity: sort descending
with a stable sort and keep the first k, so ties always go to the lowest index. This engine
uses it, and the transformers oracle is run with the same rule (`stable_topk_in_transformers`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def stable_topk(scores: torch.Tensor, k: int, dim: int = -1) -> torch.Tensor:
    """Indices of the k largest values along `dim`; ties go to the lowest index."""
    order = torch.sort(scores, dim=dim, descending=True, stable=True).indices
    return order.narrow(dim, 0, k)


class _TopkResult(tuple):
    """What `Tensor.topk` returns: (values, indices) with attribute access."""

    @property
    def values(self) -> torch.Tensor:
        return self[0]

    @property
    def indices(self) -> torch.Tensor:
        return self[1]


@contextlib.contextmanager
def stable_topk_in_transformers() -> Iterator[None]:
    """Make `Tensor.topk` stable while the transformers oracle runs.

    transformers' DeepSeek V4 indexer is the only caller of the method form `scores.topk(k)`;
    the MoE routers call the function `torch.topk`, which is left alone.
    """
    original = torch.Tensor.topk

    def topk(
        self: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
    ):  # noqa: A002
        if not largest:
            return original(self, k, dim=dim, largest=largest, sorted=sorted)
        indices = stable_topk(self, k, dim)
        return _TopkResult((self.gather(dim, indices), indices))

    torch.Tensor.topk = topk
    try:
        yield
    finally:
        torch.Tensor.topk = original
