"""Chapter 08a/08b pictures: exact text twins, and figures that read at a notebook's width."""

from __future__ import annotations

import matplotlib
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from refimpl.v4.topk import stable_topk
from refimpl.viz.hybrid_layout import draw_position_strip, draw_v4_layer
from refimpl.viz.palette import MAX_WIDTH
from refimpl.viz.v4_layer import (
    draw_fp8_ds_mla_page,
    draw_indexer_picks,
    draw_overlapping_windows,
    fp8_ds_mla_page_text,
    indexer_picks_text,
    overlapping_windows_text,
)

matplotlib.use("Agg")


def window_weights() -> torch.Tensor:
    """Entry 0 without a previous window (-inf scores), entry 1 over 8 rows."""
    scores = torch.tensor(
        [[-float("inf")] * 4 + [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]]
    )
    return scores.softmax(dim=1)


def toy_scores() -> tuple[torch.Tensor, torch.Tensor]:
    """12 queries, 3 entries; entry s visible from position 4s + 3; top-2 with -1 for
    missing."""
    positions = torch.arange(12)
    scores = torch.tensor([[0.5, 2.0, 1.0]]).expand(12, 3).clone()
    visible = (positions + 1) // 4
    scores = scores.masked_fill(torch.arange(3)[None] >= visible[:, None], float("-inf"))
    top = stable_topk(scores, 2)
    return scores, torch.where(top >= visible[:, None], -1, top)


def check_readable(fig) -> None:
    """No wider than refimpl.viz.palette.MAX_WIDTH (what a notebook column shows at full
    size), every text at 8 pt or more, nothing outside the figure."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    assert fig.get_size_inches()[0] <= MAX_WIDTH
    texts = [t for t in fig.findobj(Text) if t.get_text() and t.get_visible()]
    assert texts
    assert min(t.get_fontsize() for t in texts) >= 8, sorted({t.get_fontsize() for t in texts})
    for t in texts:
        box = t.get_window_extent(renderer)
        assert box.x0 >= -1 and box.x1 <= fig.bbox.width + 1, t.get_text()


def test_overlapping_windows_text_shows_both_series_and_the_waiting_rows():
    lines = overlapping_windows_text(window_weights()).splitlines()
    assert lines[0].split() == ["token", "0", "1", "2", "3", "4", "5", "6", "7"]
    # entry 0: series b of tokens 0..3
    assert lines[1].split()[2:] == ["b", "0.25"] * 4 + ["-"] * 4
    weights_1 = torch.tensor([1.0] * 4 + [torch.e] * 4) / (4 + 4 * torch.e)
    expected = [f"a {w:.2f}".split() for w in weights_1[:4].tolist()] + [
        f"b {w:.2f}".split() for w in weights_1[4:].tolist()
    ]
    assert lines[2].split()[2:] == [part for cell in expected for part in cell]
    # series a of tokens 4..7 waits for entry 2
    assert lines[3].split()[3:] == ["-"] * 4 + ["a", "wait"] * 4
    with pytest.raises(ValueError, match="weights must be a 2-d tensor"):
        overlapping_windows_text(torch.zeros(2, 7))


def test_indexer_picks_text_marks_picks_visible_and_future_entries():
    scores, picks = toy_scores()
    lines = indexer_picks_text(scores, picks).splitlines()
    assert lines[0] == "query position " + "".join(f"{p:>3}" for p in range(12))
    # lowest score: dropped at 11
    assert lines[1] == "entry 0        " + "   " * 3 + "  *" * 8 + "  ."
    assert lines[2] == "entry 1        " + "   " * 7 + "  *" * 5  # visible from position 7
    assert lines[3] == "entry 2        " + "   " * 11 + "  *"  # complete only at position 11
    with pytest.raises(ValueError, match="picks name entry 5"):
        indexer_picks_text(scores, torch.full((12, 2), 5))
    with pytest.raises(ValueError, match="picks must be"):
        indexer_picks_text(scores, torch.zeros(3, 2, dtype=torch.long))


def test_fp8_ds_mla_page_text_lists_regions_or_sums_them():
    assert fp8_ds_mla_page_text(1).splitlines() == [
        "bytes     0..  447  row 0 NoPE (fp8) (448 B)",
        "bytes   448..  575  row 0 RoPE (bf16) (128 B)",
        "bytes   576..  583  row 0 scales (UE8M0) (8 B)",
        "page: 584 bytes",
    ]
    lines = fp8_ds_mla_page_text(64, alignment=576).splitlines()
    assert lines[2] == "scales    64 region(s),    512 bytes, from byte 36,864 to 37,375"
    assert lines[-1] == "page: 37,440 bytes"


@pytest.mark.parametrize(
    "draw",
    [
        lambda: draw_overlapping_windows(window_weights()),
        lambda: draw_indexer_picks(*toy_scores()),
        lambda: draw_indexer_picks(
            torch.randn(32, 8, generator=torch.Generator().manual_seed(0)),
            torch.arange(32 * 4).reshape(32, 4) % 9 - 1,
        ),
        lambda: draw_fp8_ds_mla_page(2, alignment=576),
        lambda: draw_fp8_ds_mla_page(64, alignment=576),
        lambda: draw_v4_layer((4, 128)),
        lambda: draw_position_strip(16),
        lambda: draw_position_strip(40),
    ],
    ids=[
        "windows",
        "indexer",
        "indexer-32",
        "page-2",
        "page-64",
        "v4-layer",
        "strip-16",
        "strip-40",
    ],
)
def test_figures_read_at_notebook_width(draw):
    check_readable(draw())
