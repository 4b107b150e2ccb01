"""Colours and sizes every figure shares, so a sequence or an empty cell looks the same in
every chapter.

Figures with their own meaning for colour (cache kinds, groups, match outcomes) keep those
palettes next to the drawing code; this module holds only what several modules draw.
"""

#: One colour per sequence or request, in order. No green and no red: those mark hits and
# misses.
SEQ_COLORS = [
    "#4c72b0",
    "#dd8452",
    "#8172b3",
    "#937860",
    "#da8bc3",
    "#8c8c8c",
    "#ccb974",
    "#64b5cd",
]
#: An empty cell: an unused slot, or a free block that holds nothing.
EMPTY = "#eeeeee"

#: The widest figure, in inches at matplotlib's default 100 dpi. On a 1366x768 laptop with
# JupyterLab's file browser open an output is 807 px wide, and JupyterLab scales a wider
# picture down to fit, every label with it; a figure no wider keeps its 8-pt labels at 8 pt.
# The notebook trims the figure to what is drawn and pads it by 0.1 in each side (bbox
# "tight"), so a figure drawn edge to edge shows 0.2 in wider: 7.85 in shows as 805 px. A
# legend or label outside the axes counts too: figure functions keep those inside this width.
MAX_WIDTH = 7.85

#: Cache groups of DeepSeek V4 by label; other groups take `FALLBACK_COLORS` in turn.
GROUP_COLORS = {
    "MLA": "#1f77b4",
    "SWA-a": "#2ca02c",
    "SWA-b": "#98df8a",
    "C128 state": "#c5b0d5",
    "C4 state": "#9467bd",
}
#: The null block (block 0), and cells outside a selection.
NULL_COLOR = "#d9d9d9"
FALLBACK_COLORS = ["#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]


def group_color(label: str, i: int) -> str:
    """The colour of cache group `label` (the i-th group drawn): its own, else a fallback."""
    return GROUP_COLORS.get(label, FALLBACK_COLORS[i % len(FALLBACK_COLORS)])


def fits(text: str, width_pt: float, fontsize: float = 8) -> bool:
    """Whether `text` fits in `width_pt` points at `fontsize` (digits and letters are about 0.6
    em wide)."""
    return len(text) * 0.62 * fontsize + 2 <= width_pt
