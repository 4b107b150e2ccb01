"""Lockstep replay: run every action on the reference and on the student's code, compare after
each.

A grader scenario is ordinary Python that calls `Lockstep.step(label, action)`. The action (a
`Call`: a world's method name and plain arguments) runs on the reference world first (its
result drives the scenario), then on the student's world; the return values and then a list of
named state fields are compared, and the first difference stops the scenario with a `Diverged`
carrying what was expected and what was found.

The student's world lives behind a *student side*. In a notebook it is a `LocalStudent`: the
student's class runs in the same process, watched by a `ReferenceGuard`. The command-line
grader uses `grader.sandbox.remote.RemoteStudent`: the student's code runs in another process
that only answers calls, and every comparison happens here, against this process's own
reference. Both sides raise `StudentRaised` (the student's code raised) or `StudentFailure`
(anything else that is not an answer: the reference ran, the process died), so a scenario reads
the same either way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from grader.lockstep.calls import CONTEXTS, Call, StateFields, WorldSpec, build_world
from grader.lockstep.report import CheckResult, Divergence
from grader.lockstep.time_limit import ScenarioTimeout, scenario_time_limit


class StudentRaised(Exception):
    """The student's code raised `exception` (a stand-in for it when it ran in another
    process)."""

    def __init__(self, exception: BaseException) -> None:
        super().__init__(describe_exception(exception))
        self.exception = exception


class StudentFailure(Exception):
    """No answer from the student's code: (where, expected, found) say why, as a divergence
    does."""

    def __init__(self, where: str, expected: str, found: str) -> None:
        super().__init__(f"{where}: expected {expected}, found {found}")
        self.where, self.expected, self.found = where, expected, found


class StudentSide:
    """Where the student's world lives; see `LocalStudent` and
    `grader.sandbox.remote.RemoteStudent`.

    A grader handed a StudentSide instead of a class or function drives it as is (the
    command-line grader hands in a `RemoteStudent`).
    """

    __name__ = "student"
    # False where the student's code runs in another process: a scenario's time limit is then
    # a deadline for the waits (see `grader.lockstep.time_limit`), not an alarm in the grader
    runs_in_this_process = True

    def start(self, spec: WorldSpec) -> None:
        """Build the student's world; StudentRaised / StudentFailure when that fails."""
        raise NotImplementedError

    def run(self, action: Call) -> Any:
        """Apply `action` to the student's world and return its result (or raise as
        `start`)."""
        raise NotImplementedError

    def state(self) -> StateFields:
        """The world's fields after the last action; StudentFailure when they cannot be
        read."""
        raise NotImplementedError

    def enter(self, name: str, args: tuple) -> None:
        """Enter the context `calls.CONTEXTS[name](*args)` on the student's side too."""

    def exit(self, name: str) -> None:
        """Leave it again."""


MAX_RENDER = 160  # characters; long values are cut in the middle so the table stays readable


class Diverged(Exception):
    """The student's world differs from the reference's (or the student's code raised)."""

    def __init__(self, divergence: Divergence) -> None:
        super().__init__(f"step {divergence.step}: {divergence.action}: {divergence.where}")
        self.divergence = divergence


def render(value: Any) -> str:
    """A short deterministic text for a value (no memory addresses)."""
    text = _full_text(value)
    if len(text) > MAX_RENDER:
        half = MAX_RENDER // 2 - 3
        text = text[:half] + " ... " + text[-half:]
    return text


CONTEXT = 3  # elements shown on each side of the first difference of two long lists


def difference_index(expected: Any, found: Any) -> tuple[int, ...] | None:
    """The index of the first element where two lists (or tuples) differ, descending into
    nested lists (`(1, 0)`: element 0 of element 1); the shorter one's length when it is a
    prefix of the other; None when they are not both sequences or do not differ by element."""
    path: list[int] = []
    try:
        while isinstance(expected, (list, tuple)) and isinstance(found, (list, tuple)):
            index = next(
                (i for i, (a, b) in enumerate(zip(expected, found)) if a != b),
                min(len(expected), len(found)),
            )
            if index == len(expected) == len(found):
                break  # equal elements (a list against a tuple)
            path.append(index)
            if index >= min(len(expected), len(found)):
                break
            expected, found = expected[index], found[index]
    except Exception:  # an element whose == has no single truth value
        return None
    return tuple(path) or None


