"""A figure measured as a reader sees it in a notebook: its displayed width, and its smallest
text in points (the PNG holds twice as many pixels each way, for HiDPI screens).

refimpl's figures are shown by matplotlib_inline's formatter, which renders a Figure at its own
dpi with `bbox_inches="tight"` (so legends and labels outside the axes widen the picture). On a
1366x768 laptop with JupyterLab's file browser open an output is 807 px wide (tests/screen.py);
JupyterLab scales a wider picture down to fit (`.jp-RenderedImage img {max-width: 100%}`),
shrinking every text with it. A text of `s` points drawn at `dpi` shows at
`s * dpi / 100 * scale` points of a figure drawn at matplotlib's default 100 dpi and shown at
full size, which is what "8 pt" means in the course's figure rules.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from matplotlib.backends.backend_agg import RendererAgg

from tests.screen import OUTPUT_PX

#: How wide a JupyterLab notebook column shows a picture at full size (px) on the laptop
# screen the course is read on.
COLUMN_PX = OUTPUT_PX
#: The dpi at which a font's nominal size is the size a reader sees (matplotlib's default
# figure.dpi).
REFERENCE_DPI = 100


@dataclass(frozen=True)
class ShownFigure:
    width: int  # PNG width in pixels, as the notebook embeds it
    height: int
    # (points at the shown size, text) of every text drawn
    texts: tuple[tuple[float, str], ...]

    @property
    def smallest(self) -> tuple[float, str]:
        return min(self.texts)


@contextmanager
def _recording_text(record: list[tuple[float, str]]):
    original = RendererAgg.draw_text

    def draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if s.strip():
            record.append((prop.get_size_in_points(), s))
        return original(self, gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)

    RendererAgg.draw_text = draw_text
    try:
        yield
    finally:
        RendererAgg.draw_text = original


def shown_png(fig) -> bytes:
    """The PNG the notebook stores for `fig` (refimpl.viz's HiDPI formatter, which renders
    as matplotlib_inline does, at twice the dpi)."""
    return shown_figure(fig)[0]


def shown_figure(fig) -> tuple[bytes, dict[str, int]]:
    """(PNG, displayed {"width", "height"}) as the notebook stores them for `fig`."""
    from refimpl.viz.hidpi import hidpi_png

    return hidpi_png(fig)


def measure(fig) -> ShownFigure:
    """Render `fig` as a notebook shows it (`hidpi_image`: what `hidpi_png` stores, before its
    palette and compression, which change no size) and record every text matplotlib drew, in
    shown points."""
    from refimpl.viz.hidpi import SCALE, hidpi_image

    drawn: list[tuple[float, str]] = []
    with _recording_text(drawn):
        image, shown = hidpi_image(fig)
    width, height = shown["width"], shown["height"]  # displayed size, not the PNG's pixels
    assert image.size[0] // SCALE == width
    scale = fig.dpi / REFERENCE_DPI * min(1.0, COLUMN_PX / width)
    return ShownFigure(
        width, height, tuple(sorted({(round(size * scale, 2), text) for size, text in drawn}))
    )
