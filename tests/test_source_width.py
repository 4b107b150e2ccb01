"""Every line of the code students read fits a listing on a laptop screen.

ruff's E501 stops at 95 columns but lets through a line it cannot split (one long string, a
comment after code); `show_source` prints such a line with its 5-column gutter, and past 102
columns JupyterLab wraps it mid-word (tests/screen.py). So the packages a reader opens are
held to ruff's limit with no exception.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CODE_COLUMNS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"][
    "line-length"
]
PACKAGES = ("refimpl", "grader")


def long_lines(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [
        f"{path.name}:{n} ({len(line)})"
        for n, line in enumerate(lines, 1)
        if len(line) > CODE_COLUMNS
    ]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_line_of_the_packages_fits_a_listing(package):
    paths = sorted((ROOT / package).rglob("*.py"))
    found = [line for path in paths for line in long_lines(path)]
    assert found == []


def test_the_check_sees_a_long_line(tmp_path):
    wide = tmp_path / "wide.py"
    wide.write_text("x = 1  # " + "." * CODE_COLUMNS + "\n")
    assert long_lines(wide) == [f"wide.py:1 ({CODE_COLUMNS + 9})"]