def render_around(value: Any, path: tuple[int, ...]) -> str:
    """`render(value)`, or when that is too long for a list, the elements around the first
    difference at `path` (`difference_index`) in the innermost list that holds it, with their
    positions: never an elision that hides them."""
    if len(_full_text(value)) <= MAX_RENDER or not isinstance(value, (list, tuple)):
        return render(value)
    depth = 0
    while depth < len(path) - 1 and isinstance(value[path[depth]], (list, tuple)):
        value, depth = value[path[depth]], depth + 1
    inside = "".join(f"[{i}] " for i in path[:depth]).replace("] [", "][")
    index = path[depth]  # at most len(value): the shorter list ends there
    start, stop = max(0, index - CONTEXT), min(len(value), index + CONTEXT + 1)
    shown = ", ".join(render(item) for item in value[start:stop])
    head = "..., " if start > 0 else ""
    tail = ", ..." if stop < len(value) else ""
    return f"{inside}items {start}-{stop - 1} of {len(value)}: [{head}{shown}{tail}]"


def described_difference(where: str, expected: Any, found: Any) -> tuple[str, str, str]:
    """(where, expected text, found text) for two values that differ: for lists, `where` names
    the first index that differs and long lists show the elements around it."""
    path = difference_index(expected, found)
    if path is None:
        return where, render(expected), render(found)
    at = f"index {path[0]}" if len(path) == 1 else "".join(f"[{i}]" for i in path)
    return (
        f"{where}, first difference at {at}",
        render_around(expected, path),
        render_around(found, path),
    )


def _full_text(value: Any) -> str:
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(repr(v) for v in sorted(value)) + "}" if value else "set()"
    return repr(value)


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
            return described_difference(name, value, other)
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
    the reference's) would pass every check. The guard lists the reference functions the
    exercise asks for and watches, with `sys.setprofile`, only while the student's side of a
    step runs.
    """

    def __init__(self, functions: Iterable[Callable]) -> None:
        self.names = {}
        for function in functions:
            function = getattr(function, "fget", None) or getattr(
                function, "__func__", function
            )
            self.names[function.__code__] = f"{function.__module__}.{function.__qualname__}"
        self.called: str | None = None

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

    def _on_event(self, frame, event: str, _arg: Any) -> None:
        if event == "call" and self.called is None:
            self.called = self.names.get(frame.f_code)

    def complaint(self) -> tuple[str, str, str] | None:
        """(where, expected, found) for a divergence when the last watched call used the
        reference."""
        return None if self.called is None else reference_complaint(self.called)


def reference_complaint(qualified_name: str) -> tuple[str, str, str]:
    """(where, expected, found) of a step whose student side ran the reference's
    `qualified_name`."""
    return (
        "the code that ran",
        "your own implementation",
        f"the reference's {qualified_name} (subclassing or calling refimpl's version does not "
        "count)",
    )


class LocalStudent(StudentSide):
    """The student's class or function in this process, run under a `ReferenceGuard`
    (notebooks).

    Contexts need nothing here: the one the Lockstep entered in this process covers both
    worlds.
    """

    def __init__(self, implementation: Any, guard: ReferenceGuard | None = None) -> None:
        self.implementation = implementation
        self.guard = guard
        self.__name__ = getattr(implementation, "__name__", type(implementation).__name__)
        self.world: Any = None

    def start(self, spec: WorldSpec) -> None:
        self.world = self._guarded(lambda: build_world(spec, self.implementation))

    def run(self, action: Call) -> Any:
        return self._guarded(lambda: action(self.world))

    def state(self) -> StateFields:
        try:
            return self.world.state()
        except Exception as exc:  # the student's object may lack a field or raise reading it
            raise StudentFailure(
                "state (reading your object's fields)",
                "readable fields",
                describe_exception(exc),
            ) from None

    def _guarded(self, run: Callable[[], Any]) -> Any:
        raised = None
        try:
            if self.guard is None:
                return run()
            with self.guard.watch():
                result = run()
        except Exception as exc:  # the student's code may raise anything; reported as found
            raised = exc
        complaint = self.guard.complaint() if self.guard else None
        if complaint is not None:
            raise StudentFailure(*complaint)
        if raised is not None:
            raise StudentRaised(raised) from None
        return result


class _Missing:
    def __repr__(self) -> str:
        return "(missing)"


_MISSING = _Missing()


class Lockstep:
    """Two worlds driven by the same actions: the reference's here, the student's behind
    `side`.

    Without a `side`, `start` puts the student's class in this process (`LocalStudent`, watched
    by `guard`); the command-line grader passes a `RemoteStudent`.
    """

    def __init__(
        self, side: StudentSide | None = None, guard: ReferenceGuard | None = None
    ) -> None:
        self.side = side
        self.guard = guard
        self.reference: Any = None
        self.steps = 0
        # the step running now: named when a time limit stops it
        self.label = "(before the first step)"

    def start(self, label: str, spec: WorldSpec, student: Any) -> None:
        """Build both worlds (step 1); the student's constructor may already diverge."""
        if self.side is None:
            self.side = LocalStudent(student, self.guard)
        self.steps += 1
        self.label = label
        self.reference = build_world(spec, None)
        self._run_student(label, lambda: self.side.start(spec), "a new object")
        self._compare_state(label)

    def step(self, label: str, action: Call, *, compare_result: bool = True) -> Any:
        """Run `action` on both worlds; return the reference's result."""
        self.steps += 1
        self.label = label
        expected = action(self.reference)
        found = self._run_student(
            label, lambda: self.side.run(action), f"returns {render(expected)}"
        )
        if compare_result and not _same_result(expected, found):
            self._diverge(label, *described_difference("return value", expected, found))
        self._compare_state(label)
        return expected

    def both(self, action: Call) -> None:
        """Apply a driver-side change (what the scheduler or model would do) to both worlds,
        uncompared."""
        action(self.reference)
        self._run_student(
            self.label, lambda: self.side.run(action), "the driver's change to apply"
        )

    @contextmanager
    def context(self, name: str, *args: Any) -> Iterator[None]:
        """Enter one of `calls.CONTEXTS` (a patch such as `colliding_hashes`) on both
        sides."""
        with CONTEXTS[name](*args):
            side = self.side or StudentSide()
            self._run_student(self.label, lambda: side.enter(name, args), f"{name} to apply")
            try:
                yield
            finally:
                side.exit(name)

    def _run_student(self, label: str, run: Callable[[], Any], expected: str) -> Any:
        """Run the student's side; an exception, a use of the reference or no answer
        diverges."""
        try:
            return run()
        except StudentRaised as raised:
            self._diverge(label, "result", expected, describe_exception(raised.exception))
        except StudentFailure as failure:
            self._diverge(label, failure.where, failure.expected, failure.found)

    def _compare_state(self, label: str) -> None:
        expected = self.reference.state()
        try:
            found = self.side.state()
        except StudentFailure as failure:
            self._diverge(label, failure.where, failure.expected, failure.found)
        try:
            difference = first_difference(expected, found)
        # e.g. a numpy array where a list is expected: its == has no single truth value
        except Exception as exc:
            self._diverge(
                label,
                "state (comparing your object's fields)",
                "plain Python values",
                describe_exception(exc),
            )
        if difference is not None:
            self._diverge(label, *difference)

    def _diverge(self, label: str, where: str, expected: str, found: str) -> None:
        raise Diverged(Divergence(self.steps, label, where, expected, found))


