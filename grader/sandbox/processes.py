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
import stat
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
                line = handle.read().decode(errors="replace")
        except OSError:
            continue  # it ended while we looked
        fields = line[line.rfind(")") + 2 :].split()  # the name in parentheses may hold spaces
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


# --- how many processes a grading child may have at once
_CGROUP_V1_PIDS = "/sys/fs/cgroup/pids"
_CGROUP_V2 = "/sys/fs/cgroup"


def _own_cgroup_v2() -> str | None:
    """This process's cgroup v2 folder, when its pids controller can be used below it."""
    try:
        with open("/proc/self/cgroup") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            base = os.path.join(_CGROUP_V2, line[3:].lstrip("/"))
            try:
                with open(os.path.join(base, "cgroup.subtree_control")) as handle:
                    if "pids" in handle.read().split():
                        return base
            except OSError:
                return None
    return None


class PidsCgroup:
    """A pids cgroup of its own for one grading child (and everything it starts), holding at
    most `limit` tasks, where this process may make one (cgroup v1's pids hierarchy, or a
    cgroup v2 subtree with the pids controller delegated to it). `path` is None elsewhere."""

    def __init__(self, limit: int) -> None:
        self.path: str | None = None
        name = f"refimpl-grader-{os.getpid()}-{time.monotonic_ns()}"
        for base in (
            _own_cgroup_v2(),
            _CGROUP_V1_PIDS if os.path.isdir(_CGROUP_V1_PIDS) else None,
        ):
            if base is None:
                continue
            path = os.path.join(base, name)
            try:
                os.mkdir(path)
            except OSError:
                continue
            try:
                with open(os.path.join(path, "pids.max"), "w") as handle:
                    handle.write(str(limit))
            except OSError:
                os.rmdir(path)
                continue
            self.path = path
            return

    def add(self, pid: int) -> bool:
        """Move process `pid` (before it starts anything) into the cgroup."""
        if self.path is None:
            return False
        try:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as handle:
                handle.write(str(pid))
        except OSError:
            return False
        return True

    def pids(self) -> list[int] | None:
        """The processes in the cgroup now (None without a cgroup)."""
        if self.path is None:
            return None
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as handle:
                return [int(line) for line in handle.read().split()]
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        """Remove the cgroup (its processes were killed already; it empties in a moment)."""
        if self.path is None:
            return
        deadline = time.monotonic() + 2.0
        while True:
            try:
                os.rmdir(self.path)
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
        self.path = None


def process_cap_available() -> bool:
    """Whether a grading child's process count is capped here: by a pids cgroup, or by
    RLIMIT_NPROC, which binds every user but root."""
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return True
    cgroup = PidsCgroup(1)
    try:
        return cgroup.path is not None
    finally:
        cgroup.close()


def processes_of_this_user() -> int:
    """How many tasks (processes and their threads) this user runs now: RLIMIT_NPROC counts
    them all, so a child's limit is this number plus its own allowance."""
    uid = os.getuid()
    count = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid == uid:
                count += len(os.listdir(f"/proc/{entry}/task"))
        except OSError:
            continue
    return count


_PR_SET_DUMPABLE, _PR_GET_DUMPABLE = 4, 3


@contextmanager
def not_dumpable() -> Iterator[bool]:
    """Make this process not dumpable for the block (Linux `PR_SET_DUMPABLE` 0): its
    `/proc/<pid>/environ` and other private entries then belong to root, so a graded child of
    the same (unprivileged) user cannot read them. Yields whether that worked."""
    prctl = _prctl()
    if prctl is None:
        yield False
        return
    previous = prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)
    changed = prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    try:
        yield changed
    finally:
        if changed and previous > 0:
            prctl(_PR_SET_DUMPABLE, previous, 0, 0, 0)


# --- what a grading child holds on disk without a name
class HiddenFiles(Exception):
    """A process of the child does not let the grader see its open files (it made itself not
    dumpable)."""


def held_after_deletion(pids: list[int], with_mappings: bool = True) -> int:
    """Bytes on disk in files that processes `pids` hold open, or mapped, after their last
    name was removed (and in files that never had one: `O_TMPFILE`, `memfd_create`).

    Deleting a file it keeps open frees none of its space, and takes it out of the folder the
    grader measures; this counts it (each file once). An open file's size is exact (`fstat`
    through `/proc/<pid>/fd`); a file only mapped counts by what is mapped of it, unless
    `/proc/<pid>/map_files` may be read (root). HiddenFiles when a live process's entries are
    closed to this process. 0 without `/proc`.
    """
    seen: set[tuple[int, int]] = set()
    total = 0
    for pid in pids:
        folder = f"/proc/{pid}/fd"
        try:
            names = os.listdir(folder)
        except PermissionError:
            if _exiting(pid):
                continue
            raise HiddenFiles(pid) from None
        except OSError:
            continue  # it ended
        for name in names:
            try:
                info = os.stat(f"{folder}/{name}")
            except OSError:
                continue
            if info.st_nlink == 0 and stat.S_ISREG(info.st_mode):
                key = (info.st_dev, info.st_ino)
                if key not in seen:
                    seen.add(key)
                    total += _on_disk(info)
        if with_mappings:
            total += _mapped_after_deletion(pid, seen)
    return total


def _exiting(pid: int) -> bool:
    """Whether process `pid` has let go of its memory: it is exiting (or gone). Its /proc
    entries then belong to root, which is no hiding (only a live process can make itself not
    dumpable, and it keeps its memory)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            return not any(line.startswith("VmSize:") for line in handle)
    except OSError:
        return True


def _on_disk(info: os.stat_result) -> int:
    return max(info.st_blocks * 512, 0) if hasattr(info, "st_blocks") else info.st_size


def _mapped_after_deletion(pid: int, seen: set[tuple[int, int]]) -> int:
    """Bytes of deleted files mapped by `pid` that no open descriptor holds (added to
    `seen`)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return 0
    extent: dict[tuple[int, int], tuple[int, str]] = {}
    for line in lines:
        if not line.endswith(b" (deleted)"):
            continue
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or fields[4] == b"0":
            continue
        try:
            start, end = (int(x, 16) for x in fields[0].split(b"-"))
            major, minor = (int(x, 16) for x in fields[3].split(b":"))
            key = (os.makedev(major, minor), int(fields[4]))
            mapped = int(fields[2], 16) + end - start
        except ValueError:
            continue
        if mapped > extent.get(key, (0, ""))[0]:
            extent[key] = (mapped, fields[0].decode())
    total = 0
    for key, (mapped, span) in extent.items():
        try:  # the file itself, where this process may look (root)
            info = os.stat(f"/proc/{pid}/map_files/{span}")
            key, size = (info.st_dev, info.st_ino), _on_disk(info)
        except OSError:
            size = mapped
        if key not in seen:
            seen.add(key)
            total += size
    return total
