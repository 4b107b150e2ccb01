"""The exercise catalogue and the student-copy generator.

Solutions are authored once, in `notebooks/exercises/solutions/NN_name.ipynb`, with the
student's part of each code cell between `### BEGIN SOLUTION` and `### END SOLUTION` (the
nbgrader convention). `make exercises` writes the student copies
`notebooks/exercises/NN_name.ipynb`: outputs cleared, every solution region replaced by a stub
that raises `NotImplementedError` naming the exercise and the check to run. `make
check-exercises` fails when a copy is stale.

Cells carry `metadata.refimpl_course.role`: "setup" (given code the grader needs), "solution"
(the student's code), "demo" (uses the student's code), "check" (calls a grader). The grader
(`python -m grader`) runs only the setup and solution cells.

    python -m grader.exercises generate   # write the student copies
    python -m grader.exercises check      # exit 1 if any copy is stale
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from dataclasses import dataclass
from pathlib import Path

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
SOLUTIONS_DIR = Path("notebooks/exercises/solutions")
STUDENT_DIR = Path("notebooks/exercises")


@dataclass(frozen=True)
class Exercise:
    """One notebook: its number and title, and the graders to run on the names it defines."""

    name: str  # notebook stem, e.g. "01_block_manager"
    title: str
    # (grader function in grader, name the student defines)
    checks: tuple[tuple[str, str], ...]


EXERCISES: dict[str, Exercise] = {
    e.name: e
    for e in (
        Exercise(
            "01_block_manager",
            "Exercise 1: the block manager",
            (("check_block_manager", "BlockManager"),),
        ),
        Exercise(
            "02_prefix_cache",
            "Exercise 2: the prefix cache",
            (("check_prefix_cache", "PrefixCachingBlockManager"),),
        ),
        Exercise(
            "03_scheduler", "Exercise 3: the scheduler", (("check_scheduler", "Scheduler"),)
        ),
        Exercise(
            "04_packed_layout",
            "Exercise 4: vLLM's planner for DeepSeek V4 (groups and the packed layout)",
            (
                ("check_approximate_gcd", "approximate_gcd"),
                ("check_packed_groups", "get_packed_kv_cache_groups"),
                ("check_packed_layout", "get_kv_cache_config"),
            ),
        ),
        Exercise(
            "05_hybrid_allocator",
            "Exercise 5: the hybrid allocator (window frees and the fixed-point hit)",
            (
                ("check_window_frees", "SlidingWindowManager"),
                ("check_fixed_point_hit", "HybridKVCacheCoordinator"),
            ),
        ),
        Exercise(
            "06_slot_addressing",
            "Exercise 6: slot addressing (DeepSeek V4's sliding-window indices)",
            (("check_swa_indices", "compute_swa_indices_and_lens"),),
        ),
    )
}


def _course_metadata(node) -> dict:
    """A notebook's or cell's `refimpl_course` metadata; ValueError when it is not a
    mapping."""
    metadata = node.get("metadata", {})
    if not isinstance(metadata, dict):
        raise ValueError(f"its metadata is a {type(metadata).__name__}, not a mapping")
    course = metadata.get("refimpl_course", {})
    if not isinstance(course, dict):
        raise ValueError(
            f"its refimpl_course metadata is a {type(course).__name__} "
            f"({str(course)[:40]!r}), not a mapping"
        )
    return course


def exercise_for(notebook, path: str | Path | None = None) -> Exercise:
    """The exercise a notebook belongs to, from its own metadata (`refimpl_course.exercise`).

    Tools such as nbgrader may drop that metadata; then a file named exactly like the exercise
    (`01_block_manager.ipynb`) still counts. A number prefix alone does not: chapter
    `03_block_manager.ipynb` is not exercise `03_scheduler`. Metadata that is not well formed,
    or that names another exercise than the file's exercise name, is a ValueError: a file
    handed in as exercise 3 is graded as exercise 3 or not at all.
    """
    name = _course_metadata(notebook).get("exercise")
    stem = Path(path).stem if path is not None else None
    if name is not None and not isinstance(name, str):
        raise ValueError(
            f"its refimpl_course.exercise is a {type(name).__name__} ({str(name)[:40]}), not "
            "a name"
        )
    if name is None and stem in EXERCISES:
        name = stem
    if name not in EXERCISES:
        where = (
            f"its metadata names {name!r}"
            if name is not None
            else "no refimpl_course.exercise in its metadata"
        )
        raise ValueError(
            f"not an exercise notebook ({where}); the exercises are {', '.join(EXERCISES)}"
        )
    if stem in EXERCISES and stem != name:
        raise ValueError(
            f"its metadata names exercise {name}, but the file is named {stem}.ipynb"
        )
    return EXERCISES[name]


def cell_role(cell) -> str | None:
    """The cell's role; without our metadata (a tool dropped it), nbgrader's flags decide."""
    role = _course_metadata(cell).get("role")
    if role is not None:
        return role
    nbgrader = cell.get("metadata", {}).get("nbgrader", {})
    if not isinstance(nbgrader, dict):
        return None
    if nbgrader.get("solution"):
        return "solution"
    if nbgrader.get("grade"):
        return "check"
    if nbgrader.get("grade_id") == "setup":
        return "setup"
    return None


# --- stubs
_DEF = re.compile(r"^(\s*)(?:async\s+)?def\s+(\w+)|^(\s*)class\s+(\w+)")


def _enclosing_name(lines: list[str], index: int) -> str:
    """Qualified name of the function (and class) around line `index`:
    'BlockManager.allocate'."""
    indent = len(lines[index]) - len(lines[index].lstrip())
    names = []
    for line in reversed(lines[:index]):
        match = _DEF.match(line)
        if not match:
            continue
        own = len(match.group(1) if match.group(1) is not None else match.group(3))
        if own < indent:
            names.append(match.group(2) or match.group(4))
            indent = own
            if own == 0:
                break
    return ".".join(reversed(names)) or "this cell"


def stub_message(exercise: Exercise, where: str) -> str:
    """'Exercise N: <where> is not written yet ... then run <the check for that name>.'"""
    own = [(c, t) for c, t in exercise.checks if where.split(".")[0] == t] or list(
        exercise.checks
    )
    checks = " and ".join(f"{check}({target})" for check, target in own)
    number = exercise.title.split(":")[0]
    return (
        f"{number}: {where} is not written yet. Write it in place of this raise, "
        f"then run {checks}."
    )


def strip_solutions(source: str, exercise: Exercise) -> str:
    """Replace each BEGIN/END SOLUTION region by a stub raising NotImplementedError."""
    lines = source.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == BEGIN:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == END), None)
            if end is None:
                raise ValueError(f"{BEGIN} without {END} in:\n{source}")
            indent = line[: len(line) - len(line.lstrip())]
            message = stub_message(exercise, _enclosing_name(lines, i))
            out.append(f"{indent}# YOUR CODE HERE")
            out.append(f"{indent}raise NotImplementedError({message!r})")
            i = end + 1
            continue
        if line.strip() == END:
            raise ValueError(f"{END} without {BEGIN} in:\n{source}")
        out.append(line)
        i += 1
    return "\n".join(out)


def make_student_copy(solution):
    """The student notebook for a solution notebook (a new NotebookNode; the input is
    untouched)."""
    exercise = exercise_for(solution)
    student = copy.deepcopy(solution)
    for cell in student.cells:
        cell.metadata.pop("execution", None)  # run timestamps of the solution's last execution
        if cell.cell_type != "code":
            continue
        cell.outputs = []
        cell.execution_count = None
        if BEGIN in cell.source:
            cell.source = strip_solutions(cell.source, exercise)
    return student


def _student_text(solution_path: Path) -> str:
    import nbformat

    solution = nbformat.read(solution_path, as_version=4)
    return nbformat.writes(make_student_copy(solution)) + "\n"


def generate(root: Path = Path(".")) -> list[Path]:
    """Write every student copy; return the paths written."""
    written = []
    for solution_path in sorted((root / SOLUTIONS_DIR).glob("[0-9]*.ipynb")):
        target = root / STUDENT_DIR / solution_path.name
        target.write_text(_student_text(solution_path), encoding="utf-8")
        written.append(target)
    return written


def stale_copies(root: Path = Path(".")) -> list[str]:
    """Student copies that are missing or differ from what `generate` would write."""
    stale = []
    for solution_path in sorted((root / SOLUTIONS_DIR).glob("[0-9]*.ipynb")):
        target = root / STUDENT_DIR / solution_path.name
        if not target.exists() or target.read_text(encoding="utf-8") != _student_text(
            solution_path
        ):
            stale.append(str(target.relative_to(root)))
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m grader.exercises",
        description="Generate or check the student copies of the exercise notebooks.",
    )
    parser.add_argument("action", choices=["generate", "check"])
    parser.add_argument(
        "--root",
        type=Path,
        default=Path("."),
        help="repository root (default: current directory)",
    )
    args = parser.parse_args(argv)
    if args.action == "generate":
        for path in generate(args.root):
            print(f"wrote {path}")
        return 0
    stale = stale_copies(args.root)
    if stale:
        print("stale student copies (run `make exercises`): " + ", ".join(stale))
        return 1
    count = len(list((args.root / SOLUTIONS_DIR).glob("[0-9]*.ipynb")))
    print(f"{count} student copies are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