def _same_result(expected: Any, found: Any) -> bool:
    """Equal values count as the same result (`True == 1`: nano-vllm itself compares bools with
    ints)."""
    try:
        return bool(expected == found)
    except Exception:  # e.g. an array-like whose truth value is ambiguous
        return False


def timeout_divergence(name: str, step: int, action: str, seconds: float) -> Divergence:
    """The row of a scenario stopped by its time limit: which scenario, which step, how
    long."""
    return Divergence(
        step,
        action,
        "time limit",
        f"every step finishes; the whole scenario within {seconds:g} s",
        f"scenario {name} did not finish within {seconds:g} s and was stopped (an endless "
        "loop?)",
    )


def run_check(
    name: str,
    description: str,
    scenario: Callable[[Lockstep], None],
    guard: ReferenceGuard | None = None,
    time_limit: float | None = None,
    side: StudentSide | None = None,
) -> CheckResult:
    """Replay one scenario in lockstep and turn the outcome into a table row.

    With `time_limit` (seconds), a scenario still running after that long is stopped and its
    row fails, naming the step that was running (see `grader.lockstep.time_limit`). `side` is
    where the student's world lives (default: this process, watched by `guard`).
    """
    lockstep = Lockstep(side, guard)
    try:
        with scenario_time_limit(
            time_limit, student_in_this_process=side is None or side.runs_in_this_process
        ):
            scenario(lockstep)
    except Diverged as diverged:
        return CheckResult(name, description, False, lockstep.steps, diverged.divergence)
    except ScenarioTimeout:
        return CheckResult(
            name,
            description,
            False,
            lockstep.steps,
            timeout_divergence(name, lockstep.steps, lockstep.label, time_limit),
        )
    return CheckResult(name, description, True, lockstep.steps)
