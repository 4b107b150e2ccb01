"""The parts the command-line grader is built from: the wire format, reasons, tables, limits,
sandbox, processes."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import grader as course
from grader.exercises import broken
from grader.exercises.catalogue import EXERCISES, exercise_for
from grader.grading import check_names, read_notebook
from grader.lockstep.report import CheckResult, Divergence, GradeReport
from grader.sandbox import wire
from grader.sandbox.limits import landlock_abi
from grader.sandbox.remote import clean_text, describe_exit

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _grading_as_root_is_asked_for(monkeypatch):
    """These tests may run as root (a container): they ask for it as an instructor would."""
    monkeypatch.setenv("GRADER_ALLOW_ROOT", "1")


plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.integers() | st.text(max_size=4), inner, max_size=4)
        | st.frozensets(st.integers(), max_size=4)
    ),
    max_leaves=20,
)


@given(plain)
def test_plain_values_cross_the_wire_unchanged(value):
    decoded = wire.decode(json.loads(json.dumps(wire.encode(value))))
    assert decoded == value and type(decoded) is type(value)


@given(
    st.recursive(
        st.none() | st.integers() | st.text(max_size=3) | st.booleans(),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.text(max_size=2), inner, max_size=3)
        ),
        max_leaves=12,
    )
)
def test_any_json_either_decodes_or_is_a_protocol_error(data):
    try:
        wire.decode(data)
    except wire.ProtocolError:
        pass


@pytest.mark.parametrize(
    "data, words",
    [
        ({"l": 3}, "not in the grader's encoding"),
        ({"s": [{"l": [1]}]}, "cannot be one"),
        ({"d": [[{"l": []}, 1]]}, "cannot be one"),
        ({"x": [[], "message"]}, "without a type name"),
        ({"q": []}, "tagged 'q'"),
        ({"l": [], "t": []}, "not in the grader's encoding"),
    ],
)
def test_malformed_values_are_protocol_errors(data, words):
    with pytest.raises(wire.ProtocolError, match=words):
        wire.decode(data)


def test_what_is_not_plain_data_is_shown_but_equal_to_nothing():
    class Thing:
        pass

    decoded = wire.decode(wire.encode([np.int64(3), Thing(), np.array([1, 2])]))
    # numpy integers count as the int they stand for
    assert decoded[0] == 3 and type(decoded[0]) is int
    assert (
        decoded[1] != decoded[1]
        and "0x" not in repr(decoded[1])
        and "Thing object" in repr(decoded[1])
    )
    assert decoded[2] != [1, 2] and repr(decoded[2]) == "array([1, 2])"
    deep = []
    for _ in range(100):
        deep = [deep]
    assert "too large" in repr(wire.decode(wire.encode(deep)))


def test_a_students_exception_keeps_its_name_message_and_builtin_base():
    class ShapeError(ValueError):
        pass

    exc = wire.decode(wire.encode(ShapeError("bad shape")))
    assert (
        isinstance(exc, ValueError)
        and type(exc).__name__ == "ShapeError"
        and str(exc) == "bad shape"
    )
    key_error = wire.decode(wire.encode(KeyError("x")))
    assert isinstance(key_error, KeyError) and str(key_error) == "'x'"
    # never something that could stop the grader itself
    exit_request = wire.decode(wire.encode(SystemExit(3)))
    assert isinstance(exit_request, Exception) and not isinstance(exit_request, SystemExit)


def test_frames_have_a_size_limit_and_answers_must_be_objects():
    ours, theirs = socket.socketpair()
    theirs.sendall(b"\x00\x00\x00\x05[1,2]")
    with pytest.raises(wire.ProtocolError, match="JSON list"):
        wire.read_answer(ours, None)
    theirs.sendall(b"\xff\xff\xff\xff")
    with pytest.raises(wire.ProtocolError, match="at most"):
        wire.read_answer(ours, None)
    theirs.close()
    with pytest.raises(wire.ChildGone):
        wire.read_answer(ours, None)
    quiet, _other = socket.socketpair()
    with pytest.raises(TimeoutError):
        wire.read_answer(quiet, 0.0)


def test_text_from_the_child_is_one_clean_line():
    assert clean_text("a\nb\x00c\x1b[31m") == "a b c [31m"
    assert len(clean_text("x" * 1000)) == 300
    assert (
        describe_exit(0) == "exit code 0"
        and describe_exit(-24) == "killed by SIGXCPU (CPU time limit)"
    )


def test_a_shared_first_difference_is_shown_once_with_its_count():
    same = Divergence(
        1,
        "BlockManager(num_blocks=8, block_size=4)",
        "result",
        "a new object",
        "TypeError: boom",
    )
    report = GradeReport(
        "check",
        [
            CheckResult("a", "first", False, 1, same),
            CheckResult(
                "b",
                "second",
                False,
                1,
                Divergence(1, "other action", "result", "a new object", "TypeError: boom"),
            ),
            CheckResult("c", "third", False, 2, Divergence(2, "x", "return value", "1", "2")),
            CheckResult("d", "fourth", True, 5),
        ],
    )
    lines = report.table().splitlines()
    assert lines[0] == "check: 1/4 checks passed"
    assert sum("TypeError: boom" in line for line in lines) == 1
    assert lines[6].strip() == "(the same difference fails 2 rows)"
    assert lines[7].endswith("second (1 step): same difference as a")
    assert "expected 1" in "\n".join(lines[8:])


def test_a_long_list_is_shown_around_its_first_difference():
    """The element that differs is never hidden: `where` names its index, and a list too long
    for a line shows its neighbours with their positions."""
    from grader.lockstep.engine import first_difference

    expected = list(range(60))
    found = [*expected[:40], 99, *expected[41:]]
    assert first_difference([("free queue", expected)], [("free queue", found)]) == (
        "free queue, first difference at index 40",
        "items 37-43 of 60: [..., 37, 38, 39, 40, 41, 42, 43, ...]",
        "items 37-43 of 60: [..., 37, 38, 39, 99, 41, 42, 43, ...]",
    )
    # one list a prefix of the other; a short list is shown whole
    assert first_difference([("q", expected)], [("q", expected[:-1])]) == (
        "q, first difference at index 59",
        "items 56-59 of 60: [..., 56, 57, 58, 59]",
        "items 56-58 of 59: [..., 56, 57, 58]",
    )
    assert first_difference([("q", [[], [3, 2]])], [("q", [[], [2, 3]])]) == (
        "q, first difference at [1][0]",
        "[[], [3, 2]]",
        "[[], [2, 3]]",
    )


def test_failing_rows_that_first_go_wrong_in_one_call_are_named_once_at_the_top():
    """A deallocate that frees first to last fails 7 rows, each in its own way: the line under
    the header points at the call they share."""
    from refimpl.paged import BlockManager

    class FreesFirstToLast(BlockManager):  # a student's slip: the table walked forwards
        def deallocate(self, seq):
            for block_id in seq.block_table:
                block = self.blocks[block_id]
                block.ref_count -= 1
                if block.ref_count == 0:
                    self._deallocate_block(block_id)
            seq.num_cached_tokens = 0
            seq.block_table.clear()

    lines = (
        course.check_block_manager(FreesFirstToLast, verbose=False, allow_reference=True)
        .table()
        .splitlines()
    )
    # (6 of 7 here: the slip also leaves the reference's own table of tables behind)
    assert re.fullmatch(
        r"  (all|\d of) 7 failing rows first go wrong in a call to deallocate: one mistake "
        r"there may explain them all",
        lines[1],
    ), lines[1]
    assert sum("first go wrong" in line for line in lines) == 1

    def row(name: str, action: str, found: str) -> CheckResult:
        return CheckResult(
            name, "", False, 3, Divergence(3, action, "return value", "1", found)
        )

    report = GradeReport(
        "check",
        [
            row("a", "allocate_slots(A, 16 new tokens)", "2"),
            row("b", "allocate_slots(R0, 9 new tokens)", "3"),
            row("c", "group 1: allocate_slots(R0, 7 new tokens)", "4"),
            row("d", "remove_skipped_blocks(A, total_computed_tokens=8)", "5"),
            row("e", "remove_skipped_blocks(A, total_computed_tokens=12)", "6"),
            row("f", "get_num_skipped_tokens(8)", "7"),
            CheckResult("g", "", True, 4),
        ],
    )
    assert report.table().splitlines()[1] == (
        "  3 of 6 failing rows first go wrong in a call to allocate_slots, 2 in "
        "remove_skipped_blocks: one mistake there may explain them all"
    )
    # a grader of one function calls nothing else: the line would say nothing
    report.one_function = True
    assert "first go wrong" not in report.table()


@pytest.mark.parametrize(
    "metadata, words",
    [
        ("01_block_manager", "refimpl_course metadata is a str"),
        ({"exercise": ["01_block_manager"]}, "refimpl_course.exercise is a list"),
        (
            {"exercise": "02_prefix_cache"},
            "names exercise 02_prefix_cache, but the file is named 01_block_manager.ipynb",
        ),
        (
            {"exercise": "99_nothing"},
            "not an exercise notebook (its metadata names '99_nothing')",
        ),
    ],
)
def test_malformed_or_contradicting_metadata_is_refused_with_a_reason(metadata, words):
    nb = nbformat.v4.new_notebook(metadata={"refimpl_course": metadata})
    with pytest.raises(ValueError) as info:
        exercise_for(nb, "submissions/alice/01_block_manager.ipynb")
    assert words in str(info.value)
    assert (
        exercise_for(nbformat.v4.new_notebook(), "01_block_manager.ipynb")
        is EXERCISES["01_block_manager"]
    )


@pytest.mark.parametrize(
    "content, words",
    [
        (b"", "cannot read it as a notebook"),
        (b"\xff\xfe", "UnicodeDecodeError"),
        (
            json.dumps(
                {
                    "cells": [
                        {
                            "cell_type": "code",
                            "id": "a",
                            "source": 7,
                            "metadata": {},
                            "outputs": [],
                            "execution_count": None,
                        }
                    ],
                    "metadata": {},
                    "nbformat": 4,
                    "nbformat_minor": 5,
                }
            ).encode(),
            "cell 1 is not a cell with text",
        ),
    ],
)
def test_unreadable_notebooks_are_value_errors(content, words):
    with pytest.raises(ValueError, match=words):
        read_notebook(Path("x.ipynb"), content)


def test_every_exercise_knows_its_rows_without_running_them():
    counts = {
        name: sum(len(check_names(grader)) for grader, _ in exercise.checks)
        for name, exercise in EXERCISES.items()
    }
    assert counts == {
        "01_block_manager": 10,
        "02_prefix_cache": 15,
        "03_scheduler": 11,
        "04_packed_layout": 26,
        "05_hybrid_allocator": 17,
        "06_slot_addressing": 7,
    }


@pytest.mark.skipif(
    not hasattr(broken, "_ConfigurableScheduler"),
    reason="broken.py has no complete scheduler copy",
)
def test_the_courses_own_copy_of_the_reference_counts_as_the_reference():
    report = course.check_scheduler(broken._ConfigurableScheduler, verbose=False)
    assert report.num_passed == 0
    assert (
        "grader.exercises.broken._ConfigurableScheduler.schedule"
        in report.results[0].divergence.found
    )


# --- in child processes of their own
def _run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_the_childs_refimpl_holds_no_answer_and_no_copy_of_one(tmp_path):
    """What a grading child of exercises 1 and 4 imports: stubs for the answers, no source of
    them anywhere, no broken variants, and the rest of refimpl as it is."""
    from grader.exercises.answer_free import answer_free_sources

    sources = answer_free_sources(["check_block_manager", "check_approximate_gcd"])
    (tmp_path / "sources.json").write_text(json.dumps(sources))
    done = _run_python(
        """
        import json, linecache, sys
        from grader.exercises import answer_free
        answer_free.install(json.load(open("sources.json")))
        import grader
        from grader.exercises.answer_free import ReferenceUsed
        from refimpl.paged import BlockManager, Scheduler, SchedulerConfig
        import refimpl.hybrid.kv_cache_planning as planning
        grader.check_block_manager  # the set-up cell's import works
        calls = {
            "BlockManager": lambda: BlockManager(4, 4),
            "approximate_gcd": lambda: planning.approximate_gcd([4, 6]),
            "get_kv_cache_groups": lambda: planning.get_packed_kv_cache_groups,
        }
        for name, call in calls.items():
            try:
                call()
                print(name, "ran")
            except ReferenceUsed as used:
                print(name, "stub", used.qualified_name)
        for module in ("grader.exercises.broken", "refimpl.course.prefix_match", "refimpl.viz"):
            try:
                __import__(module)
                print(module, "imported")
            except ImportError:
                print(module, "refused")
        sources = ["".join(entry[2]) for entry in linecache.cache.values() if len(entry) == 4]
        print("source in linecache", any("def can_allocate" in s for s in sources))
        print("file", getattr(sys.modules["refimpl.paged.block_manager"], "__file__", None))
        print("scheduler", Scheduler.__module__, SchedulerConfig(num_kvcache_blocks=4).eos)
    """,
        tmp_path,
    )
    assert done.stdout.splitlines() == [
        "BlockManager stub refimpl.paged.block_manager.BlockManager.__init__",
        "approximate_gcd stub refimpl.hybrid.kv_cache_planning.approximate_gcd",
        "get_kv_cache_groups ran",
        "grader.exercises.broken refused",
        "refimpl.course.prefix_match refused",
        "refimpl.viz imported",
        "source in linecache False",
        "file None",
        "scheduler refimpl.paged.scheduler -1",
    ], done.stderr


@pytest.mark.slow
def test_limits_turn_a_memory_hog_into_a_memory_error(tmp_path):
    done = _run_python(
        """
        from grader.sandbox.limits import Limits
        Limits().apply()
        try:
            hog = bytearray(64 * 2**30)
        except MemoryError:
            print("refused")
        import torch  # a large library still imports under the data limit
        print("torch", torch.ones(2).sum().item())
    """,
        tmp_path,
    )
    assert done.stdout.splitlines() == ["refused", "torch 2.0"], done.stderr


@pytest.mark.slow
@pytest.mark.skipif(landlock_abi() == 0, reason="needs Landlock (Linux 5.13 or later)")
def test_landlock_limits_writes_reads_and_connections(tmp_path):
    work, private, outside = tmp_path / "work", tmp_path / "private", tmp_path / "outside.txt"
    work.mkdir()
    private.mkdir()
    (private / "secret.txt").write_text("solution")
    done = _run_python(
        f"""
        import socket, refimpl.paged.block_manager as reference
        from grader.sandbox.limits import file_rules, restrict
        rules = file_rules({str(work)!r}, [{str(private)!r}], [reference.__file__])
        restrict(rules)
        def attempt(label, action):
            try:
                action()
                print(label, "allowed")
            except OSError as exc:
                print(label, "refused", type(exc).__name__)
        attempt("write in work", lambda: open({str(work / "x")!r}, "w").write("x"))
        attempt("write outside", lambda: open({str(outside)!r}, "w").write("x"))
        attempt("read protected", lambda: open({str(private / "secret.txt")!r}).read())
        attempt("read reference source", lambda: open(reference.__file__).read())
        attempt("read refimpl", lambda: open(reference.__file__.replace("block_manager", "sequence")).read())
        attempt("tcp", lambda: socket.create_connection(("127.0.0.1", 9), timeout=1))
    """,
        tmp_path,
    )
    lines = done.stdout.splitlines()
    assert lines[:5] == [
        "write in work allowed",
        "write outside refused PermissionError",
        "read protected refused PermissionError",
        "read reference source refused PermissionError",
        "read refimpl allowed",
    ], done.stdout + done.stderr
    assert lines[5] == ("tcp refused PermissionError" if landlock_abi() >= 4 else lines[5])
    assert not outside.exists()


@pytest.mark.slow
def test_a_detached_process_is_found_killed_and_reaped(tmp_path):
    from grader.sandbox.processes import descendants, end_new_descendants, subreaper

    with subreaper() as enabled:
        if not enabled:
            pytest.skip("needs Linux's child subreaper")
        before = set(descendants())
        # the middle process forks the sleeper, writes both pids, then exits (it may linger
        # as an unreaped zombie re-parented here)
        pids = tmp_path / "pids"
        script = (
            "import os, sys, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    sleeper = os.fork()\n"
            "    if sleeper == 0:\n"
            "        time.sleep(60)\n"
            "    else:\n"
            "        with open(sys.argv[1] + '.tmp', 'w') as f:\n"
            "            f.write(f'{os.getpid()} {sleeper}')\n"
            "        os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
            "    os._exit(0)\n"
            "os._exit(0)\n"
        )
        subprocess.run([sys.executable, "-c", script, str(pids)], check=True)
        # wait until the middle process has exited and only the sleeper runs: counting
        # earlier could catch the middle one still alive (a race of the test, not a leak)
        deadline = time.monotonic() + 5
        middle = sleeper = None
        while True:
            living = {
                key[0]
                for key, state in descendants().items()
                if key not in before and state != "Z"
            }
            if pids.exists():
                middle, sleeper = map(int, pids.read_text().split())
                if middle not in living and sleeper in living:
                    break
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert living == {sleeper}  # the grandchild, re-parented to this process
        assert end_new_descendants(before) == 1
        assert [key for key in descendants() if key not in before] == []


def test_the_grade_sheet_is_written_row_by_row(tmp_path, monkeypatch, capsys):
    """A run stopped after the first notebook keeps the header and that notebook's row on
    disk."""
    from grader.grading import NotebookGrade, failed_grade
    from refimpl.__main__ import main as refimpl_main

    first, second = (
        tmp_path / "a" / "01_block_manager.ipynb",
        tmp_path / "b" / "01_block_manager.ipynb",
    )
    for path in (first, second):
        path.parent.mkdir()
        path.write_text("{}")
    csv_path = tmp_path / "grades.csv"

    def fake_grade(path, **kwargs):
        if Path(path) == second:
            raise KeyboardInterrupt
        grade: NotebookGrade = failed_grade(
            path, EXERCISES["01_block_manager"], "timed out after 3 s"
        )
        return grade

    monkeypatch.setattr("grader.grading.grade_notebook", fake_grade)
    with pytest.raises(KeyboardInterrupt):
        refimpl_main(["grade", "--quiet", "--csv", str(csv_path), str(first), str(second)])
    lines = csv_path.read_text().splitlines()
    assert lines[0] == "notebook,exercise,passed,checks,failed_checks,reason"
    assert (
        len(lines) == 2
        and lines[1].startswith(f"{first},01_block_manager,0,10,")
        and lines[1].endswith(",timed out after 3 s")
    )


@pytest.mark.slow
def test_the_student_bundle_has_no_solutions(tmp_path):
    import zipfile

    from grader.bundle import STUDENT_GUIDE, build, solution_leaks

    # a developer's checkout may hold local edits: this test is about the solutions
    archive = build(ROOT, tmp_path / "student-bundle", allow_dirty=True)
    folder = tmp_path / "student-bundle"
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert not any(name.startswith("notebooks/exercises/solutions") for name in names)
    assert {f"notebooks/exercises/{n}.ipynb" for n in EXERCISES} <= set(names)
    assert (
        "grader/grading.py" in names
        and "Makefile" in names
        and ".git" not in {n.split("/")[0] for n in names}
    )
    assert (folder / "notebooks/exercises/README.md").read_text() == STUDENT_GUIDE
    assert solution_leaks(folder, names) == []
    with zipfile.ZipFile(archive) as zipped:
        assert sorted(n.split("/", 1)[1] for n in zipped.namelist()) == names
    assert solution_leaks(ROOT, ["notebooks/exercises/solutions/01_block_manager.ipynb"]) == [
        "notebooks/exercises/solutions/01_block_manager.ipynb"
    ]


def test_the_references_helpers_count_as_the_reference():
    """`_prefix_hits` is the whole matching walk: only the asked-for methods use it, so it is
    counted as the reference too (and the grading child's refimpl lacks it)."""
    from refimpl.paged import BlockManager

    # every listed method written, the work done by the helpers
    class OwnMatchOnTop(BlockManager):
        def can_allocate(self, seq):
            hits = self._prefix_hits(seq, seq.num_blocks - 1)
            needed = seq.num_blocks - sum(b in self.used_block_ids for b in hits)
            return len(hits) if len(self.free_block_ids) >= needed else -1

        def allocate(self, seq, num_cached_blocks):
            super().allocate(seq, len(self._prefix_hits(seq, num_cached_blocks)))

    report = course.check_prefix_cache(OwnMatchOnTop, verbose=False)
    assert report.num_passed == 0
    assert "BlockManager._prefix_hits" in report.results[0].divergence.found
    assert (
        course.check_prefix_cache(
            OwnMatchOnTop, verbose=False, allow_reference=True
        ).num_passed
        > 0
    )


@pytest.mark.slow
def test_a_child_that_cannot_set_itself_up_says_so_before_any_student_code_runs():
    from grader.sandbox.remote import ChildSettings, GradingChild, StartFailed

    with GradingChild(
        ChildSettings(cells=[(1, "x = 1")], checks=["check_nothing"], targets=["x"]),
        timeout=60,
    ) as child:
        with pytest.raises(
            StartFailed,
            match=r"the grader could not set up the process for its code \(ValueError: check_name must be",
        ):
            child.start()
        assert child.process is None and child.stray == 0


def test_python_m_grader_takes_the_same_arguments_as_refimpl_grade(capsys):
    from grader.__main__ import main as grader_main

    assert grader_main(["--timeout", "0", "x.ipynb"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m grader: error: argument --timeout: must be a number")
    assert grader_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--allow-root" in out and "(default: 120.0)" in out
    # a flag shows no default (--no-sandbox's would read "True", the opposite of its meaning)
    assert "(default: True)" not in out and "(default: False)" not in out


def test_intake_refuses_links_anywhere_hard_links_and_a_file_given_twice(
    tmp_path, monkeypatch
):
    """A notebook under a linked folder, a hard link to a classmate's notebook, the same file
    named twice: each is refused with a one-line reason that quotes nothing of the file."""
    from grader.grading import read_submission

    secret = b'{"cells": [], "SECRET-LINE": 1}'
    real = tmp_path / "alice"
    real.mkdir()
    (real / "01_block_manager.ipynb").write_bytes(secret)
    (tmp_path / "bob").symlink_to(real)  # bob's folder is alice's
    (tmp_path / "carol").mkdir()
    os.link(real / "01_block_manager.ipynb", tmp_path / "carol" / "01_block_manager.ipynb")
    (tmp_path / "dave").mkdir()
    honest = tmp_path / "dave" / "01_block_manager.ipynb"
    honest.write_bytes(b"{}")
    cases = {
        tmp_path / "bob" / "01_block_manager.ipynb": "its path goes through a symbolic link "
        f"({tmp_path / 'bob'})",
        tmp_path / "carol" / "01_block_manager.ipynb": "it has 2 names (hard links)",
        real / "01_block_manager.ipynb": "it has 2 names (hard links)",
        tmp_path / "dave": "it is a folder, not a regular file",
        tmp_path / "nobody" / "x.ipynb": "cannot read it (No such file or directory)",
    }
    for path, words in cases.items():
        with pytest.raises(ValueError) as raised:
            read_submission(path)
        assert words in str(raised.value) and "SECRET" not in str(raised.value), path
        assert "\n" not in str(raised.value)
    seen: dict = {}
    assert read_submission(honest, seen) == b"{}"
    monkeypatch.chdir(tmp_path / "dave")  # a relative path names the same file
    with pytest.raises(ValueError, match=f"it is the same file as {honest}$"):
        read_submission(Path("01_block_manager.ipynb"), seen)
    # a relative path starts where the working folder really is, however it was reached
    monkeypatch.chdir(tmp_path / "bob")
    (tmp_path / "carol" / "01_block_manager.ipynb").unlink()
    assert read_submission(Path("01_block_manager.ipynb")) == secret


def test_cleanup_never_changes_the_mode_of_a_file_a_link_points_to(tmp_path, monkeypatch):
    """The child's folder holds a read-only folder with a link to a file outside: removing it
    as a user who may not unlink there (emulated: root may) opens the folder, never the
    file."""
    from grader.sandbox import remote

    victim = tmp_path / "victim.txt"
    victim.write_text("instructor's")
    victim.chmod(0o644)
    workdir = tmp_path / "workdir"
    (workdir / "d").mkdir(parents=True)
    (workdir / "d" / "l").symlink_to(victim)
    (workdir / "d" / "plain.txt").write_text("x")
    (workdir / "d").chmod(0o500)
    real_unlink = os.unlink

    def unlink(path, *, dir_fd=None):
        # what the kernel does for a user other than root: no unlinking in a read-only folder
        folder = os.fstat(dir_fd) if dir_fd is not None else os.lstat(os.path.dirname(path))
        if not folder.st_mode & 0o200:
            raise PermissionError(13, "Permission denied", path)
        real_unlink(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", unlink)
    remote._remove_tree(str(workdir))
    assert not workdir.exists()
    assert (victim.stat().st_mode & 0o7777, victim.read_text()) == (0o644, "instructor's")


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")
def test_deleted_files_held_open_or_mapped_are_measured(tmp_path, monkeypatch):
    """An open deleted file counts by its size on disk, a mapped one by its size (or, where
    `map_files` is closed to the grader, by what is mapped of it); a file that still has a
    name does not count (the folder's walk counts it); closed entries are an error."""
    import ctypes
    import mmap

    from grader.sandbox import processes

    me = [os.getpid()]
    real_stat = os.stat

    def no_map_files(path, *args, **kwargs):
        if "/map_files/" in str(path):
            raise PermissionError(1, "Operation not permitted", path)
        return real_stat(path, *args, **kwargs)

    def measured_without_map_files() -> int:
        monkeypatch.setattr(os, "stat", no_map_files)
        try:
            return processes.held_after_deletion(me)
        finally:
            monkeypatch.setattr(os, "stat", real_stat)

    # what this process already holds (a test worker may map deleted files of its own), once
    # per way of measuring
    baseline = processes.held_after_deletion(me)
    baseline_open = processes.held_after_deletion(me, with_mappings=False)
    baseline_mapped_part = measured_without_map_files()
    named = os.open(tmp_path / "named.bin", os.O_RDWR | os.O_CREAT)
    os.write(named, b"x" * 2**20)
    opened = os.open(tmp_path / "opened.bin", os.O_RDWR | os.O_CREAT)
    os.write(opened, b"x" * 3 * 2**20)
    os.unlink(tmp_path / "opened.bin")
    mapped = os.open(tmp_path / "mapped.bin", os.O_RDWR | os.O_CREAT)
    os.write(mapped, b"x" * 2 * 2**20)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, *[ctypes.c_int] * 3, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    # its first MiB only
    address = libc.mmap(None, 2**20, mmap.PROT_READ, mmap.MAP_SHARED, mapped, 0)
    os.close(mapped)
    os.unlink(tmp_path / "mapped.bin")
    try:
        assert processes.held_after_deletion(me) - baseline == 5 * 2**20
        assert (
            processes.held_after_deletion(me, with_mappings=False) - baseline_open == 3 * 2**20
        )
        assert measured_without_map_files() - baseline_mapped_part == 4 * 2**20

        def closed(path):
            raise PermissionError(13, "Permission denied", path)

        monkeypatch.setattr(os, "listdir", closed)
        with pytest.raises(processes.HiddenFiles):
            processes.held_after_deletion(me)
    finally:
        libc.munmap(address, 2**20)
        os.close(opened)
        os.close(named)


def _grade_quietly(capsys, *paths: Path) -> tuple[int, dict[str, str], list[str]]:
    """`python -m refimpl grade --quiet PATHS`: its status, each notebook's score line by path,
    and every line it printed."""
    from refimpl.__main__ import main as refimpl_main

    status = refimpl_main(["grade", "--quiet", *map(str, paths)])
    lines = capsys.readouterr().out.splitlines()
    scores = {
        head[3:].rsplit(" (", 1)[0]: score
        for head, score in zip(lines, lines[1:])
        if head.startswith("== ") and not head.startswith("== total")
    }
    return status, scores, lines


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_intake_gives_every_entry_named_like_a_notebook_a_row_and_a_reason(tmp_path, capsys):
    """A FIFO, a folder and a link named like exercises each get a row saying what they are
    (their exercises' checks still count), and the total line is printed."""
    folder = tmp_path / "bob"
    folder.mkdir()
    os.mkfifo(folder / "02_prefix_cache.ipynb")
    (folder / "03_scheduler.ipynb").mkdir()
    (folder / "04_packed_layout.ipynb").symlink_to(tmp_path / "elsewhere.ipynb")
    status, scores, lines = _grade_quietly(capsys, folder)
    assert status == 1
    assert scores == {
        f"{folder}/02_prefix_cache.ipynb": "score: 0/15 checks passed (0.0%): it is a FIFO "
        "(named pipe), not a regular file",
        f"{folder}/03_scheduler.ipynb": "score: 0/11 checks passed (0.0%): it is a folder, "
        "not a regular file",
        f"{folder}/04_packed_layout.ipynb": "score: 0/26 checks passed (0.0%): it is a "
        "symbolic link; hand in the notebook file itself",
    }
    assert lines[-1] == "== total: 0/52 checks passed over 3 notebooks"
    # one notebook alone still ends with the total
    _, _, lines = _grade_quietly(capsys, folder / "03_scheduler.ipynb")
    assert lines[-1] == "== total: 0/11 checks passed over 1 notebook"


def test_a_hard_link_is_blamed_on_the_name_made_later(tmp_path, capsys):
    """Mallory hard-links Alice's notebook (handed in an hour earlier) into her own folder:
    Alice's is graded, Mallory's is refused as the later name, whatever the order given. Names
    the times cannot tell apart (one folder, or a name outside the graded notebooks) are all
    refused, with a reason that blames none."""
    alice, mallory = tmp_path / "alice", tmp_path / "mallory"
    for folder in (alice, mallory):
        folder.mkdir()
    (alice / "01_block_manager.ipynb").write_text("{}")  # graded: it is not a notebook
    an_hour_ago = time.time() - 3600
    os.utime(alice, (an_hour_ago, an_hour_ago))
    os.link(alice / "01_block_manager.ipynb", mallory / "01_block_manager.ipynb")
    for order in ((alice, mallory), (mallory, alice)):
        _, scores, _ = _grade_quietly(capsys, *order)
        assert scores == {
            f"{alice}/01_block_manager.ipynb": "score: 0/10 checks passed (0.0%): cannot "
            "read it as a notebook: ValidationError",
            f"{mallory}/01_block_manager.ipynb": "score: 0/10 checks passed (0.0%): it is a "
            f"second name (hard link) of {alice}/01_block_manager.ipynb, made later; hand in "
            "a file of its own",
        }
    # a second name in Alice's own folder: the folder's time is the same for both names
    os.link(alice / "01_block_manager.ipynb", alice / "02_prefix_cache.ipynb")
    (mallory / "01_block_manager.ipynb").unlink()
    _, scores, _ = _grade_quietly(capsys, alice)
    assert len(scores) == 2 and all(
        "the folders' times cannot tell which name came first" in s for s in scores.values()
    ), scores
    # a name outside what is graded: its owner cannot be told
    _, scores, _ = _grade_quietly(capsys, alice / "01_block_manager.ipynb")
    assert "it has 2 names (hard links), not all among the notebooks graded" in "".join(
        scores.values()
    )


def test_a_nesting_bomb_is_the_submissions_fault(tmp_path, capsys):
    """A notebook nested 100,000 levels deep costs its own row, with a reason that says what it
    is (not a grader failure), and the run goes on to the next notebook."""
    bomb = tmp_path / "01_block_manager.ipynb"
    bomb.write_text("[" * 100_000 + "]" * 100_000)
    deep_metadata = tmp_path / "02_prefix_cache.ipynb"  # shallow for json, deep for nbformat
    deep_metadata.write_text(
        '{"cells": [], "metadata": {"a": ' + "[" * 900 + "]" * 900 + "}, "
        '"nbformat": 4, "nbformat_minor": 5}'
    )
    status, scores, lines = _grade_quietly(capsys, bomb, deep_metadata)
    assert status == 1
    assert scores == {
        str(path): f"score: 0/{checks} checks passed (0.0%): cannot read it as a notebook: "
        "its JSON nests deeper than Python's recursion limit (a nesting bomb, not a notebook)"
        for path, checks in ((bomb, 10), (deep_metadata, 15))
    }
    assert lines[-1] == "== total: 0/25 checks passed over 2 notebooks"


def test_the_student_bundle_refuses_local_changes_unless_allowed(tmp_path, capsys):
    """A chapter run and saved after the last commit is not bundled silently: the builder names
    it and stops, and `--allow-dirty` (`make student-bundle BUNDLE_ARGS=--allow-dirty`)
    bundles the working copy with a note."""
    from grader.bundle import main as bundle_main

    def git(*args: str) -> None:
        subprocess.run(
            ["git", "-C", str(tmp_path / "repo"), *args], check=True, capture_output=True
        )

    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "notebooks" / "05_scheduler.ipynb").write_text('{"cells": []}')
    (repo / "README.md").write_text("course")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "course")
    run = '{"cells": [], "metadata": {"run": true}}'
    (repo / "notebooks" / "05_scheduler.ipynb").write_text(run)
    out = tmp_path / "bundle"
    assert bundle_main([str(out), "--root", str(repo)]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith(
            "error: 1 tracked file with local changes would be bundled as they are now: "
            "notebooks/05_scheduler.ipynb;"
        )
        and "--allow-dirty" in err
    )
    assert not out.exists()
    assert bundle_main([str(out), "--root", str(repo), "--allow-dirty"]) == 0
    assert "note: bundling local changes to notebooks/05_scheduler.ipynb" in (
        capsys.readouterr().err
    )
    assert (out / "notebooks" / "05_scheduler.ipynb").read_text() == run
    # the Makefile hands the flag on
    makefile = (ROOT / "Makefile").read_text()
    assert "python -m grader.bundle dist/student-bundle $(BUNDLE_ARGS)" in makefile


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_an_exiting_process_whose_entries_close_is_not_hiding(monkeypatch):
    """A process that let go of its memory (exiting, here a zombie) has its /proc entries
    owned by root, closed to a grader that is not root: that is no hiding; a live process
    with closed entries is."""
    from grader.sandbox import processes

    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # exited, not reaped yet
        if Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.01)

    def closed(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(os, "listdir", closed)
    try:
        assert processes.held_after_deletion([zombie.pid]) == 0
        with pytest.raises(processes.HiddenFiles):
            processes.held_after_deletion([os.getpid()])
    finally:
        monkeypatch.undo()
        zombie.wait()
