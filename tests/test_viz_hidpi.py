"""Figures are stored at twice their displayed size (crisp on HiDPI screens) and shown at the
size a 100-dpi picture had, in a palette PNG no heavier than the old full-colour one."""

from __future__ import annotations

import io

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.pylabtools import print_figure
from matplotlib.figure import Figure
from PIL import Image

from refimpl.viz import kernels as kviz
from refimpl.viz.hidpi import SCALE, hidpi_png, register


def figure() -> Figure:
    return kviz.draw_paged_layout([[5, 2, 7], [1, 3]], [10, 6], 4, 8)


def test_twice_the_pixels_at_the_old_displayed_size_and_lighter():
    fig = figure()
    png, shown = hidpi_png(fig)
    old = print_figure(fig, "png", bbox_inches="tight")  # what the inline backend stored
    old_size = Image.open(io.BytesIO(old)).size
    image = Image.open(io.BytesIO(png))
    assert image.mode == "P" and len(image.getcolors(256)) <= 256
    # the same displayed size, up to the trimming's rounding at the higher dpi
    assert abs(shown["width"] - old_size[0]) <= 0.01 * old_size[0]
    assert abs(shown["height"] - old_size[1]) <= 0.01 * old_size[1]
    assert (
        image.size[0] // SCALE == shown["width"] and image.size[1] // SCALE == shown["height"]
    )
    assert len(png) < len(old)  # four times the pixels, fewer bytes
    assert hidpi_png(fig)[0] == png  # deterministic: a re-run stores the same bytes


def test_a_shell_shows_figures_with_it():
    shell = InteractiveShell.instance()
    try:
        register(shell)
        data, metadata = shell.display_formatter.format(figure())
        assert metadata["image/png"] == hidpi_png(figure())[1]
        assert Image.open(io.BytesIO(data["image/png"])).size[0] >= 2 * 600
    finally:
        InteractiveShell.clear_instance()


@pytest.mark.parametrize("bad", [None, "figure"])
def test_only_figures(bad):
    with pytest.raises(AttributeError):
        hidpi_png(bad)
