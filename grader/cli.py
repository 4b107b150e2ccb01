"""`python -m grader NOTEBOOK|FOLDER...` (or `python -m refimpl grade ...`): grade exercise
notebooks and print the tables and a score.

Exit status: 0 when every check of every notebook passed, 1 when some check failed or a
notebook could not be graded, 2 for bad arguments (argparse's convention). Every argument is
checked before the first notebook runs, so a typo in `--csv` never costs a grading run.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from pathlib import Path

from refimpl.cli import DefaultsHelpFormatter

ALLOW_ROOT = "GRADER_ALLOW_ROOT"  # =1: the same as --allow-root (for test suites run as root)
CSV_HEADER = ["notebook", "exercise", "passed", "checks", "failed_checks", "reason"]


MIN_TIMEOUT, MAX_TIMEOUT = 1.0, 24 * 3600.0  # seconds per notebook


def positive_seconds(text: str) -> float:
    """argparse type for `--timeout`: seconds per notebook, from 1 s (a child needs about a
    second to start) to a day."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds, got {text!r}"
        ) from None
    if not math.isfinite(value) or not MIN_TIMEOUT <= value <= MAX_TIMEOUT:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds from {MIN_TIMEOUT:g} to {MAX_TIMEOUT:g}, got {text}"
        )
    return value


MAX_DEFAULT_JOBS = 4


def positive_jobs(text: str) -> int:
    """argparse type for `--jobs`: a whole number from 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def writable_csv_path(text: str) -> Path:
    """argparse type for `--csv`: a file path whose folder exists (the file itself is
    replaced)."""
    path = Path(text)
    if path.suffix.lower() == ".ipynb":
        raise argparse.ArgumentTypeError(
            f"{text} is a notebook's name; give the grade file a name such as grades.csv "
            "(did a pattern such as subs/*/01_block_manager.ipynb follow --csv?)"
        )
    if path.is_symlink():
        raise argparse.ArgumentTypeError(f"{text} is a symbolic link; give a plain file name")
    if path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text} is a folder; give a file name such as {path / 'grades.csv'}"
        )
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"folder {path.parent} does not exist; create it first"
        )
    return path


DESCRIPTION = (
    "Run the setup and solution cells of each exercise notebook in a separate, "
    "restricted "
    "Python process that only answers the grader's calls, replay the matching graders "
    "here "
    "against the reference implementation, and print the PASS/FAIL table and a score. "
    "Exercises are recognised by their notebook metadata. Not a sandbox for hostile "
    "code: "
    "see notebooks/exercises/README.md."
)


def add_parser(subparsers) -> None:
    """`python -m refimpl grade`: the same arguments as `python -m grader`."""
    parser = subparsers.add_parser(
        "grade",
        help="grade exercise notebooks (prints a PASS/FAIL table and a score per notebook)",
        description=DESCRIPTION,
        formatter_class=DefaultsHelpFormatter,
    )
    add_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The grading command's arguments and options."""
    parser.add_argument(
        "notebooks",
        nargs="+",
        type=Path,
        metavar="NOTEBOOK",
        help="exercise notebooks (.ipynb), or folders: every entry named *.ipynb in one gets "
        "a row (a score, or why it is not graded)",
    )
    parser.add_argument(
        "--timeout", type=positive_seconds, default=120.0, help="seconds allowed per notebook"
    )
    parser.add_argument(
        "--csv",
        type=writable_csv_path,
        default=None,
        help="also write one row per notebook to this CSV file",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="print only the score lines, not the tables"
    )
    parser.add_argument(
        "--jobs",
        type=positive_jobs,
        default=None,
        help="notebooks graded at once (default: one per CPU, at most "
        f"{MAX_DEFAULT_JOBS}); more than one only where Landlock keeps the graded code out "
        "of the notebooks' folders",
    )
    parser.add_argument(
        "--no-sandbox",
        dest="sandbox",
        action="store_false",
        help="do not restrict the graded code's files (Landlock) nor its sockets (seccomp); "
        "resource limits and the cap on what it writes stay",
    )
    parser.add_argument(
        "--allow-root",
        action="store_true",
        help="grade even when running as root (resource limits do not bind root, and a "
        "process cap needs a pids cgroup); also GRADER_ALLOW_ROOT=1",
    )
    parser.set_defaults(func=main, parser_error=parser.error)


