"""The grader's end of a graded notebook: the child process that runs the student's code, and
the student side (`RemoteStudent`) through which the graders drive it.

The trust model: nothing the child sends is believed as a result. The child only answers calls
(build a world, apply a `Call`, report the state); the graders, here, apply the same calls to
their own reference and decide every PASS and FAIL. A child that crashes, exits, stops
answering, answers nonsense or runs the reference fails the step it was asked about, and the
next scenario starts a fresh child. The child runs in its own session and process group with
resource limits and (on Linux) a Landlock sandbox (`grader.sandbox.limits`), in a throwaway
working directory; at the end its whole group is killed, and any process it left behind is
found and killed too (`grader.sandbox.processes`), which voids the notebook's score.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grader
import refimpl
from grader.exercises.answer_free import answer_free_sources
from grader.exercises.reference_code import reference_sources
from grader.lockstep.engine import (
    Call,
    StateFields,
    StudentFailure,
    StudentRaised,
    StudentSide,
    WorldSpec,
    describe_exception,
    reference_complaint,
)
from grader.lockstep.time_limit import scenario_deadline, scenario_expired
from grader.sandbox import wire
from grader.sandbox.limits import Limits, file_rules, landlock_abi
from grader.sandbox.processes import (
    HiddenFiles,
    PidsCgroup,
    descendants,
    end_new_descendants,
    held_after_deletion,
    not_dumpable,
    processes_of_this_user,
    subreaper,
)

MAX_STARTS = 30  # children one notebook may use up (one per scenario at most, plus the first)


class StartFailed(Exception):
    """The child did not get through the notebook's cells (it died, ran out of time or answered
    nonsense)."""


@dataclass(frozen=True)
class ChildSettings:
    """What every grading child of one notebook gets."""

    cells: list[tuple[int, str]]
    checks: list[str]  # grader names: the child's refimpl lacks their answers
    targets: list[str]  # the names the notebook should define
    limits: Limits = field(default_factory=Limits)
    # folders the child must not read (solutions, submissions, grade file)
    protected: tuple[str, ...] = ()
    sandbox: bool = True  # use Landlock where the kernel has it


_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def clean_text(value: Any, limit: int = 300) -> str:
    """A child's text made safe for a table or a CSV cell: one line, printable, not too
    long."""
    text = _CONTROL.sub(" ", value if isinstance(value, str) else repr(value)).strip()
    return text if len(text) <= limit else text[: limit - 4] + " ..."


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    hint = {"SIGXCPU": " (CPU time limit)", "SIGXFSZ": " (file size limit)"}.get(name, "")
    return f"killed by {name}{hint}"


class GradingChild:
    """The child processes grading one notebook: at most one alive, started again after it
    ended.

    Use it as a context manager: while it is open this process is a child subreaper, so nothing
    the child starts can leave the process tree; `close` (on leaving) ends all of it.
    """

    def __init__(self, settings: ChildSettings, timeout: float) -> None:
        self.settings = settings
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.process: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.workdir: str | None = None
        # why the first failing cell stopped, as the child told it
        self.problem: str | None = None
        self.missing: list[str] = []  # targets the cells did not define, as the child told it
        self.endings: list[str] = []  # how children ended while a step waited for them
        self.stray = 0  # processes found running after a child ended (all killed)
        self.starts = 0
        self.expired = False
        # the last line the latest child wrote to its stderr (a crash of Python itself)
        self.last_error = ""
        # why the child was stopped for what it wrote (it scores 0, and is not started again)
        self.overflow: str | None = None
        # why the child refused to run its code (it could read a hidden file)
        self.refused: str | None = None
        self._cgroup: PidsCgroup | None = None
        self._stderr: Any = None  # the latest child's stderr file, held open here
        self._watcher: threading.Thread | None = None
        self._watching = threading.Event()
        self._stack = ExitStack()
        self._before: set = set()
        # the answer-free modules the child imports, written now: a child is started inside a
        # scenario, whose time limit must not interrupt the parsing
        try:
            self._sources: dict[str, str] | ValueError = answer_free_sources(settings.checks)
        except ValueError as exc:
            self._sources = exc

    def __enter__(self) -> GradingChild:
        self._stack.enter_context(subreaper())
        # the grader's /proc entries (environment, memory) closed to a child of the same user
        self._stack.enter_context(not_dumpable())
        self._before = set(descendants())
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
        self._stack.close()

    # --- life
    def start(self) -> None:
        """Start a child and run the cells in it; StartFailed when it does not report ready."""
        if self.expired:
            raise StartFailed(f"timed out after {self.timeout:g} s")
        if self.overflow is not None:
            raise StartFailed(self.overflow)
        if self.refused is not None:  # the sandbox leaks here: the same for every start
            raise StartFailed(self.refused)
        if self.starts >= MAX_STARTS:
            raise StartFailed(
                f"the process running its code ended {MAX_STARTS} times; not started again"
            )
        self.starts += 1
        if isinstance(self._sources, ValueError):
            raise StartFailed(
                "the grader could not set up the process for its code "
                f"(ValueError: {self._sources})"
            )
        try:
            self._spawn(self._sources)
            # sent before any student code runs
            prepared = wire.read_answer(self.sock, self.deadline)
            if "refused" in prepared:
                self._end(1.0)
                self.refused = clean_text(prepared["refused"], limit=500)
                raise StartFailed(self.refused)
            if "setup_failed" in prepared:
                self._end(1.0)
                raise StartFailed(
                    "the grader could not set up the process for its code "
                    f"({clean_text(prepared['setup_failed'])})"
                )
            answer = wire.read_answer(self.sock, self.deadline)
            if answer.get("ready") is not True:
                raise wire.ProtocolError("no ready message")
        except TimeoutError:
            self.expired = True
            self._end(0)
            raise StartFailed(f"timed out after {self.timeout:g} s") from None
        except (wire.ChildGone, OSError):
            ending = self._end(1.0)
            detail = (
                f": {self.last_error}"
                if self.last_error and not ending.endswith("code 0")
                else ""
            )
            raise StartFailed(
                f"its code ended the process running it while its cells ran ({ending}{detail})"
            ) from None
        except wire.ProtocolError as exc:
            self._end(0)
            raise StartFailed(
                f"the process running its code sent something that is not an answer ({exc})"
            ) from None
        except StartFailed:
            raise
        except BaseException:
            self._end(0)
            raise
        self.problem = (
            clean_text(answer["problem"]) if answer.get("problem") is not None else None
        )
        missing = answer.get("missing")
        self.missing = [
            t for t in self.settings.targets if isinstance(missing, list) and t in missing
        ]

    def _spawn(self, sources: dict[str, str]) -> None:
        self.workdir = tempfile.mkdtemp(prefix="refimpl-grade-")
        ours, theirs = socket.socketpair()
        # where refimpl and the grader are installed (the same folder in a checkout)
        package_parents = dict.fromkeys(
            str(Path(package.__file__).resolve().parent.parent)
            for package in (refimpl, grader)
        )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": self.workdir,
            "TMPDIR": self.workdir,
            "LANG": "C.UTF-8",
            "PYTHONPATH": os.pathsep.join(package_parents),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        limits = self.settings.limits
        processes_before = processes_of_this_user()
        self._cgroup = PidsCgroup(limits.processes)
        # its stderr: a file with no name (outside its folder), read back through this
        # descriptor only, so the child cannot point it at a file it may not read
        self._stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "grader.sandbox.grading_child", str(theirs.fileno())],
            cwd=self.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            pass_fds=(theirs.fileno(),),
            start_new_session=True,
        )
        theirs.close()
        self.sock = ours
        # before it reads its first request, so before any student code: all it starts is in
        self._cgroup.add(self.process.pid)
        self._watching.clear()
        self._watcher = threading.Thread(
            target=self._watch_writes, args=(self.workdir, self.process), daemon=True
        )
        self._watcher.start()
        files = None
        if self.settings.sandbox and landlock_abi() > 0:
            rules = asdict(
                file_rules(self.workdir, list(self.settings.protected), reference_sources())
            )
            rules.pop("note")
            files = rules
        payload = {
            "sources": sources,
            "cells": self.settings.cells,
            "checks": self.settings.checks,
            "targets": self.settings.targets,
            "limits": asdict(self.settings.limits),
            "processes_before": processes_before,
            "deny_sockets": self.settings.sandbox,
            "files": files,
        }
        wire.send_request(ours, ("start", payload))

    def _end(self, wait: float) -> str:
        """End the child and its process group (after `wait` seconds for it to exit by itself);
        how it ended."""
        if self.process is None:
            if self._stderr is not None:  # the start failed before there was a child
                self._stderr.close()
                self._stderr = None
            return "not running"
        try:
            returncode = self.process.wait(timeout=wait) if wait > 0 else self.process.poll()
        except subprocess.TimeoutExpired:
            returncode = None
        try:
            # its group: the child and whatever stayed in it
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        final = self.process.wait()
        ending = describe_exit(returncode if returncode is not None else final)
        self._watching.set()
        if self._watcher is not None:
            self._watcher.join()
        if self.sock is not None:
            self.sock.close()
        if self._stderr is not None:
            self.last_error = _last_line(self._stderr.fileno())
            self._stderr.close()
            self._stderr = None
        self.stray += end_new_descendants(self._before)
        if self._cgroup is not None:
            self._cgroup.close()
        _remove_tree(self.workdir)
        self.process = self.sock = self.workdir = None
        return ending

    def _watch_writes(self, workdir: str, process: subprocess.Popen) -> None:
        """Stop the child (its whole group) once what it wrote holds more than the limits
        allow.

        RLIMIT_FSIZE caps one file; this caps them all: the files in its folder (Landlock keeps
        writes there) and the files its processes keep open or mapped after deleting them. Its
        processes (from its pids cgroup, or a walk of `/proc`) are listed every half second.
        """
        limits = self.settings.limits
        pids, tick = [process.pid], 0
        while not self._watching.wait(0.05):
            # its processes, and their mappings, are looked for at every 10th look only
            slow = tick % 10 == 0
            tick += 1
            if slow:
                in_cgroup = self._cgroup.pids() if self._cgroup is not None else None
                pids = (
                    in_cgroup
                    if in_cgroup is not None
                    else [process.pid]
                    + [key[0] for key in descendants() if key not in self._before]
                )
            used, files = _folder_use(workdir, limits.write_files)
            try:
                hidden = held_after_deletion(pids, with_mappings=slow)
            except HiddenFiles:
                self._stop(process, "hid its open files from the grader (stopped)")
                return
            if used + hidden > limits.write_bytes or files > limits.write_files:
                what = (
                    f"more than {limits.write_files} files in its folder"
                    if files > limits.write_files
                    else f"more than {limits.write_bytes / 2**20:g} MiB in its folder"
                    if used > limits.write_bytes
                    else f"more than {limits.write_bytes / 2**20:g} MiB, counting the "
                    "files it deleted but kept open"
                )
                self._stop(process, f"wrote {what} (stopped)")
                return

    def _stop(self, process: subprocess.Popen, why: str) -> None:
        """Kill the child's group for what it wrote; the notebook scores 0 for `why`."""
        self.overflow = why
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            pass

    def close(self) -> None:
        """Say goodbye to a live child, give it a second to exit, then end everything it
        started."""
        if self.process is None:
            return
        try:
            wire.send_request(self.sock, ("bye",))
        except OSError:
            pass
        self._end(1.0)

    # --- requests
    def ask(self, request: tuple) -> dict:
        """Send one request and wait for the answer; anything but an answer is a
        StudentFailure."""
        if self.process is None:
            raise StudentFailure(
                "the process running your code", "an answer", "it is not running"
            )
        scenario = scenario_deadline()
        try:
            wire.send_request(self.sock, request)
            return wire.read_answer(
                self.sock, self.deadline if scenario is None else min(scenario, self.deadline)
            )
        except TimeoutError:
            if scenario is not None and scenario < self.deadline:
                # the scenario's limit, not the notebook's: the child is mid-call
                self.discard()
                raise scenario_expired() from None
            self.expired = True
            self._end(0)
            raise StudentFailure(
                "time limit",
                f"the whole notebook graded within {self.timeout:g} s",
                f"its {self.timeout:g} s ran out during this step",
            ) from None
        except (wire.ChildGone, OSError):
            ending = self._end(1.0)
            self.endings.append(ending)
            raise StudentFailure(
                "the process running your code", "an answer", f"it ended ({ending})"
            ) from None
        except wire.ProtocolError as exc:
            self.discard()
            raise StudentFailure(
                "the answer from your code", "a well-formed answer", clean_text(str(exc))
            ) from None
        # Ctrl-C (or an in-process time limit) stopped the wait: the child is mid-call
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """End a child that can no longer be trusted to be in step (the next scenario starts a
        new one)."""
        self._end(0)


