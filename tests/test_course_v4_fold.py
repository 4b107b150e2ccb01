"""compressor_fold: the ratio-4 fold through the layer's compress_windows."""

from __future__ import annotations

import pytest
import torch

from refimpl.course.v4_fold import compressor_fold


def series(tokens: int, dim: int, seed: int = 0):
    with torch.device("cpu"):
        return torch.randn(4, tokens, dim, generator=torch.Generator().manual_seed(seed))


def test_entry_one_pools_series_a_of_window_zero_and_series_b_of_window_one():
    kv_a, kv_b, score_a, score_b = series(8, 3)
    entries = compressor_fold(kv_a, kv_b, score_a, score_b)
    assert entries.shape == (2, 3)
    kv, score = torch.cat([kv_a[:4], kv_b[4:8]]), torch.cat([score_a[:4], score_b[4:8]])
    assert torch.allclose(entries[1], (score.softmax(dim=0) * kv).sum(dim=0))
    first = (score_b[:4].softmax(dim=0) * kv_b[:4]).sum(dim=0)
    assert torch.allclose(entries[0], first)


def test_a_partial_window_makes_no_entry():
    assert compressor_fold(*series(11, 2)).shape == (2, 2)


def test_series_of_different_shapes_are_a_value_error():
    kv_a, kv_b, score_a, _ = series(8, 2)
    with pytest.raises(ValueError, match="one shape"):
        compressor_fold(kv_a, kv_b, score_a, torch.zeros(8, 3))
