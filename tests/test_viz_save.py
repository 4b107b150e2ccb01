"""save_figure writes a chapter's figure into figures/ only when `make figures` asks for it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from refimpl.viz import save_figure
from refimpl.viz.save import CHECKOUT_FIGURES, ENV, figures_dir

ROOT = Path(__file__).resolve().parents[1]


def small_figure() -> Figure:
    fig = Figure(figsize=(2, 1))
    fig.add_subplot().plot([0, 1], [0, 1])
    return fig


@pytest.mark.parametrize("value", [None, "", "0"])
def test_nothing_is_written_unless_asked(value, monkeypatch, tmp_path):
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    monkeypatch.chdir(tmp_path)  # a reader's notebook folder: no ../figures next to it
    assert figures_dir() is None
    assert save_figure(small_figure(), "00_course_map.png") is None
    assert list(tmp_path.iterdir()) == []


def test_written_into_the_named_folder_at_the_chapters_dpi(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV, str(tmp_path / "figures"))
    path = save_figure(small_figure(), "x.png")
    assert path == tmp_path / "figures" / "x.png" and path.read_bytes().startswith(b"\x89PNG")
    from PIL import Image

    assert Image.open(path).size == (200, 100)  # 2 x 1 inches at dpi 100
    assert Image.open(save_figure(small_figure(), "y.png", dpi=120)).size == (240, 120)


def test_one_means_the_checkouts_figures_folder(monkeypatch):
    monkeypatch.setenv(ENV, "1")
    assert figures_dir() == CHECKOUT_FIGURES == ROOT / "figures"


@pytest.mark.parametrize("name", ["", "../x.png", "figures/x.png", 3])
def test_bad_names(name, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(ValueError, match="name"):
        save_figure(small_figure(), name)


def test_chapters_save_only_through_save_figure():
    """No chapter writes a file by itself; every README picture is a save_figure of some
    chapter."""
    saved = set()
    for path in sorted((ROOT / "notebooks").rglob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "code":
                assert ".savefig(" not in source, f"{path.name}: use refimpl.viz.save_figure"
                saved |= set(re.findall(r'save_figure\(\w+, "([^"]+)"', source))
    shown = set(
        re.findall(r"figures/([\w.]+\.png)", (ROOT / "README.md").read_text(encoding="utf-8"))
    )
    assert shown and shown <= saved, (
        f"README pictures no chapter saves: {sorted(shown - saved)}"
    )


def test_make_figures_asks_and_make_notebooks_does_not():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(rf"^figures: export {ENV} := \$\(CURDIR\)/figures$", makefile, flags=re.M)
    assert re.search(r"^figures: notebooks$", makefile, flags=re.M)
    assert ENV not in makefile.split("\nnotebooks:")[1].split("\n\n")[0]