def _folder_use(path: str, max_files: int) -> tuple[int, int]:
    """(bytes on disk, files) under `path`, counting at most `max_files` + 1 files."""
    used = files = 0
    stack = [path]
    while stack and files <= max_files:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            files += 1
            used += (
                max(info.st_blocks * 512, 0) if hasattr(info, "st_blocks") else info.st_size
            )
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return used, files


def _last_line(fd: int, tail: int = 4096) -> str:
    """The last non-empty line of the file open as `fd` (its last `tail` bytes), cleaned for a
    grade sheet. It reads at an offset of its own: the child shares the file's position."""
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, tail, max(0, size - tail))
    except OSError:
        return ""
    lines = data.decode(errors="replace").strip().splitlines()
    return clean_text(lines[-1], 200) if lines else ""


def _remove_tree(path: str | None) -> None:
    """Remove the child's working directory, even where its code took away permissions."""
    if path is None:
        return

    def retry(function: Any, target: str, _exc: Any) -> None:
        try:
            # the folder that holds it, and a folder to be listed or removed, but never a link:
            # chmod follows one, and would open up the file it points to
            _open_folder(os.path.dirname(target))
            _open_folder(target)
            function(target)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)


def _open_folder(path: str) -> None:
    """Give the owner every right on `path` if it is a folder; leave anything else (a link
    above all) as it is."""
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        return
    if os.chmod in os.supports_follow_symlinks:  # macOS: what was checked is what changes
        os.chmod(path, stat.S_IRWXU, follow_symlinks=False)
    else:
        os.chmod(path, stat.S_IRWXU)


