"""Exercise notebooks: student copies in sync, stopping cleanly at the first exercise, and
graded."""

from __future__ import annotations

import csv
import os
import re
import shutil
from pathlib import Path

import ipykernel.kernelspec
import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from grader.exercises.catalogue import (
    BEGIN,
    END,
    EXERCISES,
    SOLUTIONS_DIR,
    STUDENT_DIR,
    cell_role,
    make_student_copy,
    stale_copies,
    strip_solutions,
)
from grader.grading import check_names, grade_notebook
from refimpl.__main__ import main as refimpl_main

pytestmark = pytest.mark.slow  # runs exercise notebooks and the grade CLI in subprocesses

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _grading_as_root_is_asked_for(monkeypatch):
    """These tests may run as root (a container): they ask for it as an instructor would."""
    monkeypatch.setenv("GRADER_ALLOW_ROOT", "1")


SOLUTIONS = sorted((ROOT / SOLUTIONS_DIR).glob("[0-9]*.ipynb"))
STUDENTS = [ROOT / STUDENT_DIR / p.name for p in SOLUTIONS]


def test_every_exercise_has_a_solution_and_a_student_copy():
    assert [p.stem for p in SOLUTIONS] == sorted(EXERCISES)
    assert all(p.exists() for p in STUDENTS)


def test_student_copies_are_in_sync():
    assert stale_copies(ROOT) == [], "student copies are stale: run `make exercises`"


def test_sync_check_notices_a_stale_copy(tmp_path):
    shutil.copytree(ROOT / SOLUTIONS_DIR, tmp_path / SOLUTIONS_DIR)
    for student in STUDENTS:
        shutil.copy(student, tmp_path / STUDENT_DIR / student.name)
    assert stale_copies(tmp_path) == []
    solution = tmp_path / SOLUTIONS_DIR / "01_block_manager.ipynb"
    nb = nbformat.read(solution, as_version=4)
    nb.cells[0].source += "\n\nOne more sentence."
    nbformat.write(nb, solution)
    (tmp_path / STUDENT_DIR / "03_scheduler.ipynb").unlink()
    assert stale_copies(tmp_path) == [
        "notebooks/exercises/01_block_manager.ipynb",
        "notebooks/exercises/03_scheduler.ipynb",
    ]


def test_strip_solutions_keeps_the_frame_and_names_exercise_and_check():
    source = "class A:\n    def f(self):\n        ### BEGIN SOLUTION\n        return 1\n        ### END SOLUTION\n\n    def g(self):\n        pass"
    stripped = strip_solutions(source, EXERCISES["01_block_manager"])
    assert "return 1" not in stripped and BEGIN not in stripped and END not in stripped
    assert "def g(self):" in stripped
    assert (
        "        raise NotImplementedError('Exercise 1: A.f is not written yet. Write it in "
        "place of this raise, "
        "then run check_block_manager(BlockManager).')" in stripped
    )
    with pytest.raises(ValueError, match="without"):
        strip_solutions("### BEGIN SOLUTION\nx = 1\n", EXERCISES["01_block_manager"])


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_student_copy_has_no_solution_code_and_no_outputs(solution):
    nb = nbformat.read(solution, as_version=4)
    student = make_student_copy(nb)
    solution_lines = set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        inside = False
        for line in cell.source.split("\n"):
            if line.strip() == BEGIN:
                inside = True
            elif line.strip() == END:
                inside = False
            elif inside and line.strip():
                solution_lines.add(line)
    assert solution_lines
    for cell in student.cells:
        if cell.cell_type == "code":
            assert BEGIN not in cell.source and END not in cell.source
            assert cell.outputs == [] and cell.execution_count is None
            leaked = [line for line in cell.source.split("\n") if line in solution_lines]
            assert leaked == [], leaked


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_notebooks_carry_valid_nbgrader_metadata(solution):
    nb = nbformat.read(solution, as_version=4)
    grade_ids = []
    roles = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell.metadata["nbgrader"]
        role = cell_role(cell)
        roles.append(role)
        grade_ids.append(meta["grade_id"])
        assert meta["schema_version"] == 3
        assert meta["solution"] == (role == "solution") == (BEGIN in cell.source)
        assert meta["grade"] == (role == "check")
        if role == "check":
            assert meta["locked"]
            # One point per check: the executed solution's table says how many checks there
            # are.
            text = "".join(o.get("text", "") for o in cell.outputs)
            match = re.search(
                r"^check_\w+\(\w+\): (\d+)/(\d+) checks passed$", text, re.MULTILINE
            )
            assert match is not None and match.group(1) == match.group(2), text
            assert meta["points"] == int(match.group(2)), (
                meta["grade_id"],
                meta["points"],
                text,
            )
    assert len(grade_ids) == len(set(grade_ids))
    assert roles[0] == "setup" and "solution" in roles and "check" in roles


