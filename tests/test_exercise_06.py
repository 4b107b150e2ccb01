"""Exercise 06 (slot addressing): the grader of `compute_swa_indices_and_lens` on the
package's torch twin, its broken variants and exact hand-made answers, and command-line grading
of the solution (full marks) and of a notebook that calls the reference (0)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
import torch

import grader as course
from grader.exercises import broken
from grader.exercises.addressing_checks import swa_case, swa_indices_checks
from grader.exercises.addressing_world import swa_world
from grader.exercises.answer_free import answer_free_sources
from grader.exercises.catalogue import SOLUTIONS_DIR, cell_role
from grader.grading import grade_notebook
from refimpl.kernels.reference_v4 import compute_swa_indices_and_lens

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "06_slot_addressing.ipynb"


@pytest.fixture(autouse=True)
def _grading_as_root_is_asked_for(monkeypatch):
    monkeypatch.setenv("GRADER_ALLOW_ROOT", "1")


def _answer(case):
    return swa_world(compute_swa_indices_and_lens)(*case[1])


def test_hand_made_batches_have_the_expected_slots():
    """Exact rows: blocks of 4, window 4; a decode at position 4 reads positions 1..4 (block 3
    then block 1), one at position 8 reads 5..8 (block 2, then 5); a young request reads only its own 2 positions; padding reads nothing."""
    decode = _answer(swa_case([5, 9], [1, 1], [[3, 1, 0], [7, 2, 5]], 4, 4))
    assert decode["indices"] == [[13, 14, 15, 4], [9, 10, 11, 20]]
    assert decode["lens"] == [4, 4]
    assert decode["indices dtype"] == decode["lens dtype"] == "torch.int32"
    young = _answer(swa_case([2], [2], [[5]], 4, 4))
    assert young["indices"] == [[20, -1, -1, -1], [20, 21, -1, -1]] and young["lens"] == [1, 2]
    padded = _answer(swa_case([6], [1], [[2, 0]], 4, 4, padding=2))
    assert padded["indices"] == [[10, 11, 0, 1], [-1] * 4, [-1] * 4]
    assert padded["lens"] == [4, 0, 0]
    prefill = _answer(swa_case([7, 5], [1, 3], [[0, 1], [5, 6]], 4, 5, token_offset=1))
    assert prefill["lens"] == [3, 4, 5]
    assert prefill["indices"][2] == [20, 21, 22, 23, 24]


def test_every_check_passes_the_reference_and_the_reference_is_caught():
    own = course.check_swa_indices(
        compute_swa_indices_and_lens, verbose=False, allow_reference=True
    )
    assert own.passed and own.num_checks == len(swa_indices_checks()) == 7
    used = course.check_swa_indices(compute_swa_indices_and_lens, verbose=False)
    assert used.num_passed == 0
    assert "reference_v4.compute_swa_indices_and_lens" in used.results[0].divergence.found


@pytest.mark.parametrize(
    "variant,row,where",
    [
        (broken.swa_window_off_by_one, "window_reaches_back", "lens[0]"),
        (broken.swa_ignores_padding, "padding_rows", "lens[1]"),
        (broken.swa_no_length_clamp, "young_request_short_window", "lens[0]"),
    ],
)
def test_each_variant_fails_its_row_at_the_row_it_breaks(variant, row, where):
    report = course.check_swa_indices(variant, verbose=False, allow_reference=True)
    result = next(r for r in report.results if r.name == row)
    assert not result.passed and result.divergence.where == where, report.table()


def test_the_child_refimpl_has_a_stub_for_the_answer():
    source = answer_free_sources(["check_swa_indices"])["refimpl.kernels.reference_v4"]
    assert (
        "__reference_used__('refimpl.kernels.reference_v4.compute_swa_indices_and_lens')"
        in (source)
    )
    assert "def _token_rows" in source  # compute_global_topk_indices_and_lens uses it too
    assert "def compute_global_topk_indices_and_lens" in source


def test_a_wrong_dtype_or_shape_is_named():
    def int64_lens(*args):
        indices, lens = compute_swa_indices_and_lens(*args)
        return indices, lens.long()

    report = course.check_swa_indices(int64_lens, verbose=False, allow_reference=True)
    assert report.num_passed == 0
    assert report.results[0].divergence.where == "lens dtype"
    report = course.check_swa_indices(lambda *a: torch.zeros(2), verbose=False)
    assert report.results[0].divergence.found == "'not a pair of tensors: Tensor'"


def test_cli_gives_the_solution_full_marks(tmp_path):
    path = tmp_path / NOTEBOOK
    path.write_bytes((ROOT / SOLUTIONS_DIR / NOTEBOOK).read_bytes())
    grade = grade_notebook(path, timeout=120)
    assert grade.exercise == "06_slot_addressing"
    assert grade.passed and grade.num_checks == 7, grade.tables


def test_cli_scores_a_notebook_that_calls_the_reference_zero(tmp_path):
    nb = nbformat.read(ROOT / SOLUTIONS_DIR / NOTEBOOK, as_version=4)
    (cell,) = [c for c in nb.cells if cell_role(c) == "solution"]
    cell.source = (
        "from refimpl.kernels.reference_v4 import compute_swa_indices_and_lens as _twin\n\n\n"
        "def compute_swa_indices_and_lens(*args, **kwargs):\n"
        "    return _twin(*args, **kwargs)\n"
    )
    path = tmp_path / NOTEBOOK
    nbformat.write(nb, path)
    grade = grade_notebook(path, timeout=120)
    assert grade.num_checks == 7 and grade.num_passed == 0
    assert grade.reason == (
        "uses the reference (refimpl.kernels.reference_v4.compute_swa_indices_and_lens)"
    ), grade.reason


def test_the_untouched_student_copy_scores_zero_of_seven():
    grade = grade_notebook(ROOT / "notebooks/exercises" / NOTEBOOK, timeout=120)
    assert grade.num_checks == 7 and grade.num_passed == 0
    assert grade.reason == (
        "not implemented (compute_swa_indices_and_lens raises NotImplementedError)"
    ), grade.reason