def running_as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


class GradeSheet:
    """The CSV file: its header at once, then one row per notebook, each flushed as it is
    written.

    It remembers every row, and notices when the file changed behind its back (graded code
    writing to it): `tampered()` says so, and `rewrite()` puts the rows back, into a new file
    (a link put in its place is removed, never followed).
    """

    def __init__(self, path: Path) -> None:
        self.path = path.absolute()
        self.rows: list[list[str]] = [CSV_HEADER]
        self._write(self.rows, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)

    def write(self, row: list[str]) -> None:
        self.rows.append(row)
        self._write([row], os.O_WRONLY | os.O_APPEND)

    def rewrite(self) -> None:
        self.path.unlink(missing_ok=True)
        self._write(self.rows, os.O_WRONLY | os.O_CREAT | os.O_EXCL)

    def tampered(self) -> bool:
        return _signature(self.path) != self._seen

    def _write(self, rows: list[list[str]], flags: int) -> None:
        fd = os.open(self.path, flags | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "w", newline="") as handle:
            csv.writer(handle).writerows(rows)
        self._seen = _signature(self.path)


def _same_file(path: Path, paths: list[Path]) -> bool:
    """Whether `path` names one of `paths` (the same name, or the same file)."""
    target = path.resolve()
    for other in paths:
        if other.resolve() == target:
            return True
        try:
            if os.path.samefile(other, path):
                return True
        except OSError:
            continue
    return False


def _signature(path: Path) -> tuple | None:
    """What changes when a file is written, replaced or removed (size, time, inode)."""
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _jobs(asked: int | None, settings, notebooks: int) -> int:
    """How many notebooks to grade at once.

    Several only under Landlock: there the kernel keeps the graded code out of the notebooks'
    folders and the grade file's, so a change to them cannot come from a notebook graded at
    the same time as another (without it, a change must be pinned on the one notebook that
    ran).
    """
    from grader.sandbox.limits import landlock_abi

    if notebooks < 2 or not settings.sandbox or landlock_abi() == 0:
        if asked is not None and asked > 1:
            print(
                "note: grading one notebook at a time (--jobs needs Landlock and the sandbox)",
                file=sys.stderr,
            )
        return 1
    if asked is not None:
        return min(asked, notebooks)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cpus or 1, MAX_DEFAULT_JOBS, notebooks))


def _grade_one(path: Path, content: bytes | str | None, timeout: float, settings):
    """The grade of one notebook (in a worker process when several are graded at once);
    `content` is its bytes, or why they could not be read."""
    from grader.exercises.catalogue import EXERCISES
    from grader.grading import exercise_hint, failed_grade, grade_missing, grade_notebook

    if isinstance(content, bytes):
        return grade_notebook(path, timeout=timeout, content=content, settings=settings)
    # not handed in: its checks still count in the total
    if path.stem in EXERCISES and not os.path.lexists(path):
        return grade_missing(path, EXERCISES[path.stem])
    if content is not None:
        return failed_grade(path, exercise_hint(path, None), content)
    # says why it cannot be read
    return grade_notebook(path, timeout=timeout, settings=settings)