class _CurrentEnvKernelSpecs(KernelSpecManager):
    """Run notebooks with this interpreter (as nbval's --nbval-current-env), whatever kernels
    are installed."""

    def get_kernel_spec(self, kernel_name):
        return KernelSpec(
            resource_dir=ipykernel.kernelspec.RESOURCES,
            **ipykernel.kernelspec.get_kernel_dict(),
        )


def _first_demo_index(nb) -> int:
    return next(
        i for i, c in enumerate(nb.cells) if c.cell_type == "code" and cell_role(c) == "demo"
    )


@pytest.mark.parametrize("student", STUDENTS, ids=lambda p: p.stem)
def test_student_notebook_runs_to_its_first_exercise_then_reports_it(student):
    nb = nbformat.read(student, as_version=4)
    exercise = EXERCISES[student.stem]
    km = KernelManager(kernel_name="python3", kernel_spec_manager=_CurrentEnvKernelSpecs())
    client = NotebookClient(
        nb, km=km, timeout=60, resources={"metadata": {"path": str(student.parent)}}
    )
    with pytest.raises(CellExecutionError) as info:
        client.execute()
    error = info.value
    assert error.ename == "NotImplementedError"
    number = exercise.title.split(":")[0]
    assert number in error.evalue and "is not written yet" in error.evalue
    assert f"{exercise.checks[0][0]}({exercise.checks[0][1]})" in error.evalue
    # Every cell before the first demo ran cleanly; the demo is where the missing code
    # surfaces.
    failing = _first_demo_index(nb)
    for cell in nb.cells[:failing]:
        if cell.cell_type == "code":
            assert all(o.get("output_type") != "error" for o in cell.outputs)
            assert cell.execution_count is not None
    assert any(o.get("output_type") == "error" for o in nb.cells[failing].outputs)


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_solution_notebook_code_passes_its_graders(solution):
    grade = grade_notebook(solution, timeout=60)
    assert grade.error is None
    assert grade.passed, "\n".join(grade.tables)
    assert grade.num_checks >= 6


def _with_solution_edit(tmp_path: Path, name: str, old: str, new: str) -> Path:
    nb = nbformat.read(ROOT / SOLUTIONS_DIR / name, as_version=4)
    cell = next(c for c in nb.cells if cell_role(c) == "solution" and old in c.source)
    cell.source = cell.source.replace(old, new)
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


def test_grade_cli_scores_a_student_mistake(tmp_path, capsys):
    path = _with_solution_edit(
        tmp_path, "01_block_manager.ipynb", "reversed(seq.block_table)", "seq.block_table"
    )
    csv_path = tmp_path / "grades.csv"
    assert refimpl_main(["grade", str(path), "--csv", str(csv_path)]) == 1
    out = capsys.readouterr().out
    assert "check_block_manager(BlockManager): 3/10 checks passed" in out
    assert "FAIL  free_last_block_first" in out
    assert "first difference at step 6: deallocate(A: 12 tokens)" in out
    assert out.rstrip().endswith(
        "score: 3/10 checks passed (30.0%)\n== total: 3/10 checks passed over 1 notebook"
    )
    rows = csv_path.read_text().splitlines()
    assert rows[0] == "notebook,exercise,passed,checks,failed_checks,reason"
    assert rows[1].startswith(
        f"{path},01_block_manager,3,10,check_block_manager:free_last_block_first;"
    )


