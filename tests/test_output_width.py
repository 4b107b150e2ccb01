"""Every line a chapter prints fits a laptop: no stored output line over 100 characters.

At 1366 x 768 with JupyterLab's file browser open, an output area shows about 102 columns of
monospace text (tests/screen.py); a longer line wraps mid-token ("b|float16", "163|82"). So each
printed line (streams, and the text of every displayed value) stays within OUTPUT_COLUMNS.
Library text twins and `plan` fold their long lists themselves; a chapter that prints a long
list or message folds it too (textwrap, or a helper that prints one item a line).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
OUTPUT_COLUMNS = 100
#: Chapters whose stored outputs still hold long lines until they are re-executed with the
# library's folded text (09, 12, 13, 14) or their own cells fold what they print (06[3], 07[81],
# 07[89], 10[60], 10[65], 10[78], 10[85], 12[33]).
NOT_YET = {
    "06_engine",
    "07_kernels",
    "09_v4_grouping",
    "10_v4_memory_slab",
    "12_hybrid_allocator",
    "13_v4_engine",
    "14_size_your_own_model",
}


def long_lines(notebook: dict) -> list[str]:
    """'cell N: the line' for every printed line over OUTPUT_COLUMNS characters."""
    found = []
    for index, cell in enumerate(notebook["cells"]):
        for output in cell.get("outputs", []):
            texts = [output.get("text", "")] + [output.get("data", {}).get("text/plain", "")]
            for text in texts:
                for line in ("".join(text) if isinstance(text, list) else text).splitlines():
                    if len(line) > OUTPUT_COLUMNS:
                        found.append(f"cell {index}: {len(line)} characters: {line[:60]}...")
    return found


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(
            p,
            marks=pytest.mark.xfail(
                strict=False, reason="stored outputs predate the folded text; re-execute"
            ),
        )
        if p.stem in NOT_YET
        else p
        for p in CHAPTERS
    ],
    ids=lambda p: p.stem,
)
def test_no_printed_line_is_wider_than_a_laptop_shows(path):
    found = long_lines(json.loads(path.read_text(encoding="utf-8")))
    assert not found, "\n".join(found)


def test_the_check_sees_a_long_line():
    wide = {
        "cells": [
            {"outputs": [{"output_type": "stream", "text": ["ok\n", "x" * 101 + "\n"]}]},
            {"outputs": [{"data": {"text/plain": "y" * 100}}]},
        ]
    }
    assert long_lines(wide) == [f"cell 0: 101 characters: {'x' * 60}..."]
