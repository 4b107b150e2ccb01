"""Figures drawn at twice their displayed size, so they stay crisp on HiDPI screens.

A notebook embeds each figure as a PNG with its displayed width and height in the output's
metadata; JupyterLab (and GitHub) show it at that size, so a screen with two device pixels per
CSS pixel uses every pixel of the picture instead of scaling a 100-dpi one up. To keep the
committed notebooks light, the picture is stored with a palette of at most 256 colours: the
figures are flat colours, lines and anti-aliased text, which such a palette holds without
visible loss, and a palette PNG takes a fraction of the bytes of a full-colour one.
"""

from __future__ import annotations

import io

#: Device pixels per displayed pixel.
SCALE = 2
#: Colours kept in the stored PNG.
COLOURS = 256


def hidpi_png(fig) -> tuple[bytes, dict[str, int]]:
    """(PNG bytes, {"width", "height"} in displayed pixels) for a matplotlib Figure, rendered
    as the notebook's inline backend renders it (trimmed to what is drawn) at `SCALE` times
    the figure's dpi."""
    from PIL import Image

    image, shown = hidpi_image(fig)
    palette = image.quantize(
        colors=COLOURS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
    )
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True)
    return out.getvalue(), shown


def hidpi_image(fig):
    """(the rendered PIL image, {"width", "height"} in displayed pixels): what `hidpi_png`
    stores, before its palette and compression."""
    from IPython.core.pylabtools import print_figure
    from matplotlib_inline.config import InlineBackend
    from PIL import Image

    kwargs = {**InlineBackend().print_figure_kwargs, "dpi": fig.dpi * SCALE}
    image = Image.open(io.BytesIO(print_figure(fig, "png", **kwargs))).convert("RGB")
    width, height = image.size
    return image, {"width": width // SCALE, "height": height // SCALE}


def register(shell) -> None:
    """Make `shell` (an IPython shell) show every matplotlib Figure with `hidpi_png`."""
    from matplotlib.figure import Figure

    shell.display_formatter.formatters["image/png"].for_type(Figure, hidpi_png)
