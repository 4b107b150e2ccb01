"""The grading child's file rules, judged on resolved paths, and what its refimpl serves.

A rule holds for what its path resolves to, so a link or a bind mount that leads to a hidden
file (the reference's source) must never be granted whole; the child checks every route to the
hidden files before any student code runs; and every public refimpl module imports in every
exercise's child.
"""

from __future__ import annotations

import dataclasses
import os
import site
import sys
from pathlib import Path

import nbformat
import pytest

from grader.exercises.answer_free import answer_free_sources
from grader.sandbox import limits as sandbox
from grader.sandbox.limits import file_rules, landlock_abi

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = "refimpl/paged/block_manager.py"


def _fake_venv(tmp_path: Path) -> tuple[Path, Path]:
    """A venv as `python -m venv` lays it out on Linux (lib64 -> lib), holding an installed
    refimpl; (the venv, its hidden answer file)."""
    venv = tmp_path / "venv"
    packages = venv / "lib" / "python3.11" / "site-packages"
    for rel in (HIDDEN, "refimpl/paged/sequence.py", "numpy/__init__.py"):
        (packages / rel).parent.mkdir(parents=True, exist_ok=True)
        (packages / rel).write_text("x = 1\n")
    (venv / "lib64").symlink_to("lib")
    return venv, packages / HIDDEN


def _as_python(monkeypatch, prefix: Path, base: Path | None = None) -> None:
    """Make `file_rules` see `prefix` as the Python installation it runs in."""
    for name in ("prefix", "exec_prefix"):
        monkeypatch.setattr(sys, name, str(prefix))
    for name in ("base_prefix", "base_exec_prefix"):
        monkeypatch.setattr(sys, name, str(base or prefix))
    packages = prefix / "lib" / "python3.11" / "site-packages"
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(packages)])


def _granted_above(rules, hidden: Path) -> list[str]:
    """Read rules whose target holds `hidden` (so grant it)."""
    return [r for r in rules.read if hidden.resolve().is_relative_to(os.path.realpath(r))]


def test_a_venvs_lib64_link_is_judged_by_what_it_leads_to(tmp_path, monkeypatch):
    """`lib64 -> lib`: granting the link grants lib, site-packages and the answer module."""
    venv, hidden = _fake_venv(tmp_path)
    _as_python(monkeypatch, venv)
    rules = file_rules(str(tmp_path / "work"), [], [str(hidden)])
    assert _granted_above(rules, hidden) == []
    # what sits beside the hidden file stays readable
    packages = hidden.parents[2]
    assert str(packages / "numpy") in rules.read
    assert str(hidden.parent / "sequence.py") in rules.read


def test_every_route_to_a_hidden_file_is_named_for_the_childs_check(tmp_path, monkeypatch):
    """The child checks the lib64 route, the compiled caches and a copy on sys.path too."""
    venv, hidden = _fake_venv(tmp_path)
    _as_python(monkeypatch, venv)
    copy = tmp_path / "elsewhere" / "site-packages"
    (copy / HIDDEN).parent.mkdir(parents=True)
    (copy / HIDDEN).write_text("x = 2\n")
    monkeypatch.setattr(sys, "path", [*sys.path, str(copy)])
    # the installed refimpl is the fake venv's
    monkeypatch.setattr(sandbox, "_package_parents", lambda: [str(hidden.parents[2])])
    routes = set(file_rules(str(tmp_path / "work"), [], [str(hidden)]).hidden)
    tag = sys.implementation.cache_tag
    assert {
        str(hidden),
        str(venv / "lib64" / hidden.relative_to(venv / "lib")),
        str(hidden.parent / "__pycache__" / f"block_manager.{tag}.pyc"),
        str(copy / HIDDEN),
    } <= routes, sorted(routes)


def test_a_bind_mount_of_site_packages_is_not_granted_whole(tmp_path, monkeypatch):
    """A folder Python may read that shows site-packages again through a bind mount: the
    answer module is hidden under that name too."""
    venv, hidden = _fake_venv(tmp_path)
    view = tmp_path / "view"  # where site-packages is mounted again
    view.mkdir()
    _as_python(monkeypatch, venv, base=tmp_path)
    mounts = [
        ("0:1", "/", "/"),
        ("7:7", "/", str(venv)),
        ("7:7", "/lib/python3.11/site-packages", str(view)),
    ]
    monkeypatch.setattr(sandbox, "_mounts", lambda: mounts, raising=False)
    rules = file_rules(str(tmp_path / "work"), [], [str(hidden)])
    alias = view / "refimpl" / "paged" / "block_manager.py"
    assert [r for r in rules.read if str(alias).startswith(r.rstrip("/") + "/")] == []


def test_every_exercises_child_serves_every_answer_module():
    """Exercise 1's child serves exercise 6's kernels (so `import refimpl.kernels` works), with
    their answer stubbed; exercise 3's keeps the block manager it builds on."""
    ex1 = answer_free_sources(["check_block_manager"])
    ex3 = answer_free_sources(["check_scheduler"])
    assert set(ex1) == set(ex3)
    stub = "__reference_used__('refimpl.kernels.deepseek_v4.compute_swa_indices_and_lens')"
    assert stub in ex1["refimpl.kernels.deepseek_v4"]
    assert "__reference_used__(" not in ex3["refimpl.paged.block_manager"]
    assert (
        "__reference_used__('refimpl.paged.scheduler.Scheduler."
        in ex3["refimpl.paged.scheduler"]
    )


@pytest.mark.skipif(landlock_abi() == 0, reason="needs Landlock")
def test_the_child_refuses_to_grade_when_a_hidden_file_is_readable(tmp_path, monkeypatch):
    """Rules with a hole (refimpl granted whole, as a link once did): the child finds the
    answer module readable before any student code runs, and the grade says so in one line."""
    from grader.exercises.catalogue import STUDENT_DIR, cell_role
    from grader.grading import grade_notebook
    from grader.sandbox import remote

    monkeypatch.setenv("GRADER_ALLOW_ROOT", "1")
    package = str(Path(sandbox.refimpl.__file__).resolve().parent)

    def leaky(*args, **kwargs):
        rules = file_rules(*args, **kwargs)
        return dataclasses.replace(rules, read=(*(rules.read or ()), package))

    monkeypatch.setattr(remote, "file_rules", leaky)
    nb = nbformat.read(ROOT / STUDENT_DIR / "01_block_manager.ipynb", as_version=4)
    cells = [c for c in nb.cells if cell_role(c) == "solution"]
    cells[0].source = (
        "import pathlib, refimpl\n"
        "_path = pathlib.Path(refimpl.__file__).parent / 'paged' / 'block_manager.py'\n"
        "ns = {'__name__': 'copy'}\n"
        "exec(_path.read_text(), ns)\n"
        "class BlockManager(ns['BlockManager']):\n"
        "    def __init__(self, num_blocks, block_size):\n"
        "        super().__init__(num_blocks, block_size, enable_prefix_caching=False)\n"
    )
    for cell in cells[1:]:
        cell.source = "pass\n"
    path = tmp_path / "01_block_manager.ipynb"
    nbformat.write(nb, path)
    grade = grade_notebook(path, timeout=60)
    assert grade.num_passed == 0
    assert grade.why.startswith("refused to grade: its code could read ") and (
        "hidden files despite the sandbox" in grade.why
    ), grade.why
    assert "\n" not in grade.why
