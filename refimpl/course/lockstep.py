"""Lockstep replay: run every action on the reference and on the student's code, compare after each.

A grader scenario is ordinary Python that calls `Lockstep.step(label, action)`. The action runs
on the reference world first (its result drives the scenario), then on the student's world; the
return values and then a list of named state fields are compared, and the first difference stops
the scenario with a `Diverged` carrying what was expected and what was found.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Generic, Iterable, Iterator, TypeVar

from refimpl.course.report import CheckResult, Divergence
from refimpl.course.time_limit import ScenarioTimeout, scenario_time_limit

World = TypeVar("World")
StateFields = list[tuple[str, Any]]

MAX_RENDER = 160  # characters; long values are cut in the middle so the table stays readable


class Diverged(Exception):
    """The student's world differs from the reference's (or the student's code raised)."""

    def __init__(self, divergence: Divergence) -> None:
        super().__init__(f"step {divergence.step}: {divergence.action}: {divergence.where}")
        self.divergence = divergence


def render(value: Any) -> str:
    """A short deterministic text for a value (no memory addresses)."""
    if isinstance(value, BaseException):
        text = f"{type(value).__name__}: {value}"
    elif isinstance(value, (set, frozenset)):
        text = "{" + ", ".join(repr(v) for v in sorted(value)) + "}" if value else "set()"
    else:
        text = repr(value)
    if len(text) > MAX_RENDER:
        half = MAX_RENDER // 2 - 3
        text = text[:half] + " ... " + text[-half:]
    return text


def describe_exception(exc: BaseException) -> str:
    if isinstance(exc, NotImplementedError) and not str(exc):
        return "NotImplementedError (not written yet)"
    return f"{type(exc).__name__}: {exc}"


def first_difference(expected: StateFields, found: StateFields) -> tuple[str, str, str] | None:
    """(field name, expected text, found text) of the first field that differs, or None."""
    if expected == found:
        return None
    found_by_name = dict(found)
    for name, value in expected:
        other = found_by_name.get(name, _MISSING)
        if other is _MISSING:
            return name, render(value), "(missing)"
        if value != other:
            if isinstance(value, dict) and isinstance(other, dict):
                return name, *_dict_difference(value, other)
            return name, render(value), render(other)
    extra = [name for name, _ in found if name not in dict(expected)]
    return "state", "no other fields", f"extra fields {extra}"


def _dict_difference(expected: dict, found: dict) -> tuple[str, str]:
    """Show only the entries that differ, so a hash map with many entries stays readable."""
    only_expected = {k: v for k, v in sorted(expected.items()) if found.get(k, _MISSING) != v}
    only_found = {k: v for k, v in sorted(found.items()) if expected.get(k, _MISSING) != v}
    common = len(expected) - len(only_expected)

    def count(n: int) -> str:
        return f"{n} entry" if n == 1 else f"{n} entries"

    return (
        f"{count(len(expected))}; {common} shared, then {render(only_expected)}",
        f"{count(len(found))}; {common} shared, then {render(only_found)}",
    )


class ReferenceGuard:
    """Notices the student's code running the reference's own code for a part it should write.

    Without it, `class BlockManager(refimpl.paged.BlockManager): pass` (or a method that calls
    the reference's) would pass every check. The guard lists the reference functions the exercise
    asks for and watches, with `sys.setprofile`, only while the student's side of a step runs.
    """

    def __init__(self, functions: Iterable[Callable]) -> None:
        self.names = {}
        for function in functions:
            function = getattr(function, "fget", None) or getattr(function, "__func__", function)
            self.names[function.__code__] = f"{function.__module__}.{function.__qualname__}"
        self.called: str | None = None

    @classmethod
    def for_methods(cls, owner: type, method_names: Iterable[str]) -> "ReferenceGuard":
        return cls(vars(owner)[name] for name in method_names)

    @contextmanager
    def watch(self) -> Iterator[None]:
        """Record (in `called`) the first guarded function that starts inside the block."""
        self.called = None
        previous = sys.getprofile()
        sys.setprofile(self._on_event)
        try:
            yield
        finally:
            sys.setprofile(previous)

    def _on_event(self, frame, event: str, arg: Any) -> None:
        if event == "call" and self.called is None:
            self.called = self.names.get(frame.f_code)

    def complaint(self) -> tuple[str, str, str] | None:
        """(where, expected, found) for a divergence when the last watched call used the reference."""
        if self.called is None:
            return None
        return (
            "the code that ran",
            "your own implementation",
            f"the reference's {self.called} (subclassing or calling refimpl's version does not count)",
        )


class _Missing:
    def __repr__(self) -> str:
        return "(missing)"


_MISSING = _Missing()


class Lockstep(Generic[World]):
    """Two worlds driven by the same actions; `state(world)` lists the fields to compare."""

    def __init__(self, state: Callable[[World], StateFields], guard: ReferenceGuard | None = None) -> None:
        self.state = state
        self.guard = guard
        self.reference: World | None = None
        self.student: World | None = None
        self.steps = 0
        self.label = "(before the first step)"  # the step running now: named when a time limit stops it

    def start(self, label: str, make_reference: Callable[[], World], make_student: Callable[[], World]) -> None:
        """Build both worlds (step 1); the student's constructor may already diverge."""
        self.steps += 1
        self.label = label
        self.reference = make_reference()
        self.student = self._run_student(label, make_student, "a new object")
        self._compare_state(label)

    def step(self, label: str, action: Callable[[World], Any], *, compare_result: bool = True) -> Any:
        """Run `action` on both worlds; return the reference's result."""
        self.steps += 1
        self.label = label
        expected = action(self.reference)
        found = self._run_student(label, lambda: action(self.student), f"returns {render(expected)}")
        if compare_result and not _same_result(expected, found):
            self._diverge(label, "return value", render(expected), render(found))
        self._compare_state(label)
        return expected

    def both(self, action: Callable[[World], Any]) -> None:
        """Apply a driver-side change (what the scheduler or model would do) to both worlds, uncompared."""
        action(self.reference)
        action(self.student)

    def _run_student(self, label: str, run: Callable[[], Any], expected: str) -> Any:
        """Run the student's side under the guard; an exception or a use of the reference diverges."""
        try:
            with self.guard.watch() if self.guard else nullcontext():
                found = run()
        except Exception as exc:  # the student's code may raise anything; report it as found
            self._check_guard(label)
            self._diverge(label, "result", expected, describe_exception(exc))
        self._check_guard(label)
        return found

    def _check_guard(self, label: str) -> None:
        complaint = self.guard.complaint() if self.guard else None
        if complaint is not None:
            self._diverge(label, *complaint)

    def _compare_state(self, label: str) -> None:
        expected = self.state(self.reference)
        try:
            found = self.state(self.student)
        except Exception as exc:
            self._diverge(label, "state (reading your object's fields)", "readable fields", describe_exception(exc))
        try:
            difference = first_difference(expected, found)
        except Exception as exc:  # e.g. a numpy array where a list is expected: its == has no single truth value
            self._diverge(label, "state (comparing your object's fields)", "plain Python values", describe_exception(exc))
        if difference is not None:
            self._diverge(label, *difference)

    def _diverge(self, label: str, where: str, expected: str, found: str) -> None:
        raise Diverged(Divergence(self.steps, label, where, expected, found))


def _same_result(expected: Any, found: Any) -> bool:
    """Equal values count as the same result (`True == 1`: nano-vllm itself compares bools with ints)."""
    try:
        return bool(expected == found)
    except Exception:  # e.g. an array-like whose truth value is ambiguous
        return False


def timeout_divergence(name: str, step: int, action: str, seconds: float) -> Divergence:
    """The row of a scenario stopped by its time limit: which scenario, which step, how long."""
    return Divergence(
        step,
        action,
        "time limit",
        f"every step finishes; the whole scenario within {seconds:g} s",
        f"scenario {name} did not finish within {seconds:g} s and was stopped (an endless loop?)",
    )


def run_check(
    name: str,
    description: str,
    state: Callable[[Any], StateFields],
    scenario: Callable[[Lockstep], None],
    guard: ReferenceGuard | None = None,
    time_limit: float | None = None,
) -> CheckResult:
    """Replay one scenario in lockstep and turn the outcome into a table row.

    With `time_limit` (seconds), a scenario still running after that long is stopped and its row
    fails, naming the step that was running (see `refimpl.course.time_limit`).
    """
    lockstep: Lockstep = Lockstep(state, guard)
    try:
        with scenario_time_limit(time_limit):
            scenario(lockstep)
    except Diverged as diverged:
        return CheckResult(name, description, False, lockstep.steps, diverged.divergence)
    except ScenarioTimeout:
        return CheckResult(name, description, False, lockstep.steps, timeout_divergence(name, lockstep.steps, lockstep.label, time_limit))
    return CheckResult(name, description, True, lockstep.steps)
