"""A time limit for one grader scenario, so an endless loop in a student's code cannot hang a
notebook.

In a notebook the graders run in the kernel's own process: a `while` loop that never ends (an
easy mistake in self-preemption) would hang the kernel with no message. `scenario_time_limit`
stops the scenario after `seconds` by raising `ScenarioTimeout` inside it; the grader turns
that into a failing row that names the scenario and the step that did not finish. The
command-line grader (`python -m grader`) runs the same graders, so it applies the same
limit per scenario, on top of its limit per notebook.

How the scenario is stopped depends on where the student's code runs:

- in another process (the command-line grader's `RemoteStudent`): a deadline. This process
  only waits for that process's answers, so the wait itself ends at the deadline and raises
  `ScenarioTimeout` where it waits; nothing asynchronous is raised in the grader. (An alarm
  here could land anywhere, say inside `ast.parse` while a traceback is formatted, and on
  CPython 3.11 that can corrupt the parser's state: "AST constructor recursion depth
  mismatch".)
- in this process, on the main thread on Linux or macOS (a Jupyter kernel, a script): a
  `SIGALRM` timer (`signal.setitimer`); an outer timer (pytest-timeout, say) is restored
  afterwards with the time it had left;
- in this process, on another thread or on Windows (no `SIGALRM`), on CPython: a watchdog
  thread raises the exception in the grading thread (`PyThreadState_SetAsyncExc`); like the
  alarm it interrupts Python code, not a single long call into C;
- anywhere else no limit can be enforced: the scenario runs without one and `enforced` says so
  (the graders print a one-line note).

`ScenarioTimeout` derives from `BaseException`, so a student's `except Exception:` inside the
loop does not swallow it.
"""

from __future__ import annotations

import ctypes
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# seconds per scenario; the reference needs well under 0.1 s for any of them
DEFAULT_TIME_LIMIT = 10.0


class ScenarioTimeout(BaseException):
    """Raised inside a scenario that ran past its time limit."""


class _Limit:
    """What `scenario_time_limit` yields: whether a limit is in force, and whether it fired."""

    def __init__(self, seconds: float | None, mechanism: str) -> None:
        self.seconds = seconds
        self.mechanism = mechanism  # "deadline", "alarm", "watchdog" or "none"
        self.fired = False

    @property
    def enforced(self) -> bool:
        return self.mechanism != "none"


def check_time_limit(seconds: float | None) -> float | None:
    """A positive number of seconds, or None for no limit; anything else is a ValueError."""
    if seconds is None:
        return None
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not seconds > 0
        or seconds == float("inf")
    ):
        raise ValueError(
            "time_limit must be a positive number of seconds or None (no limit), got "
            f"{seconds!r}"
        )
    return float(seconds)


def _can_use_alarm() -> bool:
    return (
        hasattr(signal, "SIGALRM")
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )


def _can_use_watchdog() -> bool:
    return sys.implementation.name == "cpython" and hasattr(ctypes, "pythonapi")


def limit_is_enforceable() -> bool:
    """Can `scenario_time_limit` stop a scenario from this thread (alarm or watchdog)?"""
    return _can_use_alarm() or _can_use_watchdog()


# the running scenario's deadline (time.monotonic()) and its limit, for code that waits
_DEADLINE: ContextVar[tuple[float, _Limit] | None] = ContextVar(
    "scenario_deadline", default=None
)


@contextmanager
def scenario_time_limit(
    seconds: float | None, *, student_in_this_process: bool = True
) -> Iterator[_Limit]:
    """Raise `ScenarioTimeout` in the body if it runs longer than `seconds` (None: no
    limit).

    When the student's code runs in another process (`student_in_this_process=False`), the
    limit is a deadline that the waits for its answers honour (`scenario_deadline`).
    """
    seconds = check_time_limit(seconds)
    if seconds is None:
        yield _Limit(None, "none")
    elif not student_in_this_process:
        limit = _Limit(seconds, "deadline")
        token = _DEADLINE.set((time.monotonic() + seconds, limit))
        try:
            yield limit
        finally:
            _DEADLINE.reset(token)
    elif _can_use_alarm():
        with _alarm(seconds) as limit:
            yield limit
    elif _can_use_watchdog():
        with _watchdog(seconds) as limit:
            yield limit
    else:
        yield _Limit(seconds, "none")


def scenario_deadline() -> float | None:
    """When the running scenario must end (`time.monotonic()`), or None when no deadline is
    set."""
    current = _DEADLINE.get()
    return None if current is None else current[0]


def scenario_expired() -> ScenarioTimeout:
    """The exception a wait raises once `scenario_deadline()` has passed."""
    current = _DEADLINE.get()
    if current is None:
        raise RuntimeError("no scenario deadline is set")
    current[1].fired = True
    return ScenarioTimeout(f"did not finish within {current[1].seconds:g} s")


@contextmanager
def _alarm(seconds: float) -> Iterator[_Limit]:
    limit = _Limit(seconds, "alarm")

    def on_alarm(_signum, _frame):
        limit.fired = True
        raise ScenarioTimeout(f"did not finish within {seconds:g} s")

    started = time.monotonic()
    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield limit
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        # someone else's timer was running: give it back what it had left
        if previous_delay > 0:
            left = previous_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), previous_interval)


@contextmanager
def _watchdog(seconds: float) -> Iterator[_Limit]:
    limit = _Limit(seconds, "watchdog")
    target = threading.get_ident()
    lock = threading.Lock()
    state = {"done": False}
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc

    def fire() -> None:
        with lock:
            if state["done"]:
                return
            limit.fired = True
            set_async_exc(ctypes.c_ulong(target), ctypes.py_object(ScenarioTimeout))

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    delivered = False
    try:
        yield limit
    except ScenarioTimeout:
        delivered = True
        raise
    finally:
        with lock:
            state["done"] = True
        timer.cancel()
        if limit.fired and not delivered:  # it fired just as the body ended: take it here
            _absorb_pending_timeout()


def _absorb_pending_timeout(wait: float = 1.0) -> None:
    """Let a ScenarioTimeout that is still pending for this thread arrive, and drop it.

    Clearing it with `PyThreadState_SetAsyncExc(id, NULL)` instead looks simpler, but CPython
    3.11 then leaves its eval breaker set, and the thread spins forever on its next
    instruction.
    """
    deadline = time.monotonic() + wait
    try:
        while time.monotonic() < deadline:
            pass
    except ScenarioTimeout:
        pass
