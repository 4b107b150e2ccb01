"""Pictures of refimpl's data structures. Every drawing function `draw_X` returns a matplotlib
Figure (built without pyplot, so nothing is shown twice or kept alive) and has a text twin
`X_text` that returns a deterministic string describing the same state. Shared colours live in
`palette`.

`show_source(obj)` shows the live lines a chapter teaches; `Stepper` plays recorded frames with a
slider and shows them as a static strip. Modules: `paged` (block pool, prefix match, fragmentation), `timeline` (scheduler steps),
`engine` (one engine step's slots and block tables), `kernels` (pages, prefill mask, reuse),
`hybrid_layout` (DeepSeek V4 pages, grouping, slab), `allocator` (hybrid pool over time),
`course_map` (the chapter list, the map of which chapter needs which, the glossary).
"""

from __future__ import annotations


def _show_figures_inline() -> None:
    """Make a Figure returned by a notebook cell render as a picture.

    IPython registers its PNG formatter for Figures only when pyplot activates the inline
    backend; refimpl's drawing functions never touch pyplot, so register it here, once.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return
    try:
        from matplotlib_inline.backend_inline import configure_inline_support
    except ImportError:
        return
    configure_inline_support(shell, "inline")


_show_figures_inline()

from refimpl.viz.source import SourceView, show_source  # noqa: E402  (after the inline set-up)
from refimpl.viz.stepper import Frame, Stepper, record_frames  # noqa: E402

__all__ = ["Frame", "SourceView", "Stepper", "record_frames", "show_source"]