def test_grade_cli_on_untouched_student_copies_scores_zero(capsys):
    assert refimpl_main(["grade", "--quiet", *map(str, STUDENTS)]) == 1
    out = capsys.readouterr().out
    assert (
        "score: 0/10 checks passed (0.0%): not implemented (BlockManager.__init__ raises "
        "NotImplementedError)" in out
    )
    total = sum(len(check_names(c)) for e in EXERCISES.values() for c, _ in e.checks)
    assert f"== total: 0/{total} checks passed over {len(STUDENTS)} notebooks" in out


def test_grade_cli_grades_the_notebooks_of_a_folder_and_counts_missing_ones(tmp_path, capsys):
    csv_path = tmp_path / "grades.csv"
    missing = tmp_path / "bob" / "01_block_manager.ipynb"
    assert (
        refimpl_main(
            ["grade", "--quiet", "--csv", str(csv_path), str(STUDENTS[0].parent), str(missing)]
        )
        == 1
    )
    out = capsys.readouterr().out
    assert [line.split(" ")[1] for line in out.splitlines() if line.startswith("== ")][
        : len(STUDENTS)
    ] == [str(p) for p in STUDENTS]
    assert (
        f"== {missing} (01_block_manager)\nscore: 0/10 checks passed (0.0%): no such file"
        in out
    )
    # the missing notebook's 10 checks count
    total = 10 + sum(len(check_names(c)) for e in EXERCISES.values() for c, _ in e.checks)
    assert f"== total: 0/{total} checks passed over {len(STUDENTS) + 1} notebooks" in out
    rows = list(csv.reader(csv_path.open()))
    assert (
        rows[-1][:4] == [str(missing), "01_block_manager", "0", "10"]
        and rows[-1][5] == "no such file"
    )
    assert rows[1][5] == "not implemented (BlockManager.__init__ raises NotImplementedError)"


def test_grading_two_at_a_time_gives_the_same_sheet_as_one_at_a_time(tmp_path, capsys):
    """--jobs 2 (worker processes, under Landlock) and --jobs 1 print the same lines and write
    the same CSV rows, in the order given: every solution, and a student copy that scores 0."""
    from grader.sandbox.limits import landlock_abi

    notebooks = [str(p) for p in SOLUTIONS] + [str(STUDENTS[0])]
    sheets, outputs = [], []
    for jobs in ("1", "2"):
        csv_path = tmp_path / f"grades-{jobs}.csv"
        argv = ["grade", "--quiet", "--jobs", jobs, "--csv", str(csv_path), *notebooks]
        assert refimpl_main(argv) == 1  # the student copy fails
        captured = capsys.readouterr()
        outputs.append(captured.out)
        sheets.append(list(csv.reader(csv_path.open())))
        if jobs == "2" and landlock_abi() == 0:
            assert "note: grading one notebook at a time" in captured.err
    assert outputs[0] == outputs[1] and sheets[0] == sheets[1]
    assert [row[0] for row in sheets[0][1:]] == notebooks
    assert all(row[2] == row[3] for row in sheets[0][1:-1]) and sheets[0][-1][2] == "0"


def test_a_worker_that_dies_costs_rows_not_the_run(tmp_path, capsys, monkeypatch):
    from grader import cli
    from grader.sandbox.limits import landlock_abi

    if landlock_abi() == 0:
        pytest.skip("workers run only under Landlock")
    grade_one = cli._grade_one

    def dies_on_the_second(path, content, timeout, settings):
        if path.parent.name == "b":
            os._exit(9)  # as the kernel's out-of-memory killer would end it
        return grade_one(path, content, timeout, settings)

    # the workers are forked, so they find this function under the original's name
    dies_on_the_second.__qualname__ = "_grade_one"
    monkeypatch.setattr(cli, "_grade_one", dies_on_the_second)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        shutil.copy(SOLUTIONS[0], tmp_path / name / SOLUTIONS[0].name)
    notebooks = [str(tmp_path / name / SOLUTIONS[0].name) for name in ("a", "b")]
    assert refimpl_main(["grade", "--quiet", "--jobs", "2", *notebooks]) == 1
    out = capsys.readouterr().out
    assert f"== {notebooks[1]} (01_block_manager)" in out
    assert "0/10 checks passed (0.0%): the grader's worker process failed on it" in out
    assert out.count("score: ") == 2


