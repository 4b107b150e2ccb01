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
