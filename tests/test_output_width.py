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


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
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
