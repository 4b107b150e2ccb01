"""What a reader sees on a 1366x768 laptop screen, JupyterLab 4 with the file browser open.

Numbers from the installed JupyterLab (checked by test_reader_standards.py's
test_the_screen_numbers_are_jupyterlabs): the light theme's code font is 13px DejaVu Sans Mono
on Linux (first installed font of "menlo, consolas, 'DejaVu Sans Mono', monospace"), whose
advance width is 1233/2048 em, so one column is 13 * 1233 / 2048 = 7.83 px. The shell's split
panel gives the left area and the main area the relative sizes 1 : 2.5 (right area closed) of
1366 - 2 * 33 px of side bars, so the notebook gets 1300 * 2.5 / 3.5 = 929 px. From that the
notebook's padding (2 * 10), a scrollbar (15), the cell collapser (8), the prompt (64), the
cell's padding (2 * 5) and the output's left padding (5) leave 807 px for an output: 103
columns of code, or a picture 807 px wide (JupyterLab scales a wider one down to fit). A
Chromium at 1366x768 wrapped chapter 07's store_kvcache listing after column 102 (a reader's
report that asked for the listing test), so 102 is the measured figure for listings.
"""

from __future__ import annotations

SCREEN_WIDTH_PX = 1366
SIDE_BAR_PX = 33  # --jp-private-sidebar-tab-width 32px + 1px border, left and right
LEFT_TO_MAIN = (1, 2.5)  # the shell's hsplitPanel.setRelativeSizes([1, 2.5, 1])
CODE_FONT_PX = 13  # --jp-code-font-size
MONO_ADVANCE_EM = 1233 / 2048  # DejaVu Sans Mono's advance width
NOTEBOOK_CHROME_PX = 2 * 10 + 15 + 8 + 64 + 2 * 5 + 5

#: The notebook panel's width (px): the main area's share of the screen less the side bars.
NOTEBOOK_PX = (SCREEN_WIDTH_PX - 2 * SIDE_BAR_PX) * LEFT_TO_MAIN[1] / sum(LEFT_TO_MAIN)
#: The width (px) an output gets, to the nearest pixel: the widest picture shown at full size.
OUTPUT_PX = round(NOTEBOOK_PX - NOTEBOOK_CHROME_PX)