class RemoteStudent(StudentSide):
    """The student's world for one name the notebook defines, living in a `GradingChild`."""

    runs_in_this_process = False

    def __init__(self, child: GradingChild, target: str) -> None:
        self.child = child
        self.__name__ = target
        self.wants_state = False
        self._state: StateFields | None = None
        self._state_failure: StudentFailure | None = None

    def start(self, spec: WorldSpec) -> None:
        self._ensure_child()
        self.wants_state = spec.kind != "function"
        self._interpret(self.child.ask(("start", self.__name__, spec, self.wants_state)))

    def run(self, action: Call) -> Any:
        return self._interpret(
            self.child.ask(("run", self.__name__, action, self.wants_state))
        )

    def state(self) -> StateFields:
        if self._state_failure is not None:
            raise self._state_failure
        if self._state is None:
            raise StudentFailure(
                "state (reading your object's fields)",
                "readable fields",
                "no state was reported",
            )
        return self._state

    def enter(self, name: str, args: tuple) -> None:
        self._ensure_child()
        self._interpret(self.child.ask(("enter", name, args)), state=False)

    def exit(self, name: str) -> None:
        if self.child.process is None:
            return
        try:
            self._interpret(self.child.ask(("exit", name)), state=False)
        except (StudentFailure, StudentRaised):
            # the scenario is over either way; a broken child is replaced at the next start
            pass

    def _ensure_child(self) -> None:
        if self.child.process is None:
            try:
                self.child.start()
            except StartFailed as failed:
                raise StudentFailure(
                    "the process running your code", "a fresh start", str(failed)
                ) from None

    def _interpret(self, answer: dict, state: bool | None = None) -> Any:
        try:
            return self._decode(answer, self.wants_state if state is None else state)
        except wire.ProtocolError as exc:
            self.child.discard()
            raise StudentFailure(
                "the answer from your code", "a well-formed answer", clean_text(str(exc))
            ) from None

    def _decode(self, answer: dict, state: bool) -> Any:
        if "reference" in answer:
            raise StudentFailure(*reference_complaint(clean_text(answer["reference"], 200)))
        if "raised" in answer:
            exception = wire.decode(answer["raised"])
            if not isinstance(exception, BaseException):
                raise wire.ProtocolError("a raised value that is not an exception")
            raise StudentRaised(exception)
        if "ok" not in answer:
            raise wire.ProtocolError(f"an answer without a result (keys {sorted(answer)[:5]})")
        value = wire.decode(answer["ok"])
        if state:
            self._state, self._state_failure = None, None
            if "state_error" in answer:
                error = wire.decode(answer["state_error"])
                shown = (
                    describe_exception(error)
                    if isinstance(error, BaseException)
                    else clean_text(error)
                )
                self._state_failure = StudentFailure(
                    "state (reading your object's fields)", "readable fields", shown
                )
            else:
                self._state = _state_fields(wire.decode(answer.get("state")))
        return value


def _state_fields(value: Any) -> StateFields:
    if not (
        isinstance(value, list)
        and all(isinstance(f, tuple) and len(f) == 2 and isinstance(f[0], str) for f in value)
    ):
        raise wire.ProtocolError("a state that is not a list of (field name, value) pairs")
    return value