def _graded(paths: list[Path], contents: list, timeout: float, settings, jobs: int):
    """(path, grade) for every notebook, in the order given, graded `jobs` at a time.

    Each worker is a process of its own (forked once everything every notebook needs is
    imported), so it is the subreaper of its own grading children and finds their strays.
    """
    if jobs == 1:
        for path, content in zip(paths, contents):
            yield path, _grade_one(path, content, timeout, settings)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from grader.exercises.catalogue import EXERCISES
    from grader.grading import failed_grade, warm_up

    warm_up()
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = [
            pool.submit(_grade_one, path, content, timeout, settings)
            for path, content in zip(paths, contents)
        ]
        for path, future in zip(paths, futures):
            try:
                yield path, future.result()
            except Exception as exc:  # a worker killed (out of memory, say) costs one row
                why = f"the grader's worker process failed on it ({type(exc).__name__})"
                yield path, failed_grade(path, EXERCISES.get(path.stem), why)


def _csv_row(grade) -> list[str]:
    failed = ";".join(f"{g}:{c}" for g, c, ok in grade.rows if not ok)
    return [
        grade.path,
        grade.exercise,
        str(grade.num_passed),
        str(grade.num_checks),
        failed,
        grade.why,
    ]


def _sandbox_note(settings) -> str:
    """What the graded code can reach on this machine, when it is more than its own folder."""
    import tempfile

    from grader.grading import solution_folders
    from grader.sandbox.limits import file_rules, landlock_abi

    if not settings.sandbox:
        return "--no-sandbox: the graded code can read and write this user's files"
    if landlock_abi() == 0:
        return (
            "this system has no Landlock (Linux 5.13 or later): the graded code can read and "
            "write this "
            "user's files, the solutions included; grade in a container (see "
            "notebooks/exercises/README.md)"
        )
    return file_rules(tempfile.gettempdir(), [*settings.protected, *solution_folders()]).note


def main(args: argparse.Namespace) -> int:
    from grader.grading import GradingSettings, NotebookGrade

    if os.name != "posix":
        args.parser_error(
            "grading needs Linux or macOS (on Windows, use WSL2); check_* in a notebook works "
            "everywhere"
        )
    if running_as_root() and not (args.allow_root or os.environ.get(ALLOW_ROOT) == "1"):
        args.parser_error(
            "refusing to grade as root: the graded code could raise its own limits; run as an "
            "unprivileged user (in a throwaway container), or pass --allow-root"
        )
    from grader.intake import expand_folders, read_all

    paths = expand_folders(args.notebooks, args.parser_error)
    if args.csv is not None and _same_file(args.csv, paths):
        args.parser_error(f"--csv {args.csv} is one of the notebooks to grade")
    contents = read_all(paths)
    watched = [p for p in paths if p.is_file()]
    protected = {str(p.resolve().parent) for p in paths if p.parent.is_dir()}
    if args.csv is not None:
        protected.add(str(args.csv.resolve().parent))
    settings = GradingSettings(protected=tuple(sorted(protected)), sandbox=args.sandbox)
    note = _sandbox_note(settings)
    if note:
        print(f"note: {note}", file=sys.stderr)
    sheet = GradeSheet(args.csv) if args.csv is not None else None

    jobs = _jobs(args.jobs, settings, len(paths))
    grades: list[NotebookGrade] = []
    before = {p: _signature(p) for p in watched}
    for path, grade in _graded(paths, contents, args.timeout, settings, jobs):
        changed = [str(p) for p in watched if _signature(p) != before[p]]
        before = {p: _signature(p) for p in watched}
        if sheet is not None and sheet.tampered():
            changed.append(str(args.csv))
            sheet.rewrite()
        if changed:
            grade.void(f"changed files it must not touch ({', '.join(changed)})")
        grades.append(grade)
        print(f"== {path} ({grade.exercise})")
        if not args.quiet:
            for table in grade.tables:
                print(table)
        print(grade.score_line(), flush=True)
        if sheet is not None:
            sheet.write(_csv_row(grade))
    # always: a run whose one notebook was refused still ends with its count
    total = sum(g.num_checks for g in grades)
    passed = sum(g.num_passed for g in grades)
    notebooks = "1 notebook" if len(paths) == 1 else f"{len(paths)} notebooks"
    print(f"== total: {passed}/{total} checks passed over {notebooks}")
    return 0 if all(g.passed for g in grades) else 1
