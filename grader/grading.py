"""Grade a student's notebook: its code runs in a child process, the graders run here.

Only the cells the exercise needs are run (role "setup" and "solution", see
`grader.exercises.catalogue`), in notebook order, in a child process (`grader.sandbox.remote`)
that answers the graders' calls and decides nothing: every scenario is replayed here against
the reference, and each answer is compared here. A scenario still running after `time_limit`
seconds fails its row (the child is replaced for the next one), and the whole notebook gets
`timeout` seconds.

Whatever goes wrong with one notebook (unreadable, not an exercise, malformed metadata, a crash
of its code, a time-out, processes left running) becomes that notebook's grade with its reason:
`grade_notebook` does not raise, and a notebook of a known exercise always counts every check
of that exercise, failed, when it could not be graded.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path

from grader.exercises.catalogue import EXERCISES, Exercise, cell_role, exercise_for
from grader.lockstep.report import GradeReport
from grader.lockstep.time_limit import DEFAULT_TIME_LIMIT, check_time_limit
from grader.sandbox.limits import Limits
from grader.sandbox.remote import ChildSettings, GradingChild, RemoteStudent, StartFailed

MAX_NOTEBOOK_BYTES = 20 * 2**20  # an exercise notebook with outputs is well under 1 MB


@dataclass
class NotebookGrade:
    """The outcome of grading one notebook."""

    path: str
    exercise: str
    tables: list[str] = field(default_factory=list)
    rows: list[tuple[str, str, bool]] = field(default_factory=list)  # (grader, check, passed)
    # the notebook could not be graded, or its score was voided (timeout, unreadable, ...)
    error: str | None = None
    # why checks failed wholesale: not implemented, a syntax error, the reference
    reason: str | None = None

    @property
    def num_passed(self) -> int:
        return sum(passed for _, _, passed in self.rows)

    @property
    def num_checks(self) -> int:
        return len(self.rows)

    @property
    def passed(self) -> bool:
        return (
            self.error is None and self.num_checks > 0 and self.num_passed == self.num_checks
        )

    @property
    def why(self) -> str:
        """One phrase saying why the notebook lost its checks ("" when nothing went wrong
        wholesale)."""
        return "; ".join(part for part in (self.error, self.reason) if part)

    def void(self, why: str) -> None:
        """Score 0: every check fails (the tables still show what the code did), `why` says
        why."""
        self.rows = [(grader, check, False) for grader, check, _ in self.rows]
        self.error = why if self.error is None else f"{self.error}; {why}"

    def score_line(self) -> str:
        if self.error is not None and not self.rows:
            return f"score: 0 ({self.error})"
        percent = 100.0 * self.num_passed / self.num_checks if self.num_checks else 0.0
        line = f"score: {self.num_passed}/{self.num_checks} checks passed ({percent:.1f}%)"
        return f"{line}: {self.why}" if self.why else line


@dataclass(frozen=True)
class GradingSettings:
    """How every notebook of a run is graded (besides its time limits)."""

    limits: Limits = field(default_factory=Limits)
    # more folders the graded code must not read (the grade file's, the submissions')
    protected: tuple[str, ...] = ()
    sandbox: bool = True  # Landlock where available


def check_names(check_name: str) -> list[str]:
    """The rows of a grader, without running it."""
    from grader.exercises import (
        addressing_checks,
        hybrid_allocator_checks,
        hybrid_checks,
        paged_checks,
    )

    lists = {
        "check_window_frees": lambda: hybrid_allocator_checks.window_checks(None),
        "check_fixed_point_hit": lambda: hybrid_allocator_checks.hit_checks(None),
        "check_block_manager": lambda: paged_checks.block_manager_checks(None),
        "check_prefix_cache": lambda: paged_checks.prefix_cache_checks(None),
        "check_scheduler": lambda: paged_checks.scheduler_checks(None),
        "check_approximate_gcd": hybrid_checks.approximate_gcd_checks,
        "check_packed_groups": hybrid_checks.packed_groups_checks,
        "check_packed_layout": hybrid_checks.packed_layout_checks,
        "check_swa_indices": addressing_checks.swa_indices_checks,
    }
    return [row[0] for row in lists[check_name]()]


def failed_grade(path: str | Path, exercise: Exercise | None, why: str) -> NotebookGrade:
    """A notebook that could not be graded: every check of its exercise fails, so totals stay
    fair."""
    if exercise is None:
        return NotebookGrade(str(path), "?", error=why)
    rows = [
        (grader, name, False) for grader, _ in exercise.checks for name in check_names(grader)
    ]
    return NotebookGrade(str(path), exercise.name, rows=rows, error=why)


def grade_missing(path: str | Path, exercise: Exercise) -> NotebookGrade:
    """A notebook that was not handed in: every check of its exercise fails, so totals stay
    fair."""
    return failed_grade(path, exercise, "no such file")


def _strip_magics(source: str) -> str:
    """Drop IPython-only lines (%magics, !shell) so the cell runs in plain Python."""
    return "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n")
    )


def notebook_program(notebook) -> list[tuple[int, str]]:
    """(cell number, source) of the cells the grader runs: setup and solution cells."""
    program = []
    for index, cell in enumerate(notebook.cells, start=1):
        if cell.cell_type == "code" and cell_role(cell) in ("setup", "solution"):
            program.append((index, _strip_magics(cell.source)))
    return program


@dataclass(frozen=True)
class Submission:
    """A notebook's bytes as intake read them, with what tells its names apart: the opened
    file's status and the status of the folder its name sits in (both read through the open
    descriptors, so they describe what was read)."""

    path: Path
    content: bytes
    file: os.stat_result
    folder: os.stat_result

    @property
    def inode(self) -> tuple[int, int]:
        """The file, whatever it is called."""
        return (self.file.st_dev, self.file.st_ino)

    @property
    def entry(self) -> tuple[int, int, str]:
        """The name: its folder and its last component (equal for one name given twice)."""
        return (self.folder.st_dev, self.folder.st_ino, self.path.name)


def open_submission(path: Path) -> Submission:
    """The regular file at `path`, read without following any link; ValueError (naming what the
    path is, never what it holds) for a link anywhere on the path, a folder, a device, a pipe.
    A file with several names (hard links) is read: which name to grade is the caller's
    decision (`grader.intake`)."""
    fd, folder = _open_without_links(path)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        # the file may have been swapped between the checks and the open: check what was opened
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"it is {_kind(info.st_mode)}, not a regular file")
        return Submission(Path(path), handle.read(MAX_NOTEBOOK_BYTES + 1), info, folder)


def read_submission(path: Path, seen: dict[tuple[int, int], str] | None = None) -> bytes:
    """The bytes of the regular file at `path`, reached without following any link; ValueError
    (naming what the path is, never what it holds) for a link anywhere on the path, a file with
    other names (hard links), a folder, a device, a pipe.

    A link would let one student hand in another's notebook (or any file the grader can read).
    `seen` maps (device, inode) to the path of every file read so far in this run: a file given
    twice is refused the second time. (A class run tells hard-linked names apart instead:
    `grader.intake.read_all`.)
    """
    submission = open_submission(path)
    if submission.file.st_nlink > 1:
        raise ValueError(
            f"it has {submission.file.st_nlink} names (hard links); hand in a file of its own"
        )
    if seen is not None:
        if submission.inode in seen:
            raise ValueError(f"it is the same file as {seen[submission.inode]}")
        seen[submission.inode] = str(path)
    return submission.content


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    return next((words for test, words in _KINDS if test(mode)), "a special file")


def _open_without_links(path: Path) -> tuple[int, os.stat_result]:
    """A read-only descriptor for `path`, opened one component at a time, each without
    following a link (a relative path starts at the working folder, however it was reached),
    and the status of the folder it was opened in; ValueError naming the first link, or what
    else is in the way."""
    text = os.fspath(path)
    parts = [part for part in text.split(os.sep) if part not in ("", ".")]
    if not parts:
        raise ValueError("it is not a regular file")
    no_follow = getattr(os, "O_NOFOLLOW", 0)
    walked = os.sep if os.path.isabs(text) else ""
    fd = os.open(walked or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            shown = os.path.join(walked, part)
            try:
                info = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except OSError as exc:
                raise ValueError(_cannot_read(exc)) from None
            if stat.S_ISLNK(info.st_mode):
                raise ValueError(
                    "it is a symbolic link; hand in the notebook file itself"
                    if last
                    else f"its path goes through a symbolic link ({shown}); hand in the "
                    "notebook file itself, in a real folder"
                )
            if last and not stat.S_ISREG(info.st_mode):
                raise ValueError(f"it is {_kind(info.st_mode)}, not a regular file")
            if not last and not stat.S_ISDIR(info.st_mode):
                raise ValueError(f"cannot read it ({shown} is not a folder)")
            flags = os.O_RDONLY | no_follow
            flags |= getattr(os, "O_NONBLOCK", 0) if last else getattr(os, "O_DIRECTORY", 0)
            if last:
                folder = os.fstat(fd)
            try:
                inner = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                raise ValueError(_cannot_read(exc)) from None
            os.close(fd)
            fd, walked = inner, shown
    except BaseException:
        os.close(fd)
        raise
    return fd, folder


def _cannot_read(exc: OSError) -> str:
    return f"cannot read it ({exc.strerror or type(exc).__name__})"


def warm_up() -> None:
    """Import and compute, once, what grading any notebook needs (nbformat, the reference
    code and the files the child may not read), so that workers forked afterwards share it."""
    import nbformat  # noqa: F401

    from grader.exercises.reference_code import reference_sources

    reference_sources()


# the submission's fault: a notebook is a few levels deep, a nesting bomb is thousands
TOO_DEEP = (
    "cannot read it as a notebook: its JSON nests deeper than Python's recursion limit "
    "(a nesting bomb, not a notebook)"
)


def read_notebook(path: Path, content: bytes | None = None):
    """The notebook at `path` (or in `content`, read earlier); ValueError saying what is wrong
    with it. No message quotes the file: a link to another file must not leak its text."""
    import nbformat

    if content is None:
        content = read_submission(path)
    if len(content) > MAX_NOTEBOOK_BYTES:
        raise ValueError(f"it is larger than {MAX_NOTEBOOK_BYTES // 2**20} MB")
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"cannot read it as a notebook: UnicodeDecodeError (byte {exc.start} is not UTF-8)"
        ) from None
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"cannot read it as a notebook: it is not JSON (line {exc.lineno}, column "
            f"{exc.colno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    try:
        # capture_validation_error: a schema problem is ours to report (below), not a log line
        notebook = nbformat.reads(text, as_version=4, capture_validation_error={})
    except RecursionError:  # shallow enough for json, too deep for the schema's walk
        raise ValueError(TOO_DEEP) from None
    except Exception as exc:  # not a notebook: nbformat raises many kinds, some quoting it
        raise ValueError(f"cannot read it as a notebook: {type(exc).__name__}") from None
    cells = notebook.get("cells")
    if not isinstance(cells, list):
        raise ValueError("cannot read it as a notebook: it has no list of cells")
    for index, cell in enumerate(cells, start=1):
        if not (
            isinstance(cell, dict)
            and isinstance(cell.get("cell_type"), str)
            and isinstance(cell.get("source"), str)
        ):
            raise ValueError(
                f"cannot read it as a notebook: cell {index} is not a cell with text"
            )
    return notebook


def exercise_hint(path: Path, content: bytes | None) -> Exercise | None:
    """The exercise a notebook that cannot be read claims to be (its metadata, or its file
    name), so that its checks still count; None when it names none it could be."""
    claimed = None
    try:
        metadata = json.loads((content or b"").decode("utf-8")).get("metadata", {})
        claimed = metadata.get("refimpl_course", {}).get("exercise")
    except (ValueError, AttributeError, RecursionError):
        pass
    if path.stem in EXERCISES:
        return EXERCISES[path.stem]  # handed in as this exercise
    return EXERCISES.get(claimed) if isinstance(claimed, str) else None


def grade_notebook(
    path: str | Path,
    *,
    timeout: float = 120.0,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
    content: bytes | None = None,
    settings: GradingSettings | None = None,
) -> NotebookGrade:
    """Run the notebook's setup and solution cells in a child process and grade what they
    define.

    `timeout` bounds the whole notebook; `time_limit` each grader scenario. `content` is the
    file's bytes when they were read earlier (a batch reads every notebook before running any).
    """
    path = Path(path)
    time_limit = check_time_limit(time_limit)
    try:
        if content is None:
            content = read_submission(path)
        notebook = read_notebook(path, content)
        exercise = exercise_for(notebook, path)
        program = notebook_program(notebook)
    except ValueError as exc:
        return failed_grade(path, exercise_hint(path, content), str(exc))
    try:
        return _grade_program(
            path, exercise, program, timeout, time_limit, settings or GradingSettings()
        )
    # a failure of the grader itself must cost this row, not the class
    except Exception as exc:
        return failed_grade(
            path, exercise, f"the grader failed on it ({type(exc).__name__}: {exc})"
        )


def _grade_program(
    path: Path,
    exercise: Exercise,
    program: list[tuple[int, str]],
    timeout: float,
    time_limit: float | None,
    settings: GradingSettings,
) -> NotebookGrade:
    import grader as course

    child_settings = ChildSettings(
        cells=program,
        checks=[grader for grader, _ in exercise.checks],
        targets=[target for _, target in exercise.checks],
        # a backstop: the deadline ends it first
        limits=replace(settings.limits, cpu_seconds=math.ceil(timeout) + 10),
        protected=tuple(
            sorted({*settings.protected, str(path.resolve().parent), *solution_folders()})
        ),
        sandbox=settings.sandbox,
    )
    with GradingChild(child_settings, timeout) as child:
        try:
            child.start()
        except StartFailed as failed:
            grade = failed_grade(path, exercise, str(failed))
        else:
            reports = [
                getattr(course, grader)(
                    RemoteStudent(child, target), verbose=False, time_limit=time_limit
                )
                for grader, target in exercise.checks
            ]
            grade = NotebookGrade(
                str(path),
                exercise.name,
                [r.table() for r in reports],
                [
                    (grader, row.name, row.passed)
                    for (grader, _), r in zip(exercise.checks, reports)
                    for row in r.results
                ],
                reason=_reasons(child, reports, child_settings.targets),
            )
            if child.expired:
                grade.error = f"timed out after {timeout:g} s"
    if child.overflow:
        grade.void(child.overflow)
    if child.stray:
        grade.void(
            f"left {child.stray} process{'es' if child.stray > 1 else ''} running after "
            "grading (killed)"
        )
    return grade


def solution_folders() -> list[str]:
    """The course's notebooks folder when refimpl runs from a checkout (it holds the
    solutions)."""
    import refimpl

    notebooks = Path(refimpl.__file__).resolve().parent.parent / "notebooks"
    return [str(notebooks)] if notebooks.is_dir() else []


_REFERENCE = "the reference's "  # how `reference_complaint` starts what it found


def _reasons(
    child: GradingChild, reports: list[GradeReport], targets: list[str]
) -> str | None:
    """Why checks failed wholesale, from the cells' outcome and the rows' first differences."""
    reasons = (
        [child.problem]
        if child.problem
        else [f"does not define {target}" for target in child.missing]
    )
    for report, target in zip(reports, targets):
        for result in report.results:
            found = result.divergence.found if result.divergence else ""
            if found.startswith(_REFERENCE):
                reasons.append(
                    f"uses the reference ({found[len(_REFERENCE) :].split(' ')[0]})"
                )
            elif "did not finish within" in found:
                # "scenario X did not finish within 10 s"
                reasons.append(found.split(" and was stopped")[0])
            elif found.startswith("NotImplementedError"):
                # the stub message `make exercises` writes
                stub = re.search(r"(\S+) is not written yet", found)
                reasons.append(
                    f"not implemented ({stub.group(1) if stub else target} raises "
                    "NotImplementedError)"
                )
    reasons.extend(
        f"its code ended the process running it ({ending})" for ending in child.endings
    )
    return "; ".join(dict.fromkeys(reasons)) or None
