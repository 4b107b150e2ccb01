"""How long `python -m grader` takes to grade a class of N student notebooks.

    python benchmarks/grade_class.py                # 25 students, the six exercises in turn
    python benchmarks/grade_class.py --students 6   # quicker

Each student folder gets one exercise solution (01, 02, ... 06, 01, ...), copied as a student
would hand it in, and the whole class is graded by one `python -m grader --csv` run, as an
instructor runs it. Reported: wall-clock seconds, CPU seconds of the grader and every process
it started (user + system, from `getrusage(RUSAGE_CHILDREN)`), and the checks passed; every
notebook must get full marks, or the script exits with 1. The goal (issue 29): a class of 25 in
at most 60 s on 2 cores. Wall time depends on what else the machine runs; CPU time much less.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "notebooks" / "exercises" / "solutions"


def make_class(folder: Path, students: int) -> list[Path]:
    """One folder per student, each holding one solution notebook, exercises taken in turn."""
    solutions = sorted(SOLUTIONS.glob("[0-9]*.ipynb"))
    handed_in = []
    for i in range(students):
        source = solutions[i % len(solutions)]
        student = folder / f"student_{i + 1:02d}"
        student.mkdir()
        handed_in.append(Path(shutil.copy(source, student / source.name)))
    return handed_in


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=25)
    args = parser.parse_args(argv)
    if args.students < 1:
        parser.error("--students must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        notebooks = make_class(Path(tmp), args.students)
        table = Path(tmp) / "grades.csv"
        command = [sys.executable, "-m", "grader", "--quiet", "--csv", str(table)]
        if os.geteuid() == 0:  # a throwaway container or CI machine
            command.append("--allow-root")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        subprocess.run([*command, *map(str, notebooks)], check=True, cwd=ROOT)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(table, newline="") as handle:
            rows = list(csv.DictReader(handle))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    passed = sum(int(row["passed"]) for row in rows)
    checks = sum(int(row["checks"]) for row in rows)
    full = sum(row["passed"] == row["checks"] for row in rows)
    print(
        f"{len(rows)} notebooks graded: {passed}/{checks} checks, {full} with full marks; "
        f"{wall:.1f} s wall, {cpu:.1f} s CPU (grader and children), {os.cpu_count()} CPUs"
    )
    return 0 if full == len(rows) == args.students else 1


if __name__ == "__main__":
    sys.exit(main())
