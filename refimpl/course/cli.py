"""`python -m refimpl grade NOTEBOOK|FOLDER...`: grade exercise notebooks and print the tables and a score.

Exit status: 0 when every check of every notebook passed, 1 when some check failed or a notebook
could not be graded, 2 for bad arguments (argparse's convention). Every argument is checked
before the first notebook runs, so a typo in `--csv` never costs a grading run.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

from refimpl.cli import DefaultsHelpFormatter

CSV_HEADER = ["notebook", "exercise", "passed", "checks", "failed_checks", "reason"]


def positive_seconds(text: str) -> float:
    """argparse type for `--timeout`: a finite number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def writable_csv_path(text: str) -> Path:
    """argparse type for `--csv`: a file path whose folder exists (the file itself is replaced)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name such as {path / 'grades.csv'}")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"folder {path.parent} does not exist; create it first")
    return path


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "grade",
        help="grade exercise notebooks (prints a PASS/FAIL table and a score per notebook)",
        description=(
            "Run the setup and solution cells of each exercise notebook in a fresh Python process, "
            "replay the matching graders against the reference implementation, and print the "
            "PASS/FAIL table and a score. Exercises are recognised by their notebook metadata."
        ),
        formatter_class=DefaultsHelpFormatter,
    )
    parser.add_argument("notebooks", nargs="+", type=Path, metavar="NOTEBOOK",
                        help="exercise notebooks (.ipynb), or folders whose .ipynb files are all graded")
    parser.add_argument("--timeout", type=positive_seconds, default=120.0, help="seconds allowed per notebook")
    parser.add_argument("--csv", type=writable_csv_path, default=None,
                        help="also write one row per notebook to this CSV file")
    parser.add_argument("--quiet", action="store_true", help="print only the score lines, not the tables")
    parser.set_defaults(func=main, parser_error=parser.error)


def expand_folders(paths: list[Path], error) -> list[Path]:
    """Folders stand for the notebooks directly inside them (sorted); files are kept as given.

    `error(message)` reports a folder with no notebook (the parser's one-line error).
    """
    expanded: list[Path] = []
    for path in paths:
        if not path.is_dir():
            expanded.append(path)
            continue
        notebooks = sorted(p for p in path.glob("*.ipynb") if p.is_file())
        if not notebooks:
            error(f"folder {path} holds no .ipynb notebooks")
        expanded.extend(notebooks)
    return expanded


def main(args: argparse.Namespace) -> int:
    from refimpl.course.exercises import EXERCISES
    from refimpl.course.grading import NotebookGrade, grade_missing, grade_notebook

    paths = expand_folders(args.notebooks, args.parser_error)

    grades: list[NotebookGrade] = []
    for path in paths:
        if path.is_file():
            grade = grade_notebook(path, timeout=args.timeout)
        elif path.stem in EXERCISES:  # not handed in: its checks still count in the total
            grade = grade_missing(path, EXERCISES[path.stem])
        else:
            grade = NotebookGrade(str(path), "?", error="no such file")
        grades.append(grade)
        print(f"== {path} ({grade.exercise})")
        if not args.quiet:
            for table in grade.tables:
                print(table)
        print(grade.score_line())
    if len(paths) > 1:
        total = sum(g.num_checks for g in grades)
        passed = sum(g.num_passed for g in grades)
        print(f"== total: {passed}/{total} checks passed over {len(paths)} notebooks")
    if args.csv is not None:
        with args.csv.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(CSV_HEADER)
            for grade in grades:
                failed = ";".join(f"{g}:{c}" for g, c, ok in grade.rows if not ok)
                writer.writerow([grade.path, grade.exercise, grade.num_passed, grade.num_checks, failed, grade.why])
    return 0 if all(g.passed for g in grades) else 1
