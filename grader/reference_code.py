"""The reference's own code that each exercise asks students to write, and the two ways a grade
keeps it out.

An exercise is passed by writing the code, not by running refimpl's. Each grader lists the
reference functions its exercise asks for (`REFERENCE_CODE`); the course's deliberately broken
variants (`grader.broken`) are full or partial copies of the reference, so they count
too.

- In a notebook (`check_*`, the feedback path) a `ReferenceGuard` watches, with
  `sys.setprofile`,
  for that code starting while the student's side of a step runs. Code in the same process can
  switch a profiler off; that is fine for feedback.
- In the command-line grader (the trusted path) the student's code runs in a child process,
  and `install_traps` replaces that code there, before any student cell runs, by traps that
  raise `ReferenceUsed`. Switching a profiler off changes nothing: the reference's code is
  simply not there to run.
"""

from __future__ import annotations

import gc
import inspect
import sys
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from grader.lockstep import ReferenceGuard, StudentSide

# The reference methods each exercise asks students to write, with the reference's own helpers
# that do that work for them (`_prefix_hits` is the whole matching walk, `_cached_block_ids`
# the checked hits that `allocate` takes): running one of them from the student's side of a
# step (inherited, called through super() or on a reference object) fails.
_ALLOCATION_HELPERS = ("_prefix_hits", "_cached_block_ids")
BLOCK_MANAGER_METHODS = (
    "__init__",
    "_allocate_block",
    "_deallocate_block",
    "can_allocate",
    "allocate",
    "deallocate",
    "_needs_new_block",
    "can_append",
    "may_append",
    "_match_prefix",
    *_ALLOCATION_HELPERS,
)
PREFIX_CACHE_METHODS = (
    "_allocate_block",
    "_match_prefix",
    "can_allocate",
    "allocate",
    "hash_blocks",
    *_ALLOCATION_HELPERS,
    "_block_hashes",
)
SCHEDULER_METHODS = ("schedule", "preempt", "postprocess")


def reference_code(check_name: str) -> list[tuple[Any, str]]:
    """(owner, attribute) of every reference function the exercise graded by `check_name` asks
    for."""
    from refimpl.hybrid import kv_cache_planning, older_planners
    from refimpl.paged import BlockManager, Scheduler

    table: dict[str, list[tuple[Any, str]]] = {
        "check_block_manager": [(BlockManager, name) for name in BLOCK_MANAGER_METHODS],
        "check_prefix_cache": [(BlockManager, name) for name in PREFIX_CACHE_METHODS],
        "check_scheduler": [(Scheduler, name) for name in SCHEDULER_METHODS],
        "check_approximate_gcd": [
            (kv_cache_planning, "approximate_gcd"),
            (kv_cache_planning, "padding_curve"),
        ],
        "check_packed_layout": [(older_planners, "get_packed_kv_cache_layout")],
    }
    if check_name not in table:
        raise ValueError(f"check_name must be one of {sorted(table)}, got {check_name!r}")
    return table[check_name]


def course_copies() -> list[tuple[Any, str]]:
    """(owner, attribute) of every function in `grader.broken`: copies of the
    reference, whole or in part."""
    from grader import broken

    pairs = []
    for name, value in vars(broken).items():
        if inspect.isfunction(value) and value.__module__ == broken.__name__:
            pairs.append((broken, name))
        elif inspect.isclass(value) and value.__module__ == broken.__name__:
            pairs.extend(
                (value, attr)
                for attr, member in vars(value).items()
                if _function_of(member) is not None
            )
    return pairs


def reference_sources() -> list[str]:
    """The files holding the reference code of every exercise and the course's copies of it
    (and their compiled caches): the grading child may not read them, so it cannot load that
    code a second time (`importlib.reload`, `exec(open(...).read())`) past its traps."""
    from grader import broken
    from grader.exercises import EXERCISES

    modules = {
        owner if isinstance(owner, types.ModuleType) else sys.modules[owner.__module__]
        for exercise in EXERCISES.values()
        for check, _ in exercise.checks
        for owner, _ in reference_code(check)
    }
    modules.add(broken)
    files = []
    for module in modules:
        source = Path(module.__file__)
        files.append(str(source))
        files.extend(str(p) for p in source.parent.glob(f"__pycache__/{source.stem}.*.pyc"))
    return sorted(files)


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
    grader's child has traps instead of a guard); a class or function runs here, watched unless
    `allow_reference`."""
    if isinstance(student, StudentSide):
        return student, None
    return None, (None if allow_reference else reference_guard(check_name))


# --- the grading child's side
class ReferenceUsed(BaseException):
    """Raised by a trap: the student's code ran the reference's version of what it should
    write.

    A BaseException, so a student's `except Exception:` does not hide it by accident (catching
    it on purpose gains nothing: the reference's code did not run).
    """

    def __init__(self, qualified_name: str) -> None:
        super().__init__(qualified_name)
        self.qualified_name = qualified_name


def _trap(qualified_name: str) -> Callable[..., Any]:
    def trap(*args: Any, **kwargs: Any) -> Any:
        raise ReferenceUsed(qualified_name)

    trap.__name__ = trap.__qualname__ = qualified_name.rsplit(".", 1)[-1]
    return trap


def install_traps(pairs: Iterable[tuple[Any, str]]) -> int:
    """Replace each (owner, attribute) function by a trap, wherever a module, class or closure
    holds it.

    Only the grading child calls this (it would break the reference for the rest of a process);
    it runs before any student cell, so no student code holds the originals. Returns how many
    places were rewritten.
    """
    rewritten = 0
    for owner, name in pairs:
        member = vars(owner)[name]
        function = _function_of(member)
        if function is None:
            continue
        trap = _trap(f"{function.__module__}.{function.__qualname__}")
        rewritten += _rebind_everywhere(member, trap)
        if function is not member:  # a staticmethod, classmethod or property wraps it
            rewritten += _rebind_everywhere(function, trap)
    return rewritten


def _rebind_everywhere(original: Any, trap: Callable[..., Any]) -> int:
    # No comprehension may mention `original` here: it would become a closure cell of this
    # function, which gc.get_referrers finds, and the loop would rebind `original` itself.
    count = 0
    for holder in gc.get_referrers(original):
        if isinstance(holder, types.CellType) and holder.cell_contents is original:
            holder.cell_contents = trap
            count += 1
        elif isinstance(holder, dict):
            owners = _namespace_owners(holder)
            keys = []
            for key, value in holder.items():
                if value is original:
                    keys.append(key)
            for key in keys:
                # a class or module namespace: set it through the owner (keeps method caches
                # right)
                if owners:
                    for owner in owners:
                        setattr(owner, key, trap)
                else:
                    holder[key] = trap
                count += 1
    return count


def _namespace_owners(namespace: dict) -> list[Any]:
    """The classes and modules whose namespace dict is `namespace` (a class's `__dict__` is
    only a view of it)."""
    return [
        owner
        for owner in gc.get_referrers(namespace)
        if (isinstance(owner, types.ModuleType) and vars(owner) is namespace)
        or (isinstance(owner, type) and any(r is namespace for r in gc.get_referents(owner)))
    ]
