"""Notebook 07's pictures and their text twins (refimpl.viz.kernels)."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.figure import Figure

from refimpl.course.paged_scenarios import reusable_prefix_tokens
from refimpl.viz import kernels as kviz


def test_paged_layout_slots_and_text():
    cells, slots = kviz.paged_layout([[5, 2, 7], [1, 3]], [10, 6], 4, 8)
    assert slots == [[20, 21, 22, 23, 8, 9, 10, 11, 28, 29], [4, 5, 6, 7, 12, 13]]
    assert cells[7][:3] == [(0, 8), (0, 9), None] and cells[0] == [None] * 4
    text = kviz.paged_layout_text([[5, 2, 7], [1, 3]], [10, 6], 4, 8)
    assert "seq 1: block_table [1, 3] -> slots [4, 5, 6, 7, 12, 13]" in text
    assert "block  3: s1:t4  s1:t5    .     ." in text.splitlines()
    assert isinstance(kviz.draw_paged_layout([[5, 2, 7], [1, 3]], [10, 6], 4, 8), Figure)


@pytest.mark.parametrize(
    "tables,lens",
    [([[0]], [5]), ([[9]], [1]), ([[0], [1]], [1])],
    ids=["too-few-blocks", "bad-id", "count"],
)
def test_paged_layout_rejects_inconsistent_tables(tables, lens):
    with pytest.raises(ValueError):
        kviz.paged_layout(tables, lens, 4, 8)


def test_prefill_mask_aligns_queries_with_the_end_of_the_context():
    mask = kviz.prefill_mask(3, 10)
    assert mask.shape == (3, 10)
    # query j at position 7 + j sees keys 0..7+j
    assert mask.sum(axis=1).tolist() == [8, 9, 10]
    assert np.array_equal(kviz.prefill_mask(4, 4), np.tril(np.ones((4, 4), dtype=bool)))
    text = kviz.prefill_mask_text(3, 10)
    assert text.splitlines()[1] == "query 0 (position  7): #######|#.."
    assert isinstance(kviz.draw_prefill_mask(3, 10), Figure)
    with pytest.raises(ValueError, match="q_len <= k_len"):
        kviz.prefill_mask(5, 4)


def test_reuse_by_block_size_is_measured_and_matches_the_formula():
    prefixes, suffix = [100, 600, 2000], 40
    table = kviz.reuse_by_block_size(prefixes, suffix, [16, 256])
    assert table == [[96, 0], [592, 512], [2000, 1792]]
    for p, row in zip(prefixes, table):
        assert row == [reusable_prefix_tokens(p, p + suffix, bs) for bs in (16, 256)]
    text = kviz.reuse_by_block_size_text(prefixes, suffix, [16, 256])
    assert text.splitlines()[-1].split() == ["total", "2688", "2304", "of", "2700", "shared"]
    assert isinstance(kviz.draw_reuse_by_block_size(prefixes, suffix, [16, 256]), Figure)
