"""The reference's own code that each exercise asks students to write, and the two ways a grade
keeps it out.

An exercise is passed by writing the code, not by running refimpl's. Each grader lists the
reference functions its exercise asks for (`reference_code`: the names the exercise's notebook
asks students to write); the course's deliberately broken variants (`grader.exercises.broken`)
are full or partial copies of the reference, so they count too.

- In a notebook (`check_*`, the feedback path) a `ReferenceGuard` watches, with
  `sys.setprofile`, for that code starting while the student's side of a step runs. Code in
  the same process can switch a profiler off; that is fine for feedback.
- In the command-line grader (the trusted path) the student's code runs in a child process
  whose refimpl does not hold that code at all (`grader.exercises.answer_free`): what the
  exercise asks for is a stub that raises `ReferenceUsed`, and the course's copies cannot be
  imported.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import sys
import types
from pathlib import Path
from typing import Any

from grader.exercises.answer_free import ANSWERS, BLOCKED, ReferenceUsed, removed_names
from grader.lockstep.engine import ReferenceGuard, StudentSide

__all__ = [
    "ReferenceUsed",
    "course_copies",
    "grading_side",
    "reference_code",
    "reference_guard",
    "reference_sources",
]


def reference_code(check_name: str) -> list[tuple[Any, str]]:
    """(owner, attribute) of every reference function the exercise graded by `check_name` asks
    for, and of the reference's helpers that only those use (`grader.exercises.answer_free`:
    the functions the grading child's refimpl lacks)."""
    import importlib

    if check_name not in ANSWERS:
        raise ValueError(f"check_name must be one of {sorted(ANSWERS)}, got {check_name!r}")
    pairs: list[tuple[Any, str]] = []
    for module_name, owner_name, names in removed_names(check_name):
        module = importlib.import_module(module_name)
        owner = module if owner_name is None else getattr(module, owner_name)
        pairs.extend((owner, name) for name in names if _function_of(vars(owner)[name]))
    return pairs


def course_copies() -> list[tuple[Any, str]]:
    """(owner, attribute) of every function in `grader.exercises.broken` and in the grader's
    copies of the reference it edits (`reference_copies`, and `reference_copies_v4` once
    loaded), whole or in part.

    Only code compiled from those files or from an edited copy counts: the functions every
    class shares (a dataclass's `__repr__` wrapper, `object`'s methods) are no copy, and a
    student's code that runs them is never blamed for it.
    """
    from grader.exercises import broken, reference_copies

    modules = [broken, reference_copies]
    if "grader.exercises.reference_copies_v4" in sys.modules:
        modules.append(sys.modules["grader.exercises.reference_copies_v4"])
    files = {module.__file__ for module in modules}

    def own(member: Any) -> bool:
        function = _function_of(member)
        if function is None:
            return False
        filename = function.__code__.co_filename
        return filename in files or filename.endswith(", edited>")

    pairs = []
    for module in modules:
        for name, value in vars(module).items():
            if getattr(value, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(value) and own(value):
                pairs.append((module, name))
            elif inspect.isclass(value) and value is not broken.BrokenVariant:
                pairs.extend((value, a) for a, member in vars(value).items() if own(member))
    return pairs


def reference_sources() -> list[str]:
    """The files holding the reference code of every exercise and the course's copies of it
    (and their compiled caches), and the folders of the modules the child may not import (the
    course layer): the grading child may not read them, so it cannot load that code from its
    files (`exec(open(...).read())`, `spec_from_file_location`, a fresh Python) past its
    answer-free refimpl and its import block."""
    return list(_reference_sources())


@functools.cache  # the same for every child of a batch; finding it parses every answer module
def _reference_sources() -> tuple[str, ...]:
    from grader.exercises.catalogue import EXERCISES

    modules = {
        owner if isinstance(owner, types.ModuleType) else sys.modules[owner.__module__]
        for exercise in EXERCISES.values()
        for check, _ in exercise.checks
        for owner, _ in reference_code(check)
    }
    sources = [Path(module.__file__) for module in modules]
    files = []
    # the blocked modules and packages, whole: the finder refuses them by name, the file rules
    # by path (found without importing them: the v4 copy would load torch)
    for name in BLOCKED:
        spec = importlib.util.find_spec(name)
        if spec is None:
            continue
        if spec.submodule_search_locations:
            files.extend(str(Path(p)) for p in spec.submodule_search_locations)
        elif spec.origin:
            sources.append(Path(spec.origin))
    for source in sources:
        files.append(str(source))
        files.extend(str(p) for p in source.parent.glob(f"__pycache__/{source.stem}.*.pyc"))
    return tuple(sorted(set(files)))


def _function_of(member: Any) -> types.FunctionType | None:
    """The plain function behind a method, staticmethod, classmethod or property (None if
    none)."""
    function = getattr(member, "fget", None) or getattr(member, "__func__", member)
    return function if isinstance(function, types.FunctionType) else None


def reference_guard(check_name: str) -> ReferenceGuard:
    """The notebook-side watch for `check_name`: its reference code and the course's copies of
    it."""
    return ReferenceGuard(
        _function_of(vars(owner)[name])
        for owner, name in reference_code(check_name) + course_copies()
    )


def grading_side(
    student: Any, check_name: str, allow_reference: bool
) -> tuple[StudentSide | None, ReferenceGuard | None]:
    """(side, guard) for a grader's argument: a StudentSide is driven as is (the command-line
    grader's child has no reference to guard); a class or function runs here, watched unless
    `allow_reference`."""
    if isinstance(student, StudentSide):
        return student, None
    return None, (None if allow_reference else reference_guard(check_name))
