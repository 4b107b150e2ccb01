"""Pictures of refimpl's data structures. Every drawing function `draw_X` returns a matplotlib
Figure (built without pyplot, so nothing is shown twice or kept alive) and has a text twin
`X_text` that returns a deterministic string describing the same state. Shared colours live in
`palette`.

`show_source(obj)` shows the live lines a chapter teaches (`source`); `reveal()` hides a
self-check's answer in a closed box until the reader opens it (`reveal`); `Stepper` plays
frames recorded from real calls with a slider and shows them as a static strip (`stepper`);
`save_figure(fig, name)` writes a chapter's figure into figures/ only when `make figures` asks
for it (`save`). Drawing modules: `paged` (block pool, prefix lookup, fragmentation),
`paged_stepper` (block manager and prefix cache frames), `timeline` (scheduler steps),
`scheduler_stepper`, `engine` (one engine step's slots and block tables), `kernels` (pages,
prefill mask, reuse), `softmax_stepper` (the decode kernel's online softmax tile by tile),
`split_kv` (decode programs on SMs, the split-KV merge, recorded GPU timings), `hybrid_layout`
(DeepSeek V4 layer, pages, grouping, slab, one layer's view), `v4_layer` (08a/08b: the
compressor's two series, the indexer's picks, an fp8_ds_mla page), `allocator` and
`hybrid_stepper` (the hybrid pool over time), `v4_engine` (Part III's slots and steps),
`course_map` (the chapter list, the map of which chapter needs which, the glossary).
"""

from __future__ import annotations


def _show_figures_inline() -> None:
    """Make a Figure returned by a notebook cell render as a picture.

    IPython registers its PNG formatter for Figures only when pyplot activates the inline
    backend; refimpl's drawing functions never touch pyplot, so register it here, once, with
    the HiDPI picture of `refimpl.viz.hidpi`.
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
    from refimpl.viz.hidpi import register

    register(shell)  # drawn at twice the displayed size: crisp on HiDPI screens


_show_figures_inline()

from refimpl.viz.reveal import reveal  # noqa: E402
from refimpl.viz.save import save_figure  # noqa: E402
from refimpl.viz.source import SourceView, show_source  # noqa: E402  (after the inline set-up)
from refimpl.viz.stepper import Frame, Stepper, record_frames  # noqa: E402

__all__ = [
    "Frame",
    "SourceView",
    "Stepper",
    "record_frames",
    "reveal",
    "save_figure",
    "show_source",
]
