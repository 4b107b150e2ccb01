"""The ratio-4 compressor's fold on plain series tensors, the way refimpl's layer computes it:
chapter 08a's reference for the reader's `your_fold`, and the fold its later cells use.

refimpl's layer (`refimpl.v4.attention`) never holds the series apart: each token writes one
state row `[kv_a | kv_b | score_a | score_b]`, and the token that closes window j reads the
last 8 rows back. `compressor_fold` lays series tensors out as those rows, cuts the windows
with the layer's own `compress_windows` and pools them with a softmax per number.
"""

from __future__ import annotations

import torch

from refimpl.v4.attention import compress_windows

RATIO = 4  # the overlapping fold is the ratio-4 (CSA) compressor's


def compressor_fold(
    kv_a: torch.Tensor, kv_b: torch.Tensor, score_a: torch.Tensor, score_b: torch.Tensor
) -> torch.Tensor:
    """(entries, dim): one entry per 4 whole tokens. Entry j pools series a of tokens
    4j-4..4j-1 and series b of tokens 4j..4j+3 (entry 0: series b alone), softmax-weighted
    number by number. Each argument is (tokens, dim); a last partial window makes no entry."""
    shapes = {tuple(t.shape) for t in (kv_a, kv_b, score_a, score_b)}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"the four series must be (tokens, dim) of one shape, got {shapes}")
    tokens, dim = kv_a.shape
    n = tokens // RATIO
    rows = torch.cat([kv_a, kv_b, score_a, score_b], dim=1)[: n * RATIO]
    padded = torch.cat([torch.zeros(RATIO, 4 * dim, dtype=rows.dtype), rows])
    windows = torch.stack([padded[RATIO * j : RATIO * (j + 2)] for j in range(n)])
    kv, score = compress_windows(windows, RATIO, dim, have_previous=torch.arange(n) > 0)
    return (score.softmax(dim=1) * kv).sum(dim=1)
