"""Write a chapter's figure into the repository's figures/ folder, only when asked.

The README and the docs show PNGs that the chapters draw. A reader's Run All must not rewrite
those tracked files (nor fail where there is no figures/ folder), so `save_figure` writes only
when the environment variable REFIMPL_WRITE_FIGURES is set, as `make figures` does:

    REFIMPL_WRITE_FIGURES=1      the figures/ folder of this checkout (next to the refimpl
    package) REFIMPL_WRITE_FIGURES=DIR    the folder DIR unset, empty or 0            nothing
    is written
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "REFIMPL_WRITE_FIGURES"
#: The checkout's figures/ folder (refimpl is installed editable, so the package sits in the
# checkout).
CHECKOUT_FIGURES = Path(__file__).resolve().parents[2] / "figures"


def figures_dir() -> Path | None:
    """Where `save_figure` writes, or None when figures are not to be written."""
    value = os.environ.get(ENV, "").strip()
    if value in ("", "0"):
        return None
    return CHECKOUT_FIGURES if value == "1" else Path(value)


def save_figure(fig, name: str, *, dpi: int = 100, **savefig_kwargs) -> Path | None:
    """Save `fig` as figures/`name` (a file name such as "03_block_manager.png") when
    REFIMPL_WRITE_FIGURES asks for it; return the path written, or None when nothing was
    written."""
    if not isinstance(name, str) or not name or Path(name).name != name:
        raise ValueError(
            f"name must be a plain file name such as '03_block_manager.png', got {name!r}"
        )
    folder = figures_dir()
    if folder is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    fig.savefig(path, dpi=dpi, **savefig_kwargs)
    return path
