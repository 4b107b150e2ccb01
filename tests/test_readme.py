"""The README and the Makefile tell the same story as the code: which chapters have steppers,
the Python the package needs, what CPU=1 downloads, and the layout of the repository."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
MAKEFILE = (ROOT / "Makefile").read_text(encoding="utf-8")


def test_readme_names_exactly_the_chapters_with_steppers():
    with_stepper = []
    for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        code = [
            "".join(c["source"])
            for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "code"
        ]
        if any(re.search(r"\.widget\(\)", source) for source in code):
            with_stepper.append(path.name.split("_")[0])
    claim = re.search(r"Chapters ([\w ,]+?) also have steppers", README.replace("\n", " "))
    assert claim, "the README says which chapters have steppers"
    named = re.findall(r"\d+b?", claim.group(1))
    assert named == with_stepper
    assert "in every chapter" not in README.split("steppers")[0][-200:]


def test_python_requirement_is_the_same_everywhere():
    minimum = re.search(r"sys\.version_info < \((\d+), (\d+), (\d+)\)", MAKEFILE).groups()
    version = ".".join(minimum)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["requires-python"] == f">={version}"
    assert f"refimpl needs Python {version} or newer" in MAKEFILE
    assert f"Python {version} or newer" in README


def test_cpu_download_is_stated_once():
    row = re.search(r"\| Linux x86_64, `make lab CPU=1` \| about ([\d.]+) GB \|", README)
    default = re.search(r"\| Linux x86_64 \(default\) \| ([\d.]+) GB", README)
    assert row and default
    comment = " ".join(
        line.lstrip("# ") for line in MAKEFILE.splitlines() if line.startswith("#")
    )
    assert f"about {row.group(1)} GB instead of about {default.group(1)} GB" in comment


def test_layout_table_lists_every_top_level_package_and_folder():
    listed = set(re.findall(r"^\| `([\w/]+)/`", README, flags=re.M))
    listed |= {
        name
        for row in re.findall(r"^\| (`[^|]+`) \|", README, flags=re.M)
        for name in re.findall(r"`([\w]+)/`", row)
    }
    packages = {
        f"refimpl/{p.name}"
        for p in (ROOT / "refimpl").iterdir()
        if p.is_dir() and (p / "__init__.py").exists()
    }
    assert packages | {"tests", "benchmarks", "tools"} <= listed, sorted(
        packages | {"tools"} - listed
    )


def test_install_minutes_are_stated_once():
    """The paragraph under the two commands and the download table give the same first-install
    minutes (they once said "about 2 more" and "4 min")."""
    text = README.replace("\n", " ")
    default = re.search(r"\| Linux x86_64 \(default\) \|[^|]+\|[^|]+\| (\d+) min ", README)
    cpu = re.search(r"\| Linux x86_64, `make lab CPU=1` \|[^|]+\|[^|]+\| (\d+) min ", README)
    claim = re.search(
        r"first install takes about (\d+) more on Linux, (\d+) with `CPU=1`", text
    )
    assert default and cpu and claim
    assert claim.groups() == (default.group(1), cpu.group(1))
    assert "about 2 more" not in text


def test_chapter_parts_agree_with_the_course_map():
    """The README's parts are the course map's: each chapter number the README puts in a part
    is in that part of refimpl.viz.course_map (chapter 14 was "Part IV" in the map only)."""
    from refimpl.viz.course_map import CHAPTERS

    parts = {c.part for c in CHAPTERS} - {"Start"}
    text = README.replace("\n", " ")
    named = set(re.findall(r"Part (I{1,3}|IV)\b", text))
    assert {f"Part {p}" for p in named} == parts
    assert [c.number for c in CHAPTERS if c.part == "Part III"] == ["13"]
    assert "chapter 14 plans any model's cache" in text