def test_grade_cli_does_not_take_a_chapter_for_an_exercise(capsys):
    # same number as exercise 03_scheduler
    chapter = ROOT / "notebooks" / "03_block_manager.ipynb"
    assert refimpl_main(["grade", "--quiet", str(chapter)]) == 1
    out = capsys.readouterr().out
    assert (
        f"== {chapter} (?)\nscore: 0 (not an exercise notebook (no refimpl_course.exercise in "
        "its metadata)" in out
    )


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["--csv", "{tmp}/no/such/folder/grades.csv"],
            "argument --csv: folder {tmp}/no/such/folder does not exist",
        ),
        (
            ["--csv", "{tmp}"],
            "argument --csv: {tmp} is a folder; give a file name such as {tmp}/grades.csv",
        ),
        (
            ["--timeout", "0"],
            "argument --timeout: must be a number of seconds from 1 to 86400, got 0",
        ),
        (
            ["--timeout", "-5"],
            "argument --timeout: must be a number of seconds from 1 to 86400, got -5",
        ),
        (
            ["--timeout", "nan"],
            "argument --timeout: must be a number of seconds from 1 to 86400, got nan",
        ),
        (
            ["--timeout", "soon"],
            "argument --timeout: expected a number of seconds, got 'soon'",
        ),
        (
            ["--timeout", "1e-9"],
            "argument --timeout: must be a number of seconds from 1 to 86400, got 1e-9",
        ),
        (
            ["--timeout", "1e9"],
            "argument --timeout: must be a number of seconds from 1 to 86400, got 1e9",
        ),
        # `--csv subs/*/01_block_manager.ipynb`: the shell put the first notebook after --csv
        (
            ["--csv", "{tmp}/a/01_block_manager.ipynb", "{tmp}/b/01_block_manager.ipynb"],
            "argument --csv: {tmp}/a/01_block_manager.ipynb is a notebook's name",
        ),
        (
            ["{tmp}/grades.csv", "--csv", "{tmp}/grades.csv"],
            "--csv {tmp}/grades.csv is one of the notebooks to grade",
        ),
        (["--csv", "{tmp}/link.csv"], "argument --csv: {tmp}/link.csv is a symbolic link"),
        (["{tmp}/empty"], "folder {tmp}/empty holds no .ipynb notebooks"),
        (["--jobs", "0"], "argument --jobs: must be at least 1, got 0"),
        (["--jobs", "two"], "argument --jobs: expected a whole number, got 'two'"),
    ],
)
def test_grade_cli_bad_arguments_fail_in_one_line_before_grading(
    tmp_path, capsys, monkeypatch, argv, words
):
    (tmp_path / "empty").mkdir()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        shutil.copy(STUDENTS[0], tmp_path / name / "01_block_manager.ipynb")
    (tmp_path / "grades.csv").write_text("kept\n")
    (tmp_path / "link.csv").symlink_to(tmp_path / "grades.csv")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    graded = []
    monkeypatch.setattr("grader.grading.grade_notebook", lambda *a, **k: graded.append(a))
    argv = [a.format(tmp=tmp_path) for a in argv]
    notebooks = [] if any(a.endswith("empty") for a in argv) else [str(STUDENTS[0])]
    assert refimpl_main(["grade", *notebooks, *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and graded == []
    assert captured.err.count("\n") == 1 and words.format(tmp=tmp_path) in captured.err, (
        captured.err
    )
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_grade_cli_reports_a_broken_cell_and_a_timeout(tmp_path, capsys):
    syntax = _with_solution_edit(
        tmp_path,
        "04_packed_layout.ipynb",
        "def approximate_gcd(values, lower_bound=None):",
        "def approximate_gcd(values, lower_bound=None)",
    )
    assert refimpl_main(["grade", str(syntax)]) == 1
    out = capsys.readouterr().out
    assert (
        "NameError: approximate_gcd is not defined (syntax error in cell 4 (line 1: expected "
        "':'))" in out
    )
    assert out.rstrip().endswith(
        "score: 0/26 checks passed (0.0%): syntax error in cell 4 (line 1: expected ':')\n"
        "== total: 0/26 checks passed over 1 notebook"
    )
    # the cell after never ran
    assert "check_packed_layout(get_kv_cache_config): 9/9 checks passed" not in out
    loop = _with_solution_edit(
        tmp_path,
        "02_prefix_cache.ipynb",
        "class PrefixCachingBlockManager(BlockManager):",
        "while True:\n    pass\nclass PrefixCachingBlockManager(BlockManager):",
    )
    assert refimpl_main(["grade", "--timeout", "3", str(loop)]) == 1
    assert "score: 0/15 checks passed (0.0%): timed out after 3 s" in capsys.readouterr().out


def test_grade_cli_is_not_fooled_by_reused_or_replaced_code(tmp_path, capsys):
    """Handing in the reference, or rebinding the grader from a solution cell, scores 0."""
    reuse = _with_solution_edit(
        tmp_path,
        "03_scheduler.ipynb",
        "class Scheduler:",
        "import refimpl.paged\n\nclass Scheduler(refimpl.paged.Scheduler):",
    )
    nb = nbformat.read(reuse, as_version=4)
    cell = next(c for c in nb.cells if cell_role(c) == "solution")
    # keep the given part, inherit the rest
    cell.source = cell.source.split("    def schedule(")[0]
    nbformat.write(nb, reuse)
    assert refimpl_main(["grade", str(reuse)]) == 1
    out = capsys.readouterr().out
    assert "the reference's refimpl.paged.scheduler.Scheduler.schedule" in out
    assert out.rstrip().endswith(
        "score: 0/11 checks passed (0.0%): uses the reference "
        "(refimpl.paged.scheduler.Scheduler.schedule)\n"
        "== total: 0/11 checks passed over 1 notebook"
    )

    swap = _with_solution_edit(
        tmp_path,
        "01_block_manager.ipynb",
        "class BlockManager:",
        "import grader\ngrader.check_block_manager = lambda *a, **k: "
        "None\n\nclass BlockManager:",
    )
    broken_nb = nbformat.read(swap, as_version=4)
    cell = next(c for c in broken_nb.cells if cell_role(c) == "solution")
    cell.source = cell.source.replace("reversed(seq.block_table)", "seq.block_table")
    nbformat.write(broken_nb, swap)
    assert refimpl_main(["grade", "--quiet", str(swap)]) == 1
    assert "score: 3/10 checks passed (30.0%)" in capsys.readouterr().out


def test_grade_cli_works_from_nbgrader_metadata_alone(tmp_path):
    """nbgrader may drop our metadata: solution and set-up cells are then found through
    nbgrader's."""
    nb = nbformat.read(ROOT / SOLUTIONS_DIR / "04_packed_layout.ipynb", as_version=4)
    for cell in nb.cells:
        cell.metadata.pop("refimpl_course", None)
    nb.metadata.pop("refimpl_course", None)
    path = tmp_path / "04_packed_layout.ipynb"
    nbformat.write(nb, path)
    grade = grade_notebook(path, timeout=60)
    assert grade.exercise == "04_packed_layout"
    assert grade.passed and grade.num_checks == 26


def test_the_former_solution_bugs_now_fail_their_rows(tmp_path):
    """Exercise 1 used nano-vllm's literal `len % block_size == 1`; exercise 4 took True as a
    number and planned a slab for no groups. The graders now catch both."""
    literal = _with_solution_edit(
        tmp_path,
        "01_block_manager.ipynb",
        "(len(seq) - 1) % self.block_size == 0",
        "len(seq) % self.block_size == 1",
    )
    grade = grade_notebook(literal, timeout=60)
    failed = {check for _, check, ok in grade.rows if not ok}
    assert failed == {"block_size_1", "random_workload_3"}, grade.tables

    nb = nbformat.read(ROOT / SOLUTIONS_DIR / "04_packed_layout.ipynb", as_version=4)
    gcd_cell, _, layout_cell = [c for c in nb.cells if cell_role(c) == "solution"]
    checks = gcd_cell.source.index("    if not values:")
    lo = gcd_cell.source.index("    lo = ")
    gcd_cell.source = (
        gcd_cell.source[:checks]
        + "    if not values or any(x <= 0 for x in values):\n        raise ValueError(values)\n"
        + gcd_cell.source[lo:]
    )
    assert "    if not groups:\n        raise" in layout_cell.source
    layout_cell.source = layout_cell.source.replace(
        "    if not groups:\n", "    if not groups:\n        return KVCacheConfig(0, [], [])\n"
    )
    old = tmp_path / "04_packed_layout.ipynb"
    nbformat.write(nb, old)
    grade = grade_notebook(old, timeout=60)
    failed = {(grader, check) for grader, check, ok in grade.rows if not ok}
    assert failed == {
        ("check_approximate_gcd", "rejects_non_integers"),
        ("check_packed_layout", "rejects_no_groups"),
    }, grade.tables


def test_grading_a_loop_inside_a_method_fails_those_rows_and_grades_the_rest(
    tmp_path, monkeypatch
):
    # Self-preemption that never preempts the sequence itself: the inner while loop never ends.
    # The loop runs in the grading child, so the grader only waits with a deadline: no alarm or
    # watchdog may raise inside the grader itself (one that lands inside `ast.parse` breaks
    # CPython 3.11's parser: "AST constructor recursion depth mismatch").
    import grader.lockstep.time_limit as time_limit

    def no_async_limit(seconds):
        raise AssertionError("an asynchronous time limit in the grader process")

    monkeypatch.setattr(time_limit, "_alarm", no_async_limit)
    monkeypatch.setattr(time_limit, "_watchdog", no_async_limit)
    loop = _with_solution_edit(
        tmp_path,
        "03_scheduler.ipynb",
        "                    self.preempt(seq)\n                    break\n",
        "                    continue\n",
    )
    grade = grade_notebook(loop, timeout=100, time_limit=0.5)
    assert grade.error is None
    failed = [check for _, check, ok in grade.rows if not ok]
    assert "preempt_self_when_alone" in failed and "prefill_then_decode" not in failed
    table = "\n".join(grade.tables)
    assert (
        "scenario preempt_self_when_alone did not finish within 0.5 s and was stopped (an "
        "endless loop?)" in table
    )


def _solution_namespace(name: str, old: str, new: str) -> dict:
    """The setup and solution cells of a solution notebook run here, with one edit."""
    nb = nbformat.read(ROOT / SOLUTIONS_DIR / name, as_version=4)
    namespace: dict = {"__name__": "__main__"}
    edited = False
    for cell in nb.cells:
        if cell_role(cell) not in ("setup", "solution"):
            continue
        source = cell.source
        if old in source and not edited:
            source, edited = source.replace(old, new, 1), True
        exec(compile(source, f"<{name}>", "exec"), namespace)
    assert edited
    return namespace


def test_a_correct_answer_that_uses_a_dataclass_repr_is_not_blamed_for_the_reference(capsys):
    """Every dataclass shares its __repr__ wrapper with the broken variants' catalogue: using
    it is no use of the reference (the notebook's check_* path)."""
    import grader

    scheduler = _solution_namespace(
        "03_scheduler.ipynb",
        "        self.max_num_seqs = config.max_num_seqs\n",
        "        self.label = repr(config)\n        self.max_num_seqs = config.max_num_seqs\n",
    )["Scheduler"]
    report = grader.check_scheduler(scheduler)
    assert (report.num_passed, report.num_checks) == (11, 11), report.table()
    layout = _solution_namespace(
        "04_packed_layout.ipynb",
        "    for group in groups:\n        runs = {}",
        "    for group in groups:\n        repr(group)\n        runs = {}",
    )["get_kv_cache_config"]
    report = grader.check_packed_layout(layout)
    assert report.passed, report.table()


def test_a_correct_layout_that_copies_and_converts_dataclasses_keeps_every_check(capsys):
    """copy.deepcopy, dataclasses.asdict and repr on the planner's dataclasses run code every
    dataclass shares: none of it is the reference's (the notebook's check_* path)."""
    import grader

    layout = _solution_namespace(
        "04_packed_layout.ipynb",
        "    return KVCacheConfig(num_blocks, tensors, groups)\n",
        "    import copy, dataclasses\n"
        "    config = KVCacheConfig(num_blocks, tensors, copy.deepcopy(groups))\n"
        "    label = repr(groups) + repr(config)\n"
        '    assert dataclasses.asdict(config)["num_blocks"] == num_blocks, label\n'
        "    return copy.deepcopy(config)\n",
    )["get_kv_cache_config"]
    report = grader.check_packed_layout(layout)
    assert report.num_passed == report.num_checks >= 9, report.table()
