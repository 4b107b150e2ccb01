"""Grade a student's notebook: run its code in a fresh Python process, then run the graders.

Only the cells the exercise needs are run (role "setup" and "solution", see
`refimpl.course.exercises`), in notebook order, in a new interpreter with a time limit, so a
student's exploration cells, an endless loop or a crash cannot affect the grading process.
Inside it the graders apply the same limit per scenario as in a notebook
(`refimpl.course.time_limit`), so a loop inside one method fails the rows that call it and the
other rows are still graded.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from refimpl.course.exercises import Exercise, cell_role, exercise_for
from refimpl.course.time_limit import DEFAULT_TIME_LIMIT, check_time_limit


@dataclass
class NotebookGrade:
    """The outcome of grading one notebook."""

    path: str
    exercise: str
    tables: list[str] = field(default_factory=list)
    rows: list[tuple[str, str, bool]] = field(default_factory=list)  # (grader, check, passed)
    error: str | None = None  # the notebook could not be graded at all (timeout, unreadable)
    reason: str | None = None  # why checks failed wholesale: not implemented, a syntax error, the reference

    @property
    def num_passed(self) -> int:
        return sum(passed for _, _, passed in self.rows)

    @property
    def num_checks(self) -> int:
        return len(self.rows)

    @property
    def passed(self) -> bool:
        return self.error is None and self.num_checks > 0 and self.num_passed == self.num_checks

    @property
    def why(self) -> str:
        """One phrase saying why the notebook lost its checks ("" when nothing went wrong wholesale)."""
        return self.error or self.reason or ""

    def score_line(self) -> str:
        if self.error is not None and not self.rows:
            return f"score: 0 ({self.error})"
        percent = 100.0 * self.num_passed / self.num_checks if self.num_checks else 0.0
        line = f"score: {self.num_passed}/{self.num_checks} checks passed ({percent:.1f}%)"
        return f"{line}: {self.why}" if self.why else line


def _strip_magics(source: str) -> str:
    """Drop IPython-only lines (%magics, !shell) so the cell runs in plain Python."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n"))


def notebook_program(notebook) -> list[tuple[int, str]]:
    """(cell number, source) of the cells the grader runs: setup and solution cells."""
    program = []
    for index, cell in enumerate(notebook.cells, start=1):
        if cell.cell_type == "code" and cell_role(cell) in ("setup", "solution"):
            program.append((index, _strip_magics(cell.source)))
    return program


def grade_missing(path: str | Path, exercise: Exercise) -> NotebookGrade:
    """A notebook that was not handed in: every check of its exercise fails, so totals stay fair."""
    result = _run_graders({}, [list(c) for c in exercise.checks], "the file is missing")
    return NotebookGrade(str(path), exercise.name, result["tables"], [tuple(r) for r in result["rows"]],
                         error="no such file")


