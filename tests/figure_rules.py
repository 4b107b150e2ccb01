"""Rules a reader's eye checks in a drawn figure, as functions a test can assert on.

- `offset_texts`: matplotlib's corner offset ("1e6") on an axis: the reader has to multiply
  every tick label by it; a figure should put the unit in the axis label instead.
- `colours_without_legend`: a fill colour drawn in the axes that no legend entry shows.
- `bordered_slivers`: filled boxes so thin where they are shown that their border is all that
  shows (a band of borders reads as a colour of its own, which no legend explains).
"""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.patches import Rectangle


def _drawn(fig):
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def offset_texts(fig) -> list[str]:
    """The offset or multiplier texts matplotlib drew on any axis of `fig` (empty: none)."""
    _drawn(fig)
    return [
        text
        for ax in fig.axes
        for axis in (ax.xaxis, ax.yaxis)
        if axis.get_visible() and (text := axis.get_offset_text().get_text())
    ]


def _legend_colours(fig) -> set[str]:
    legends = [ax.get_legend() for ax in fig.axes] + list(fig.legends)
    return {
        to_hex(handle.get_facecolor())
        for legend in legends
        if legend is not None
        for handle in legend.legend_handles
        if hasattr(handle, "get_facecolor")
    }


def colours_without_legend(fig) -> set[str]:
    """Face colours of the rectangles drawn in the axes that no legend handle shows."""
    shown = _legend_colours(fig)
    drawn = {
        to_hex(patch.get_facecolor())
        for ax in fig.axes
        for patch in ax.patches
        if isinstance(patch, Rectangle) and patch.get_fill() and patch.get_visible()
    }
    return drawn - shown


def bordered_slivers(fig, min_px: float = 2.0) -> list[tuple[float, float]]:
    """(x, width in px) of every bordered rectangle narrower than `min_px` at the figure's own
    dpi (a notebook shows refimpl's figures at that size)."""
    renderer = _drawn(fig)
    found = []
    for ax in fig.axes:
        for patch in ax.patches:
            if isinstance(patch, Rectangle) and patch.get_linewidth() > 0:
                extent = patch.get_window_extent(renderer)
                if extent.width < min_px and patch.get_edgecolor()[3] > 0:
                    found.append((patch.get_x(), extent.width))
    return found
