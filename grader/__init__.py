"""The course's exercise grader: checks that replay scenarios in lockstep against the
reference.

Part I: `check_block_manager`, `check_prefix_cache`, `check_scheduler` take the student's
class. Part II: `check_approximate_gcd`, `check_packed_groups`, `check_packed_layout` take the
student's function; `check_window_frees` and `check_fixed_point_hit` (exercise 5) the student's
subclasses.
Each prints a PASS/FAIL table naming the first step where the student's state differs from the
reference, and returns a `GradeReport` (`.passed`, `.num_passed`, `.num_checks`, `.table()`). A
student's code that runs the reference's own version of what it should write fails (subclass,
`super()`, a wrapped reference object); `allow_reference=True` switches that off for grading
the reference itself and the deliberately broken variants in `grader.exercises.broken`. Every
scenario runs under `time_limit` seconds (default 10, `grader.lockstep.time_limit`): an endless
loop fails its row with a message naming the scenario instead of hanging the notebook.
`grader.exercises.rules` lists the rules each grader checks, with the covering scenario and
variant.

The check_* functions are the feedback path: they run next to the student's code. Grades come
from `python -m grader` (`grader.grading`), which runs the student's code in a
restricted child process that only answers calls, and compares every answer with its own
reference (`grader.sandbox.remote`, `grader.sandbox.limits`). The trust model is in this
package's README.md.
"""

import importlib
from typing import Any

# name -> the module that defines it. Loaded on first use: the grading child imports this
# package before refimpl, and must be able to do so without loading the reference.
_EXPORTS = {
    "CheckResult": "grader.lockstep.report",
    "Divergence": "grader.lockstep.report",
    "GradeReport": "grader.lockstep.report",
    "check_approximate_gcd": "grader.exercises.hybrid_checks",
    "check_block_manager": "grader.exercises.paged_checks",
    "check_packed_groups": "grader.exercises.hybrid_checks",
    "check_fixed_point_hit": "grader.exercises.hybrid_allocator_checks",
    "check_packed_layout": "grader.exercises.hybrid_checks",
    "check_prefix_cache": "grader.exercises.paged_checks",
    "check_scheduler": "grader.exercises.paged_checks",
    "check_window_frees": "grader.exercises.hybrid_allocator_checks",
    "check_swa_indices": "grader.exercises.addressing_checks",
}

__all__ = [
    "CheckResult",
    "Divergence",
    "GradeReport",
    "check_approximate_gcd",
    "check_block_manager",
    "check_packed_groups",
    "check_fixed_point_hit",
    "check_packed_layout",
    "check_prefix_cache",
    "check_scheduler",
    "check_window_frees",
    "check_swa_indices",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'grader' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
