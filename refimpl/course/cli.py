"""`python -m refimpl grade NOTEBOOK...`: grade exercise notebooks and print the tables and a score.

Exit status: 0 when every check of every notebook passed, 1 when some check failed or a notebook
could not be graded, 2 for bad arguments (argparse's convention).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "grade",
        help="grade exercise notebooks (prints a PASS/FAIL table and a score per notebook)",
        description=(
            "Run the setup and solution cells of each exercise notebook in a fresh Python process, "
            "replay the matching graders against the reference implementation, and print the "
            "PASS/FAIL table and a score."
        ),
    )
    parser.add_argument("notebooks", nargs="+", type=Path, help="exercise notebooks (.ipynb) to grade")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per notebook (default 120)")
    parser.add_argument("--csv", type=Path, default=None, help="also write one row per notebook to this CSV file")
    parser.add_argument("--quiet", action="store_true", help="print only the score lines, not the tables")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from refimpl.course.grading import grade_notebook

    grades = []
    for path in args.notebooks:
        if not path.is_file():
            print(f"== {path}\nscore: 0 (no such file)")
            grades.append(None)
            continue
        grade = grade_notebook(path, timeout=args.timeout)
        grades.append(grade)
        print(f"== {path} ({grade.exercise})")
        if not args.quiet:
            for table in grade.tables:
                print(table)
        print(grade.score_line())
    if len(args.notebooks) > 1:
        total = sum(g.num_checks for g in grades if g is not None)
        passed = sum(g.num_passed for g in grades if g is not None and g.error is None)
        print(f"== total: {passed}/{total} checks passed over {len(args.notebooks)} notebooks")
    if args.csv is not None:
        with args.csv.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["notebook", "exercise", "passed", "checks", "failed_checks", "error"])
            for path, grade in zip(args.notebooks, grades):
                if grade is None:
                    writer.writerow([str(path), "", 0, 0, "", "no such file"])
                    continue
                failed = ";".join(f"{g}:{c}" for g, c, ok in grade.rows if not ok)
                writer.writerow([str(path), grade.exercise, grade.num_passed, grade.num_checks, failed, grade.error or ""])
    return 0 if all(g is not None and g.passed for g in grades) else 1