def grade_notebook(path: str | Path, *, timeout: float = 120.0, time_limit: float | None = DEFAULT_TIME_LIMIT) -> NotebookGrade:
    """Run the notebook's setup and solution cells in a subprocess and grade what they define.

    `timeout` bounds the whole subprocess; `time_limit` each grader scenario inside it.
    """
    import nbformat

    path = Path(path)
    time_limit = check_time_limit(time_limit)
    try:
        notebook = nbformat.read(path, as_version=4)
    except Exception as exc:  # not JSON, not a notebook, unreadable
        return NotebookGrade(str(path), "?", error=f"cannot read it as a notebook: {exc}")
    try:
        exercise = exercise_for(notebook, path)
    except ValueError as exc:
        return NotebookGrade(str(path), "?", error=str(exc))
    payload = {"cells": notebook_program(notebook), "checks": [list(c) for c in exercise.checks], "time_limit": time_limit}
    with tempfile.TemporaryDirectory(prefix="refimpl-grade-") as tmp:
        payload_path = Path(tmp) / "payload.json"
        result_path = Path(tmp) / "result.json"
        payload_path.write_text(json.dumps(payload))
        try:
            completed = subprocess.run(
                [sys.executable, "-m", "refimpl.course.grading", str(payload_path), str(result_path)],
                cwd=path.parent,
                timeout=timeout,
                capture_output=True,
                text=True,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return NotebookGrade(str(path), exercise.name, error=f"timed out after {timeout:g} s")
        if not result_path.exists():
            tail = (completed.stderr or "").strip().splitlines()[-1:] or ["no message"]
            return NotebookGrade(str(path), exercise.name, error=f"the grading process died before reporting: {tail[0]}")
        result = json.loads(result_path.read_text())
    return NotebookGrade(
        str(path), exercise.name, result["tables"], [tuple(row) for row in result["rows"]],
        reason=result.get("reason"),
    )


# --- inside the subprocess
def _missing(target: str, reason: str):
    """Stands in for a name the notebook did not define: every use raises NameError with the reason."""

    def fail(*args, **kwargs):
        raise NameError(f"{target} is not defined ({reason})")

    return type(target, (), {"__init__": fail}) if target[:1].isupper() else fail


def _cell_problem(index: int, exc: BaseException) -> str:
    """Why a cell stopped, in the words a grade sheet needs."""
    if isinstance(exc, NotImplementedError):
        return f"not implemented (cell {index} raises NotImplementedError)"
    if isinstance(exc, SyntaxError):
        return f"syntax error in cell {index} (line {exc.lineno}: {exc.msg})"
    return f"cell {index} raised {type(exc).__name__}: {exc}"


def _run_graders(namespace: dict, checks: list[list[str]], problem: str, graders: dict | None = None,
                 time_limit: float | None = DEFAULT_TIME_LIMIT) -> dict:
    """Run each grader on the name the notebook should define, and say why checks failed wholesale.

    `problem` is why names may be missing (a cell that raised, or `_NOT_DEFINED`); `graders` are
    the grader functions looked up before any student code ran (default: look them up now);
    `time_limit` bounds each grader scenario.
    """
    import refimpl.course as course

    tables, rows = [], []
    reasons = [] if problem == _NOT_DEFINED else [problem]
    for check_name, target in checks:
        student = namespace.get(target)
        if student is None:
            reasons.append(f"does not define {target}" if problem == _NOT_DEFINED else problem)
            student = _missing(target, problem)
        grader = graders[check_name] if graders is not None else getattr(course, check_name)
        report = grader(student, verbose=False, time_limit=time_limit)
        tables.append(report.table())
        rows.extend((check_name, r.name, r.passed) for r in report.results)
        for result in report.results:
            found = result.divergence.found if result.divergence else ""
            if found.startswith(_REFERENCE):
                reasons.append(f"uses the reference ({found[len(_REFERENCE):].split(' ')[0]})")
            elif "did not finish within" in found:
                reasons.append(found.split(" and was stopped")[0])  # "scenario X did not finish within 10 s"
            elif found.startswith("NotImplementedError"):
                stub = re.search(r"(\S+) is not written yet", found)  # the stub message `make exercises` writes
                reasons.append(f"not implemented ({stub.group(1) if stub else target} raises NotImplementedError)")
    return {"tables": tables, "rows": rows, "reason": "; ".join(dict.fromkeys(reasons)) or None}


_NOT_DEFINED = "the notebook does not define it"
_REFERENCE = "the reference's "  # how `ReferenceGuard.complaint` starts what it found


def _run_in_fresh_namespace(payload: dict) -> dict:
    import refimpl.course as course

    # Look the graders up before any student code runs, so a cell that rebinds
    # `refimpl.course.check_*` cannot swap in a lenient one.
    graders = {check_name: getattr(course, check_name) for check_name, _ in payload["checks"]}
    namespace: dict = {"__name__": "__main__"}
    problem = _NOT_DEFINED
    for index, source in payload["cells"]:
        try:
            exec(compile(source, f"<notebook cell {index}>", "exec"), namespace)
        except Exception as exc:  # the student's code may raise anything
            problem = _cell_problem(index, exc)
            break
    return _run_graders(namespace, payload["checks"], problem, graders, payload.get("time_limit", DEFAULT_TIME_LIMIT))


def _child_main(payload_path: str, result_path: str) -> int:
    import contextlib
    import io

    payload = json.loads(Path(payload_path).read_text())
    with contextlib.redirect_stdout(io.StringIO()):  # the student's prints are not part of the report
        result = _run_in_fresh_namespace(payload)
    Path(result_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1], sys.argv[2]))
