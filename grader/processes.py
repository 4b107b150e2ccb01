"""The grader's hold on the processes a graded notebook starts: find them all, end them all.

The grading child runs in a session and process group of its own, so one `killpg` ends it and
everything still in its group. A process that leaves the group (`setsid`, a double fork) would
outlive it, and could rewrite the grade file after the grader has finished. So, while a
notebook is graded, the grader is a *child subreaper* (Linux `PR_SET_CHILD_SUBREAPER`): an
orphaned descendant is re-parented to the grader instead of to init, stays in the grader's
process tree, and `end_new_descendants` finds it (in `/proc`), kills it and reaps it. Elsewhere
(no `/proc`, not Linux) only the process group is ended.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 1, 36, 37
ProcessKey = tuple[int, int]  # (pid, start time in clock ticks): a pid alone may be reused


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


@contextmanager
def subreaper() -> Iterator[bool]:
    """Make this process a child subreaper for the block; yields whether that worked."""
    prctl = _prctl()
    if prctl is None:
        yield False
        return
    previous = ctypes.c_int(0)
    prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0)
    enabled = prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield enabled
    finally:
        if enabled and not previous.value:
            prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def die_with_parent() -> None:
    """Have the kernel kill this process when its parent ends (Linux `PR_SET_PDEATHSIG`): a
    grading child must not outlive a grader that was killed outright."""
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _process_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, start time, state letter), from /proc (empty without /proc)."""
    table = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read().decode(errors="replace")
        except OSError:
            continue  # it ended while we looked
        fields = stat[stat.rfind(")") + 2 :].split()  # the name in parentheses may hold spaces
        table[int(entry)] = (int(fields[1]), int(fields[19]), fields[0])
    return table


def descendants(root: int | None = None) -> dict[ProcessKey, str]:
    """Every process below `root` (default: this process): (pid, start time) -> state
    letter."""
    root = os.getpid() if root is None else root
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = {}, list(children.get(root, []))
    while stack:
        pid = stack.pop()
        ppid, start, state = table[pid]
        found[(pid, start)] = state
        stack.extend(children.get(pid, []))
    return found


def end_new_descendants(before: set[ProcessKey], *, patience: float = 2.0) -> int:
    """Kill and reap every descendant of this process not in `before`; return how many were
    running.

    Killing a process re-parents its own children to this (subreaper) process, so the sweep
    repeats until nothing new is left, or `patience` seconds have passed.
    """
    running: set[ProcessKey] = set()
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        new = {key: state for key, state in descendants().items() if key not in before}
        if not new:
            break
        for (pid, start), state in new.items():
            if state != "Z":
                running.add((pid, start))
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                # ours once its parent is gone; anyone else's is reaped by them
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(0.01)
    return len(running)
