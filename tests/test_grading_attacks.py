"""Attacks on the command-line grader: each submission tries to score without writing the code.

One class folder holds an honest submission, submissions that attack the grader, and files
that are not well-formed notebooks. The folder is graded once (`python -m grader
--csv`); every attack must score 0 (or be refused), and the honest student must still get every
check. The attacks start from the student copy of exercise 1, which scores 0/10 as handed out:
an attack that worked would raise that score.
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys
import time
from pathlib import Path

import nbformat
import pytest

from grader.exercises import broken
from grader.exercises.catalogue import SOLUTIONS_DIR, STUDENT_DIR, cell_role
from grader.grading import grade_notebook
from grader.sandbox.limits import landlock_abi
from refimpl.__main__ import main as refimpl_main

pytestmark = pytest.mark.slow  # grades a folder of notebooks in child processes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _grading_as_root_is_asked_for(monkeypatch):
    """These tests may run as root (a container): they ask for it as an instructor would."""
    monkeypatch.setenv("GRADER_ALLOW_ROOT", "1")


ABI = landlock_abi()
SLEEPER = "987.654"  # the orphan attack's long sleep, recognisable in /proc

# name -> (code before the student's solution cell, code after it); {csv}, {outside},
# {classmate} are filled in.
ATTACKS: dict[str, tuple[str, str]] = {
    "forged_result_and_exit": (
        """
import json, os, sys
perfect = {"tables": [], "rows": [["check_block_manager", f"row{i}", True] for i in range(10)], "reason": None}
for target in [*sys.argv[1:], "result.json", "../result.json"]:
    try:
        with open(target, "w") as handle:
            json.dump(perfect, handle)
    except OSError:
        pass
os._exit(0)
""",
        "",
    ),
    "forged_answers": (
        """
import json, os, struct, sys
def frame(message):
    data = json.dumps(message).encode()
    os.write(int(sys.argv[1]), struct.pack(">I", len(data)) + data)
frame({"ready": True, "problem": None, "missing": []})
for _ in range(200):
    frame({"ok": None, "state": {"l": []}})
""",
        "",
    ),
    "patched_runner": (
        "",
        """
import sys
import grader
import grader.lockstep.report
runner = sys.modules["__main__"]
runner._answer = lambda run, state: {"ok": None, "state": {"l": []}}
runner._run_graders = lambda *args, **kwargs: {"tables": [], "rows": [], "reason": None}
grader.check_block_manager = lambda *args, **kwargs: None
grader.lockstep.report.CheckResult.passed = property(lambda self: True)
""",
    ),
    "profile_off_and_delegate": (
        "",
        """
import sys
import refimpl.paged

class BlockManager(refimpl.paged.BlockManager):
    def __init__(self, num_blocks, block_size):
        sys.setprofile(None)
        super().__init__(num_blocks, block_size, enable_prefix_caching=False)

    def allocate(self, seq, num_cached_blocks):
        sys.setprofile(None)
        return super().allocate(seq, num_cached_blocks)
""",
    ),
    "reload_the_reference": (
        "",
        """
import importlib
import refimpl.paged.block_manager as module
fresh = importlib.reload(module)

class BlockManager(fresh.BlockManager):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size, enable_prefix_caching=False)
""",
    ),
    "reference_via_fresh_python": (
        "",
        """
import subprocess, sys
source = subprocess.run(
    [sys.executable, "-c", "import inspect, refimpl.paged.block_manager as m; print(inspect.getsource(m))"],
    capture_output=True, text=True, check=True,
).stdout
namespace = {"__name__": "refimpl.paged.block_manager"}
exec(source, namespace)

class BlockManager(namespace["BlockManager"]):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size, enable_prefix_caching=False)
""",
    ),
    "run_the_solution": (
        "",
        """
import json, pathlib, refimpl
solution = pathlib.Path(refimpl.__file__).resolve().parents[1] / "notebooks/exercises/solutions/01_block_manager.ipynb"
for cell in json.loads(solution.read_text())["cells"]:
    if cell["metadata"].get("refimpl_course", {}).get("role") == "solution":
        exec("".join(cell["source"]))
""",
    ),
    "orphan_rewrites_grades": (
        """
import os, shutil, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        if os.fork() == 0:
            os.execv(shutil.which("sleep"), ["sleep", "987.654"])
        end = time.time() + 8
        while time.time() < end:
            try:
                with open({csv!r}, "a") as handle:
                    handle.write("orphan,01_block_manager,10,10,,\\n")
            except OSError:
                pass
            time.sleep(0.05)
    os._exit(0)
""",
        "",
    ),
    "writes_outside": (
        """
for target in ({outside!r}, {classmate!r}, {csv!r}):
    try:
        with open(target, "a") as handle:
            handle.write("written by another student's code")
    except OSError:
        pass
""",
        "",
    ),
    "memory_hog": ("hog = bytearray(64 * 2**30)\n", ""),
}
# signals leave the sandbox only where Landlock scopes them; elsewhere this would kill the test
if ABI >= 6:
    ATTACKS["kill_the_grader"] = (
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
        "",
    )
# defeated by Landlock's read rules
NEEDS_READ_LIMITS = {"reload_the_reference", "reference_via_fresh_python", "run_the_solution"}

# name -> file content: not notebooks, or notebooks whose metadata is malformed
MALFORMED: dict[str, bytes] = {
    "not_json": b"this is not json {",
    "empty_object": b"{}",
    "binary": bytes(range(256)) * 4,
    "cells_not_a_list": json.dumps(
        {"cells": "x", "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    ).encode(),
}


def _student_copy() -> nbformat.NotebookNode:
    return nbformat.read(ROOT / STUDENT_DIR / "01_block_manager.ipynb", as_version=4)


def _with_attack(before: str, after: str) -> nbformat.NotebookNode:
    nb = _student_copy()
    cell = next(c for c in nb.cells if cell_role(c) == "solution")
    cell.source = before + "\n" + cell.source + "\n" + after
    return nb


def _malformed_notebooks() -> dict[str, nbformat.NotebookNode]:
    string_metadata = _student_copy()
    string_metadata.metadata["refimpl_course"] = "01_block_manager"
    list_exercise = _student_copy()
    list_exercise.metadata["refimpl_course"] = {
        "exercise": ["01_block_manager", "04_packed_layout"]
    }
    # handed in as exercise 1
    other_exercise = nbformat.read(
        ROOT / SOLUTIONS_DIR / "04_packed_layout.ipynb", as_version=4
    )
    source_not_text = _student_copy()
    source_not_text.cells[1]["source"] = 42
    garbage_frame = _with_attack(
        "import os, sys\nos.write(int(sys.argv[1]), b'\\xff\\xff\\xff\\xffnot a frame')\n", ""
    )
    not_an_object = _with_attack(
        "import os, sys\nos.write(int(sys.argv[1]), "
        "b'\\x00\\x00\\x00\\x05[1,2]')\nos._exit(3)\n",
        "",
    )
    return {
        "metadata_is_a_string": string_metadata,
        "exercise_is_a_list": list_exercise,
        "another_exercise": other_exercise,
        "source_not_text": source_not_text,
        "garbage_frame": garbage_frame,
        "answer_not_an_object": not_an_object,
    }


def _sleepers() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and SLEEPER in Path(
                f"/proc/{entry}/cmdline"
            ).read_bytes().decode(errors="replace"):
                found.append(int(entry))
        except OSError:
            pass
    return found


def _grade_the_class(root: Path) -> dict:
    """Grade the whole class once: {student: csv row}, and the paths involved."""
    submissions, grades = root / "submissions", root / "grades"
    grades.mkdir()
    csv_path, outside = grades / "grades.csv", root / "outside.txt"
    classmate = submissions / "zz_honest" / "01_block_manager.ipynb"
    fill = {
        "{csv!r}": repr(str(csv_path)),
        "{outside!r}": repr(str(outside)),
        "{classmate!r}": repr(str(classmate)),
    }
    paths = []
    for name, (before, after) in ATTACKS.items():
        for key, value in fill.items():
            before = before.replace(key, value)
        paths.append(
            _write(
                submissions / name / "01_block_manager.ipynb",
                nbformat.writes(_with_attack(before, after)).encode(),
            )
        )
    for name, nb in _malformed_notebooks().items():
        paths.append(
            _write(submissions / name / "01_block_manager.ipynb", nbformat.writes(nb).encode())
        )
    for name, content in MALFORMED.items():
        paths.append(_write(submissions / name / "01_block_manager.ipynb", content))
    # the course's own complete copy of the reference scheduler
    if hasattr(broken, "_ConfigurableScheduler"):
        nb = nbformat.read(ROOT / STUDENT_DIR / "03_scheduler.ipynb", as_version=4)
        cell = next(c for c in nb.cells if cell_role(c) == "solution")
        cell.source += (
            "\n\nfrom grader.exercises.broken import _ConfigurableScheduler as Scheduler\n"
        )
        paths.append(
            _write(
                submissions / "course_copy" / "03_scheduler.ipynb",
                nbformat.writes(nb).encode(),
            )
        )
    honest = (ROOT / SOLUTIONS_DIR / "01_block_manager.ipynb").read_bytes()
    paths.append(_write(classmate, honest))
    status = refimpl_main(
        ["grade", "--quiet", "--timeout", "60", "--csv", str(csv_path), *map(str, paths)]
    )
    written = csv_path.read_text()
    time.sleep(1.0)  # an orphan that survived would rewrite the grade file now
    rows = {Path(r["notebook"]).parent.name: r for r in csv.DictReader(csv_path.open())}
    return {
        "status": status,
        "rows": rows,
        "written": written,
        "csv": csv_path,
        "outside": outside,
        "classmate": classmate,
        "honest": honest,
        "paths": paths,
    }


def _write(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


EXPECTED_REASONS = {  # words each row's reason must hold
    "forged_result_and_exit": "its code ended the process running it while its cells ran (exit code 0)",
    "profile_off_and_delegate": "uses the reference (refimpl.paged.block_manager.BlockManager.__init__)",
    "memory_hog": "cell 4 raised MemoryError",
    "orphan_rewrites_grades": "left 2 processes running after grading (killed)",
    "garbage_frame": "sent something that is not an answer (a frame of 4294967295 bytes",
    "answer_not_an_object": "sent something that is not an answer (an answer that is a JSON list",
    "another_exercise": "its metadata names exercise 04_packed_layout, but the file is named 01_block_manager.ipynb",
    "metadata_is_a_string": "refimpl_course metadata is a str",
    "exercise_is_a_list": "refimpl_course.exercise is a list",
    "source_not_text": "cell 2 is not a cell with text",
    "not_json": "cannot read it as a notebook",
    "empty_object": "cannot read it as a notebook",
    "binary": "cannot read it as a notebook",
    "cells_not_a_list": "cannot read it as a notebook",
    "course_copy": "uses the reference (grader.exercises.broken._ConfigurableScheduler.schedule)",
}
if ABI:
    EXPECTED_REASONS.update(
        {
            "run_the_solution": "cell 4 raised PermissionError",
            "reload_the_reference": "cell 4 raised PermissionError",
            # the fresh Python could not read it either
            "reference_via_fresh_python": "cell 4 raised CalledProcessError",
        }
    )
if ABI >= 6:
    EXPECTED_REASONS["kill_the_grader"] = "cell 4 raised PermissionError"


def test_a_class_of_attacks_scores_nothing_and_the_honest_student_everything(tmp_path, capsys):
    """One grading run over the whole folder (one test, so parallel workers never grade it
    twice)."""
    graded = _grade_the_class(tmp_path)
    rows = graded["rows"]
    # every notebook has its row
    assert len(rows) == len(graded["paths"]) and graded["status"] == 1
    assert (
        rows["zz_honest"]["passed"],
        rows["zz_honest"]["checks"],
        rows["zz_honest"]["reason"],
    ) == ("10", "10", "")

    problems = []
    for name, row in sorted(rows.items()):
        if name == "zz_honest" or (name in NEEDS_READ_LIMITS and ABI == 0):
            # reading the solutions or the reference's source is refused only where Landlock is
            # available
            continue
        # named like its exercise: all its checks count
        checks = "11" if name == "course_copy" else "10"
        if (row["passed"], row["checks"]) != ("0", checks):
            problems.append(f"{name} scored {row['passed']}/{row['checks']}")
        if name in EXPECTED_REASONS and EXPECTED_REASONS[name] not in row["reason"]:
            problems.append(
                f"{name}: reason {row['reason']!r} lacks {EXPECTED_REASONS[name]!r}"
            )
        if not row["reason"] and name not in (
            "writes_outside",
            "forged_answers",
            "patched_runner",
        ):
            # the three named fail check by check, with nothing wholesale to say
            problems.append(f"{name}: no reason")
    assert problems == [], "\n".join(problems)
    total = sum(int(r["checks"]) for r in rows.values())
    assert total == 10 * len(rows) + ("course_copy" in rows)  # exercise 3 has 11 checks
    assert (
        f"== total: 10/{total} checks passed over {len(rows)} notebooks"
        in capsys.readouterr().out
    )

    # Nothing outlived the grader or changed its files.
    assert _sleepers() == []
    assert graded["csv"].read_text() == graded["written"]  # nobody rewrote it after the run
    assert "orphan,01_block_manager,10,10" not in graded["written"]
    assert graded["classmate"].read_bytes() == graded["honest"]
    if ABI:
        assert not graded["outside"].exists()  # refused, not just noticed


def test_without_the_sandbox_writes_to_other_files_still_void_the_score(tmp_path):
    """--no-sandbox (or no Landlock): the writes happen, are noticed, the classmate is graded
    on what they handed in, and a link put in place of the grade file is replaced, not
    followed."""
    csv_path, victim = tmp_path / "grades.csv", tmp_path / "victim.txt"
    victim.write_text("precious")
    classmate = tmp_path / "b_honest" / "01_block_manager.ipynb"
    honest = (ROOT / SOLUTIONS_DIR / "01_block_manager.ipynb").read_bytes()
    before = (
        f"import os\nopen({str(classmate)!r}, 'a').write('x')\n"
        f"os.remove({str(csv_path)!r})\nos.symlink({str(victim)!r}, {str(csv_path)!r})\n"
    )
    attacker = _write(
        tmp_path / "a_attacker" / "01_block_manager.ipynb",
        nbformat.writes(_with_attack(before, "")).encode(),
    )
    _write(classmate, honest)
    assert (
        refimpl_main(
            [
                "grade",
                "--quiet",
                "--no-sandbox",
                "--csv",
                str(csv_path),
                str(attacker),
                str(classmate),
            ]
        )
        == 1
    )
    rows = {Path(r["notebook"]).parent.name: r for r in csv.DictReader(csv_path.open())}
    assert rows["a_attacker"]["passed"] == "0"
    assert re.search(
        r"changed files it must not touch \(.*b_honest/01_block_manager.ipynb, .*grades.csv\)",
        rows["a_attacker"]["reason"],
    )
    # graded on the bytes read before
    assert (rows["b_honest"]["passed"], rows["b_honest"]["checks"]) == ("10", "10")
    assert not csv_path.is_symlink() and victim.read_text() == "precious"
    assert [r[0] for r in csv.reader(csv_path.open())] == [
        "notebook",
        str(attacker),
        str(classmate),
    ]


def test_a_crash_inside_a_method_fails_only_the_rows_that_reach_it(tmp_path):
    """os._exit inside deallocate: each scenario that frees ends its process (exit code shown),
    the next starts a fresh one."""
    nb = nbformat.read(ROOT / SOLUTIONS_DIR / "01_block_manager.ipynb", as_version=4)
    cell = next(
        c for c in nb.cells if cell_role(c) == "solution" and "def deallocate(" in c.source
    )
    cell.source = cell.source.replace(
        '        """Drop the sequence\'s references, last block first."""\n',
        '        """Drop the sequence\'s references, last block first."""\n        import os\n        os._exit(7)\n',
    )
    path = _write(tmp_path / "01_block_manager.ipynb", nbformat.writes(nb).encode())
    grade = grade_notebook(path, timeout=60)
    passed = {check for _, check, ok in grade.rows if ok}
    assert passed == {"allocate_from_head", "append_at_block_boundary"}, grade.tables
    assert grade.num_checks == 10
    assert grade.reason == "its code ended the process running it (exit code 7)"
    assert "found    it ended (exit code 7)" in grade.tables[0]


# --- nothing to find: the child's refimpl holds no answer, no copy of one, no source of one
def _source_search(marker: str) -> str:
    """Cell code that looks for the reference's source inside the child (every linecache
    entry, then inspect.getsource of the module) and runs it into `ns`."""
    return f"""
import inspect, linecache, sys
found = None
for entry in list(linecache.cache.values()):
    if len(entry) == 4 and {marker!r} in "".join(entry[2]):
        found = "".join(entry[2])
if found is None:
    module = sys.modules.get("refimpl.paged.block_manager") or __import__(
        "refimpl.paged.block_manager", fromlist=["x"])
    found = inspect.getsource(module)
ns = {{"__name__": "refimpl.paged.block_manager"}}
exec(found, ns)
"""


def _replace_solutions(exercise: str, code: str, base: Path = STUDENT_DIR):
    nb = nbformat.read(ROOT / base / f"{exercise}.ipynb", as_version=4)
    cells = [c for c in nb.cells if cell_role(c) == "solution"]
    cells[0].source = code
    for cell in cells[1:]:
        cell.source = "pass\n"
    return nb


EX1_FROM_NS = """
class BlockManager(ns["BlockManager"]):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size, enable_prefix_caching=False)
"""
# a correct Part II answer built from the course's broken variants, reached through the frozen
# dataclasses that catalogue them, plus the type checks they lack
VARIANTS_EX4 = """
from grader.exercises import broken as _b
_impl = {v.name: v.implementation for v in _b.BROKEN_VARIANTS}
_gcd, _groups = _impl["gcd_accepts_non_ints"], _impl["groups_mla_first"]
_layout = _impl["layout_group_order"]

def approximate_gcd(values, lower_bound=None):
    values = list(values)
    if any(isinstance(x, bool) or not isinstance(x, int) for x in values) or (
        lower_bound is not None
        and (isinstance(lower_bound, bool) or not isinstance(lower_bound, int) or lower_bound < 1)
    ):
        raise ValueError("approximate_gcd needs positive ints")
    return _gcd(values, lower_bound)

def get_packed_kv_cache_groups(specs):
    return _groups(specs)

def get_kv_cache_config(groups, available_memory, num_blocks_override=None):
    return _layout(groups, available_memory, num_blocks_override)
"""
# the reference's Part II functions, called where the child's refimpl should have none
REFERENCE_EX4 = """
from refimpl.hybrid.kv_cache_planning import approximate_gcd as _gcd
from refimpl.hybrid.kv_cache_planning import get_kv_cache_config as _config
from refimpl.hybrid.kv_cache_planning import get_packed_kv_cache_groups as _groups

def approximate_gcd(values, lower_bound=None):
    return _gcd(values, lower_bound)

def get_packed_kv_cache_groups(specs):
    return _groups(specs)

def get_kv_cache_config(groups, available_memory, num_blocks_override=None):
    return _config(groups, available_memory, num_blocks_override)
"""

# exercise 6 from the Triton twin of the reference, run by Triton's interpreter
TRITON_TWIN_EX6 = """
import os
os.environ["TRITON_INTERPRET"] = "1"
import refimpl.kernels.deepseek_v4 as _k

def compute_swa_indices_and_lens(*args, **kwargs):
    return _k.compute_swa_indices_and_lens(*args, **kwargs)
"""
# the same twin, run from its source file
TRITON_SOURCE_EX6 = """
import os, pathlib, refimpl
os.environ["TRITON_INTERPRET"] = "1"
_path = pathlib.Path(refimpl.__file__).parent / "kernels" / "deepseek_v4.py"
_ns = {"__name__": "twin"}
exec(compile(_path.read_text(), str(_path), "exec"), _ns)
compute_swa_indices_and_lens = _ns["compute_swa_indices_and_lens"]
"""
# exercise 4's block stride from planner B's packed layout: only the loop is written
PLANNER_B_EX4 = """
from refimpl.hybrid.older_planners import get_packed_kv_cache_layout as _layout
from refimpl.hybrid.kv_cache_interface import KVCacheConfig, KVCacheTensor

def get_kv_cache_config(groups, available_memory, num_blocks_override=None):
    groups = list(groups)
    stride, _ = _layout(groups)
    n = available_memory // stride if num_blocks_override is None else num_blocks_override
    if n < 1:
        raise ValueError("less than one block")
    tensors = []
    for group in groups:
        runs, offset = {}, 0
        for name in group.layer_names:
            runs.setdefault(group.layer_spec(name), []).append(name)
        for spec, names in runs.items():
            tensors.append(KVCacheTensor(stride * n, tuple(names), offset, stride,
                                         spec.page_size_bytes))
            offset += len(names) * spec.page_size_bytes
    return KVCacheConfig(n, tensors, groups)
"""
# the course layer's prefix walk, loaded from its file past the import block
# the grader's own full copy of the reference block manager (the broken variants' base)
COPIES_EX1 = """
from grader.exercises.reference_copies import BlockManagerCopy

class BlockManager(BlockManagerCopy):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size, enable_prefix_caching=False)
"""
# the same copy run from its file
COPIES_FILE_EX1 = (
    """
import pathlib, refimpl
_path = pathlib.Path(refimpl.__file__).parents[1] / "grader" / "exercises" / "reference_copies.py"
ns = {"__name__": "copies"}
exec(compile(_path.read_text(), "copies", "exec"), ns)
ns["BlockManager"] = ns["BlockManagerCopy"]
"""
    + EX1_FROM_NS
)
COURSE_FILE_EX2 = """
import importlib.util, pathlib, sys, refimpl
from refimpl.paged import BlockManager as _Base, Sequence as _Seq
_spec = importlib.util.spec_from_file_location(
    "pm_copy", pathlib.Path(refimpl.__file__).parent / "course" / "prefix_match.py")
_pm = importlib.util.module_from_spec(_spec)
sys.modules["pm_copy"] = _pm
_spec.loader.exec_module(_pm)
_pm.explain_prefix_match(_Base(4, 4, enable_prefix_caching=False), _Seq([1, 2, 3], block_size=4))
raise RuntimeError("the course layer's prefix walk ran")
"""


def _honest_scheduler_with_repr():
    """The scheduler solution, plus a line that uses a dataclass's own repr (every dataclass
    shares that code, the broken variants' catalogue included)."""
    nb = nbformat.read(ROOT / SOLUTIONS_DIR / "03_scheduler.ipynb", as_version=4)
    cell = next(
        c
        for c in nb.cells
        if cell_role(c) == "solution" and "def __init__(self, config" in c.source
    )
    line = "        self.max_num_seqs = config.max_num_seqs\n"
    assert line in cell.source
    cell.source = cell.source.replace(line, "        self.label = repr(config)\n" + line, 1)
    return nb


NOTHING_TO_FIND = {
    # name -> (exercise, notebook, words of the reason)
    "linecache_ex1": (
        "01_block_manager",
        lambda: _replace_solutions(
            "01_block_manager", _source_search("def can_allocate") + EX1_FROM_NS
        ),
        "cell 4 raised",
    ),
    "linecache_ex2": (
        "02_prefix_cache",
        lambda: _replace_solutions(
            "02_prefix_cache",
            _source_search("def _prefix_hits")
            + "PrefixCachingBlockManager = ns['BlockManager']",
        ),
        "cell 4 raised",
    ),
    "broken_variants_ex4": (
        "04_packed_layout",
        lambda: _replace_solutions("04_packed_layout", VARIANTS_EX4),
        "grader.exercises.broken is not available while an exercise is graded",
    ),
    "reference_ex4": (
        "04_packed_layout",
        lambda: _replace_solutions("04_packed_layout", REFERENCE_EX4),
        "uses the reference (refimpl.hybrid.kv_cache_planning.approximate_gcd)",
    ),
    "triton_twin_ex6": (
        "06_slot_addressing",
        lambda: _replace_solutions("06_slot_addressing", TRITON_TWIN_EX6),
        "uses the reference (refimpl.kernels.deepseek_v4.compute_swa_indices_and_lens)",
    ),
    "planner_b_ex4": (
        "04_packed_layout",
        lambda: _replace_solutions("04_packed_layout", PLANNER_B_EX4),
        "uses the reference (refimpl.hybrid.older_planners.get_packed_kv_cache_layout)",
    ),
    "reference_copies_ex3": (
        "03_scheduler",
        lambda: _replace_solutions(
            "03_scheduler",
            "from grader.exercises.reference_copies import SchedulerCopy as Scheduler\n",
        ),
        "grader.exercises.reference_copies is not available while an exercise is graded",
    ),
    "reference_copies_ex1": (
        "01_block_manager",
        lambda: _replace_solutions("01_block_manager", COPIES_EX1),
        "grader.exercises.reference_copies is not available while an exercise is graded",
    ),
}
if ABI:  # the files are unreadable only where Landlock is available
    NOTHING_TO_FIND["triton_source_ex6"] = (
        "06_slot_addressing",
        lambda: _replace_solutions("06_slot_addressing", TRITON_SOURCE_EX6),
        "cell 4 raised PermissionError",
    )
    NOTHING_TO_FIND["copies_file_ex1"] = (
        "01_block_manager",
        lambda: _replace_solutions("01_block_manager", COPIES_FILE_EX1),
        "cell 4 raised PermissionError",
    )
    NOTHING_TO_FIND["course_file_ex2"] = (
        "02_prefix_cache",
        lambda: _replace_solutions("02_prefix_cache", COURSE_FILE_EX2),
        "cell 4 raised PermissionError",
    )


def test_the_child_holds_no_answer_to_find(tmp_path):
    """In-process linecache and getsource, the broken variants held by their catalogue, the
    reference's Part II functions, the Triton twin of exercise 6 (imported or run from its
    file), planner B's packed layout, the course layer loaded from its file: each scores 0. A
    correct scheduler that uses a dataclass's repr keeps every check."""
    paths = []
    for name, (exercise, make, _) in NOTHING_TO_FIND.items():
        paths.append(
            _write(tmp_path / name / f"{exercise}.ipynb", nbformat.writes(make()).encode())
        )
    honest = _write(
        tmp_path / "honest_repr" / "03_scheduler.ipynb",
        nbformat.writes(_honest_scheduler_with_repr()).encode(),
    )
    csv_path = tmp_path / "grades.csv"
    status = refimpl_main(
        ["grade", "--quiet", "--csv", str(csv_path), *map(str, [*paths, honest])]
    )
    rows = {Path(r["notebook"]).parent.name: r for r in csv.DictReader(csv_path.open())}
    assert status == 1
    assert (rows["honest_repr"]["passed"], rows["honest_repr"]["checks"]) == ("11", "11")
    problems = [
        f"{name} scored {rows[name]['passed']}/{rows[name]['checks']}: {rows[name]['reason']}"
        for name in NOTHING_TO_FIND
        if rows[name]["passed"] != "0" or NOTHING_TO_FIND[name][2] not in rows[name]["reason"]
    ]
    assert problems == []


# --- the reference read from its installed file, by every route a student might try
SITE_PACKAGES_READ = """
import marshal, os, sys, refimpl
def _load(rel):
    # refimpl/<rel> run from its file: the package's folder, its resolved path, the lib64
    # link of a venv, every folder on sys.path (a site-packages copy), their compiled caches
    base = os.path.dirname(refimpl.__file__)
    folders = [base, os.path.realpath(base)]
    folders += [f.replace("/lib/", "/lib64/") for f in list(folders)]
    folders += [os.path.join(p, "refimpl") for p in sys.path if p]
    stem = os.path.splitext(os.path.basename(rel))[0]
    tag = sys.implementation.cache_tag
    tried = set()
    for folder in folders:
        path = os.path.join(folder, rel)
        cache = os.path.join(os.path.dirname(path), "__pycache__", f"{stem}.{tag}.pyc")
        for candidate in (path, cache):
            try:
                with open(candidate, "rb") as handle:
                    data = handle.read()
            except OSError as exc:
                tried.add(type(exc).__name__)
                continue
            code = marshal.loads(data[16:]) if candidate == cache else compile(data, path, "exec")
            ns = {"__name__": "refimpl." + rel[:-3].replace("/", ".")}
            exec(code, ns)
            return ns
    raise PermissionError(f"{rel}: " + ", ".join(sorted(tried)))
"""
# name -> (exercise, the solution cells' code after SITE_PACKAGES_READ)
SITE_PACKAGES = {
    "site_packages_ex1": (
        "01_block_manager",
        'ns = _load("paged/block_manager.py")\n' + EX1_FROM_NS,
    ),
    "site_packages_ex2": (
        "02_prefix_cache",
        'PrefixCachingBlockManager = _load("paged/block_manager.py")["BlockManager"]\n',
    ),
    "site_packages_ex3": (
        "03_scheduler",
        '_ns = _load("paged/scheduler.py")\n'
        "import refimpl.paged.scheduler as _module\n"
        '_ns["SchedulerConfig"] = _module.SchedulerConfig  # the class the grader passes\n'
        'Scheduler = _ns["Scheduler"]\n',
    ),
    "site_packages_ex4": (
        "04_packed_layout",
        '_ns = _load("hybrid/kv_cache_planning.py")\n'
        'approximate_gcd = _ns["approximate_gcd"]\n'
        'get_packed_kv_cache_groups = lambda specs: _ns["get_packed_kv_cache_groups"](specs, "BLHNC")\n'
        "def get_kv_cache_config(groups, available_memory, num_blocks_override=None):\n"
        '    return _ns["get_kv_cache_config"](groups, available_memory, num_blocks_override,'
        ' kv_cache_layout="BLHNC")\n',
    ),
    "site_packages_ex5": (
        "05_hybrid_allocator",
        'SlidingWindowManager = _load("hybrid/single_type_kv_cache_manager.py")'
        '["SlidingWindowManager"]\n'
        'HybridKVCacheCoordinator = _load("hybrid/kv_cache_coordinator.py")'
        '["HybridKVCacheCoordinator"]\n',
    ),
    "site_packages_ex6": (
        "06_slot_addressing",
        'compute_swa_indices_and_lens = _load("kernels/reference_v4.py")'
        '["compute_swa_indices_and_lens"]\n',
    ),
}
# name -> (exercise, imports put before the solution): every public package imports
HONEST_IMPORTS = {
    "imports_ex1": (
        "01_block_manager",
        "import refimpl.engine, refimpl.hybrid, refimpl.kernels, refimpl.models, refimpl.viz",
    ),
    "imports_ex2": ("02_prefix_cache", "import refimpl.kernels"),
    "imports_ex3": ("03_scheduler", "from refimpl.engine import LLM"),
    "imports_ex4": ("04_packed_layout", "import refimpl.models, refimpl.viz"),
    "imports_ex5": ("05_hybrid_allocator", "import refimpl.kernels, refimpl.models"),
    "imports_ex6": ("06_slot_addressing", "import refimpl.engine, refimpl.hybrid"),
}


def _site_packages_attack(exercise: str, code: str) -> nbformat.NotebookNode:
    return _replace_solutions(exercise, SITE_PACKAGES_READ + code)


def _honest_with_imports(exercise: str, imports: str) -> nbformat.NotebookNode:
    nb = nbformat.read(ROOT / SOLUTIONS_DIR / f"{exercise}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if cell_role(c) == "solution")
    cell.source = imports + "\n" + cell.source
    return nb


def _write_read_and_import_class(folder: Path) -> dict[str, Path]:
    """The site-packages attacks and the honest solutions that import public packages,
    written into `folder`: {name: path}."""
    paths = {}
    for name, (exercise, code) in SITE_PACKAGES.items():
        nb = _site_packages_attack(exercise, code)
        paths[name] = _write(folder / name / f"{exercise}.ipynb", nbformat.writes(nb).encode())
    for name, (exercise, imports) in HONEST_IMPORTS.items():
        nb = _honest_with_imports(exercise, imports)
        paths[name] = _write(folder / name / f"{exercise}.ipynb", nbformat.writes(nb).encode())
    return paths


def _problems(rows: dict[str, dict], attacks: list[str], honest: list[str]) -> list[str]:
    """What went wrong: an attack that scored, an honest solution that lost a check."""
    problems = [
        f"{name} scored {rows[name]['passed']}/{rows[name]['checks']}: {rows[name]['reason']}"
        for name in attacks
        if rows[name]["passed"] != "0" or rows[name]["checks"] == "0"
    ]
    problems += [
        f"{name} (honest) scored {rows[name]['passed']}/{rows[name]['checks']}: "
        f"{rows[name]['reason']}"
        for name in honest
        if rows[name]["passed"] != rows[name]["checks"] or rows[name]["checks"] == "0"
    ]
    return problems


@pytest.mark.skipif(ABI == 0, reason="the files are unreadable only where Landlock is")
def test_the_installed_reference_is_unreadable_and_every_public_package_imports(tmp_path):
    """From this checkout: the answer module of each exercise, run from its file by any route
    (site-packages, lib64, a cache), scores 0; a solution that imports refimpl.engine,
    .hybrid, .kernels, .models or .viz keeps every check."""
    paths = _write_read_and_import_class(tmp_path)
    csv_path = tmp_path / "grades.csv"
    refimpl_main(["grade", "--quiet", "--csv", str(csv_path), *map(str, paths.values())])
    rows = {Path(r["notebook"]).parent.name: r for r in csv.DictReader(csv_path.open())}
    assert _problems(rows, list(SITE_PACKAGES), list(HONEST_IMPORTS)) == []
    for name in SITE_PACKAGES:
        assert "raised PermissionError" in rows[name]["reason"], rows[name]["reason"]


# --- CI grades as instructors do: a student bundle installed into a fresh venv, a plain user
def _site_packages_of_this_python() -> list[str]:
    """The folders this interpreter imports its installed packages from (torch, nbformat):
    a fresh venv sees them through a .pth file instead of installing them again."""
    return [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]


def _clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH (it names the checkout)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _as_user(ids: tuple[int, int] | None) -> dict:
    """subprocess arguments that run a command as the user `ids` (uid, gid); {}: as this one."""
    return {} if ids is None else {"user": ids[0], "group": ids[1], "extra_groups": []}


def _runs(
    python: str, ids: tuple[int, int] | None, env: dict | None = None, code="pass"
) -> bool:
    """Whether the user `ids` can run `code` with `python`."""
    import subprocess

    try:
        done = subprocess.run(
            [python, "-c", code],
            cwd="/",
            env=env or _clean_env(),
            capture_output=True,
            timeout=120,
            **_as_user(ids),
        )
    except OSError:
        return False
    return done.returncode == 0


def _base_python(ids: tuple[int, int] | None) -> str | None:
    """An interpreter of this Python version that the user `ids` can run: this venv's own, or
    one of the system's (this one may sit in a folder only its owner can enter, as pyenv's
    under /root)."""
    import shutil

    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [getattr(sys, "_base_executable", sys.executable)]
    candidates += [shutil.which(version, path=p) for p in ("/usr/local/bin", "/usr/bin")]
    for candidate in filter(None, candidates):
        if ids is None or _runs(candidate, ids):
            return candidate
    return None


class _Venvs:
    """Fresh venvs made by `python -m venv` (lib64 link included) in folders any user can read,
    seeing this interpreter's packages through a .pth file; the student bundle of this
    checkout installed (not editable) where asked."""

    def __init__(self) -> None:
        import tempfile

        self.folder = Path(tempfile.mkdtemp(prefix="refimpl-venvs-"))
        self.folder.chmod(0o755)
        self.made: dict[tuple[str, bool], Path] = {}

    def python(self, base: str, with_bundle: bool) -> Path:
        import subprocess

        key = (base, with_bundle)
        if key in self.made:
            return self.made[key]
        venv = self.folder / f"venv{len(self.made)}"
        subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = venv / "bin" / "python"
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        Path(purelib, "project-dependencies.pth").write_text(
            "\n".join(_site_packages_of_this_python()) + "\n"
        )
        if with_bundle:
            pip = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
            pip += ["--no-build-isolation", "--ignore-installed", "--ignore-requires-python"]
            subprocess.run(
                [*pip, str(self._bundle())],
                cwd=self.folder,
                env=_clean_env(),
                check=True,
                capture_output=True,
            )
        self.made[key] = python
        return python

    def _bundle(self) -> Path:
        import subprocess

        from grader import bundle

        out = self.folder / "bundle"
        if not out.exists():
            # a checkout with local changes is bundled as it is (the intake's dirty check)
            source = Path(bundle.__file__).read_text()
            dirty = ["--allow-dirty"] if "--allow-dirty" in source else []
            subprocess.run(
                [sys.executable, "-m", "grader.bundle", str(out), *dirty],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
        return out


@pytest.fixture(scope="module")
def venvs():
    import shutil

    made = _Venvs()
    try:
        yield made
    finally:
        shutil.rmtree(made.folder, ignore_errors=True)


def _unprivileged_ids() -> tuple[int, int] | None:
    """(uid, gid) of `nobody`, to grade as when this process runs as root (None if none)."""
    import pwd

    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


@pytest.mark.parametrize(
    ("setup", "user"),
    [("bundle", "root"), ("bundle", "unprivileged"), ("checkout", "unprivileged")],
)
def test_a_class_graded_as_instructors_do(venvs, setup, user):
    """Every attack of this file and every honest import, graded by `python -m refimpl grade`
    from the student bundle installed in a fresh venv (as root and as a plain user) and from
    this checkout as a plain user (as root, the tests above grade it): the attacks score 0,
    the honest solutions everything."""
    import shutil
    import subprocess
    import tempfile

    if ABI == 0:
        pytest.skip("without Landlock the graded code can read the reference's files")
    root = os.geteuid() == 0
    if user == "root" and not root:
        pytest.skip("not root: the run as root cannot be checked here")
    ids = _unprivileged_ids() if user == "unprivileged" and root else None
    if user == "unprivileged" and root and ids is None:
        pytest.skip("running as root, and there is no user 'nobody' to grade as")
    base = _base_python(ids)
    if base is None:
        pytest.skip(
            f"user {user} can run no python{sys.version_info[0]}.{sys.version_info[1]}"
        )
    env = _clean_env()
    python = venvs.python(base, with_bundle=setup == "bundle")
    if setup == "checkout":
        env["PYTHONPATH"] = str(ROOT)
        if not _runs(str(python), ids, env, "import refimpl, torch"):
            pytest.skip(f"user {user} cannot read this checkout ({ROOT})")
    folder = Path(tempfile.mkdtemp(prefix="refimpl-class-"))
    try:
        submissions, grades = folder / "submissions", folder / "grades"
        grades.mkdir()
        csv_path = grades / "grades.csv"
        paths = _write_read_and_import_class(submissions)
        fill = {
            "{csv!r}": repr(str(csv_path)),
            "{outside!r}": repr(str(folder / "outside.txt")),
            "{classmate!r}": repr(str(paths["imports_ex1"])),
        }
        for name, (before, after) in ATTACKS.items():
            for key, value in fill.items():
                before = before.replace(key, value)
            nb = nbformat.writes(_with_attack(before, after)).encode()
            paths[name] = _write(submissions / name / "01_block_manager.ipynb", nb)
        for name, (exercise, make, _) in NOTHING_TO_FIND.items():
            nb = nbformat.writes(make()).encode()
            paths[name] = _write(submissions / name / f"{exercise}.ipynb", nb)
        if ids is not None:
            for path in [folder, *folder.rglob("*")]:
                os.chown(path, *ids)
        else:
            env["GRADER_ALLOW_ROOT"] = "1"
        done = subprocess.run(
            [str(python), "-m", "refimpl", "grade", "--quiet", "--timeout", "60"]
            + ["--csv", str(csv_path), *map(str, paths.values())],
            cwd=folder,
            env={**env, "HOME": str(folder)},
            capture_output=True,
            text=True,
            timeout=900,
            **_as_user(ids),
        )
        assert done.returncode == 1, done.stderr[-2000:]
        rows = {Path(r["notebook"]).parent.name: r for r in csv.DictReader(csv_path.open())}
        attacks = [*SITE_PACKAGES, *ATTACKS, *NOTHING_TO_FIND]
        assert _problems(rows, attacks, list(HONEST_IMPORTS)) == []
        for name in SITE_PACKAGES:
            assert "raised PermissionError" in rows[name]["reason"], rows[name]["reason"]
        assert not (folder / "outside.txt").exists()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_childs_refimpl_lacks_the_answers_and_their_helpers():
    """What the child imports for exercise 2: the asked methods raise, the reference's matching
    walk is gone, what the exercise builds on is the reference's."""
    from grader.exercises.answer_free import ReferenceUsed, answer_free_sources

    source = answer_free_sources(["check_prefix_cache"])["refimpl.paged.block_manager"]
    namespace: dict = {"__reference_used__": ReferenceUsed}
    exec(compile(source, "<test>", "exec"), namespace)
    manager = namespace["BlockManager"]
    for name in ("_prefix_hits", "_match_prefix", "_cached_block_ids", "_block_hashes"):
        assert not hasattr(manager, name), name
    with pytest.raises(ReferenceUsed, match="BlockManager.can_allocate"):
        manager(4, 4).can_allocate(None)
    assert "def deallocate(self, seq" in source and "self._check_holder(seq)" in source


def test_links_and_other_files_are_refused_and_never_quoted(tmp_path, capsys):
    """A link to a classmate's notebook (or to their folder, or a hard link) gets no marks, a
    link to any other file shows none of its text, a notebook named twice is graded once, a
    device is refused, and a malformed notebook that claims an exercise still counts every
    check of it."""
    subs = tmp_path / "subs"
    solution = (ROOT / SOLUTIONS_DIR / "01_block_manager.ipynb").read_bytes()
    honest = _write(subs / "a" / "01_block_manager.ipynb", solution)
    copycat = subs / "b" / "01_block_manager.ipynb"
    copycat.parent.mkdir()
    copycat.symlink_to(honest)
    secret = _write(tmp_path / "secret.txt", b"SECRET-FIRST-LINE of a file\n")
    snoop = subs / "c" / "01_block_manager.ipynb"
    snoop.parent.mkdir()
    snoop.symlink_to(secret)
    malformed = _student_copy()
    malformed.cells[1]["source"] = 42  # one malformed cell; the metadata names exercise 1
    renamed = _write(subs / "d" / "alice.ipynb", nbformat.writes(malformed).encode())
    (subs / "e").symlink_to(subs / "a")  # a folder that is a classmate's
    folder_link = subs / "e" / "01_block_manager.ipynb"
    victim = _write(subs / "f" / "01_block_manager.ipynb", solution)
    hard_link = subs / "g" / "01_block_manager.ipynb"
    hard_link.parent.mkdir()
    os.link(victim, hard_link)
    csv_path = tmp_path / "grades.csv"
    device = Path("/dev/null")
    paths = [honest, copycat, snoop, renamed, device, folder_link, hard_link, honest]
    assert refimpl_main(["grade", "--quiet", "--csv", str(csv_path), *map(str, paths)]) == 1
    out = capsys.readouterr().out
    rows = list(csv.DictReader(csv_path.open()))
    assert [row["notebook"] for row in rows] == list(map(str, paths))
    names = ("honest", "copycat", "snoop", "renamed", "device", "folder", "hard", "twice")
    got = {name: (r["exercise"], r["passed"], r["checks"]) for name, r in zip(names, rows)}
    assert got == {
        "honest": ("01_block_manager", "10", "10"),
        "copycat": ("01_block_manager", "0", "10"),
        "snoop": ("01_block_manager", "0", "10"),
        "renamed": ("01_block_manager", "0", "10"),
        "device": ("?", "0", "0"),
        "folder": ("01_block_manager", "0", "10"),
        "hard": ("01_block_manager", "0", "10"),
        "twice": ("01_block_manager", "0", "10"),
    }
    reasons = dict(zip(names, (r["reason"] for r in rows)))
    assert "symbolic link" in reasons["copycat"]
    assert "cell 2 is not a cell with text" in reasons["renamed"]
    assert "not a regular file" in reasons["device"]
    assert f"its path goes through a symbolic link ({subs / 'e'})" in reasons["folder"]
    assert "it has 2 names (hard links)" in reasons["hard"]
    assert reasons["twice"] == f"it is the same file as {honest}"
    assert "SECRET" not in csv_path.read_text() and "SECRET" not in out


@pytest.mark.parametrize(
    "content",
    [b"SECRET-FIRST-LINE\n", "SECRET \u00e9".encode("latin-1"), b'{"cells": "SECRET"}'],
)
def test_an_unreadable_notebook_is_described_without_its_content(tmp_path, content):
    path = _write(tmp_path / "01_block_manager.ipynb", content)
    grade = grade_notebook(path, timeout=60)
    assert (grade.num_passed, grade.num_checks) == (0, 10)
    assert "cannot read it as a notebook" in grade.why and "SECRET" not in grade.why


# --- limits: what one notebook's code may do to the machine and to the grader
PARENT_PROC = """
import os
seen = []
for name in ("environ", "cmdline", "status"):
    try:
        with open(f"/proc/{os.getppid()}/{name}", "rb") as handle:
            data = handle.read()
        seen.append(f"{name}:read:{b'GRADER_SECRET_VALUE' in data}")
    except OSError as exc:
        seen.append(f"{name}:{type(exc).__name__}")
raise RuntimeError("|".join(seen))
"""
FORK_COUNT = """
import os, time
children = 0
for _ in range(300):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    children += 1
raise RuntimeError(f"forked {children} children")
"""
BYTES_WRITTEN = """
import os
block, written, files = b"x" * 2**20, 0, 0
try:
    while written < 512 * 2**20:
        with open(f"junk{files}.bin", "wb") as handle:
            for _ in range(32):
                handle.write(block)
                written += len(block)
        files += 1
except OSError as exc:
    raise RuntimeError(f"wrote {written} bytes, then {type(exc).__name__}")
raise RuntimeError(f"wrote {written} bytes")
"""
SOCKETS = """
import socket
seen = []
for name, kind in (("udp", socket.SOCK_DGRAM), ("tcp", socket.SOCK_STREAM), ("raw", socket.SOCK_RAW)):
    try:
        socket.socket(socket.AF_INET, kind).close()
        seen.append(f"{name}:open")
    except OSError as exc:
        seen.append(f"{name}:{type(exc).__name__}")
raise RuntimeError("|".join(seen))
"""


def _grade_cell(tmp_path: Path, code: str, **settings) -> str:
    """The reason a notebook whose first solution cell is `code` gets (exercise 1)."""
    from grader.grading import GradingSettings

    path = _write(
        tmp_path / "01_block_manager.ipynb", nbformat.writes(_with_attack(code, "")).encode()
    )
    grade = grade_notebook(path, timeout=60, settings=GradingSettings(**settings))
    assert grade.num_passed == 0
    return grade.why


@pytest.mark.skipif(ABI == 0, reason="needs Landlock to keep /proc/<parent> out of reach")
def test_the_child_reads_neither_the_graders_environment_nor_its_command_line(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("GRADER_SECRET", "GRADER_SECRET_VALUE")
    why = _grade_cell(tmp_path, PARENT_PROC)
    assert re.search(r"environ:\w+Error\|cmdline:\w+Error\|status:\w+Error", why), why


def test_a_fork_bomb_gets_a_few_processes(tmp_path):
    from grader.sandbox.limits import Limits
    from grader.sandbox.processes import process_cap_available

    if not process_cap_available():
        pytest.skip("no pids cgroup and RLIMIT_NPROC does not bind this user (root)")
    why = _grade_cell(tmp_path, FORK_COUNT)
    forked = int(re.search(r"forked (\d+) children", why).group(1))
    assert 0 < forked < Limits().processes, why


def test_bytes_written_are_capped(tmp_path):
    from grader.sandbox.limits import Limits

    why = _grade_cell(tmp_path, BYTES_WRITTEN, limits=Limits(write_bytes=64 * 2**20))
    assert "wrote more than 64 MiB" in why, why


def test_udp_raw_and_tcp_sockets_are_refused(tmp_path):
    from grader.sandbox.limits import seccomp_available

    if not seccomp_available():
        pytest.skip("no seccomp on this system")
    why = _grade_cell(tmp_path, SOCKETS)
    assert re.search(r"udp:\w+Error\|tcp:\w+Error\|raw:\w+Error", why), why


def test_grading_as_root_is_refused_unless_asked_for(monkeypatch, capsys):
    from grader.grading import failed_grade

    graded = []

    def fake_grade(path, **kwargs):
        graded.append(path)
        return failed_grade(path, None, "not graded here")

    monkeypatch.delenv("GRADER_ALLOW_ROOT")
    monkeypatch.setattr("grader.grading.grade_notebook", fake_grade)
    student = str(ROOT / STUDENT_DIR / "01_block_manager.ipynb")
    monkeypatch.setattr("grader.cli.os.geteuid", lambda: 0)
    assert refimpl_main(["grade", student]) == 2
    assert "refusing to grade as root" in capsys.readouterr().err and graded == []
    refimpl_main(["grade", "--quiet", "--allow-root", student])
    monkeypatch.setattr("grader.cli.os.geteuid", lambda: 1000)
    refimpl_main(["grade", "--quiet", student])
    assert len(graded) == 2


STDERR_SWAP = """
import os
os.write(2, b"the last line its code wrote\\n")
for name in ("stderr.txt", "../stderr.txt"):
    try:
        os.remove(name)
    except OSError:
        pass
    try:
        os.symlink({secret!r}, name)
    except OSError:
        pass
os._exit(3)
"""


def test_the_grader_shows_only_what_the_child_wrote_to_its_stderr(tmp_path):
    """A cell that swaps its stderr file for a link to a file it may not read, then exits: the
    reason shows the last line it wrote itself, never a line of that file."""
    secret = _write(tmp_path / "instructor" / "secret.txt", b"SECRET-LAST-LINE\n")
    why = _grade_cell(
        tmp_path / "student", STDERR_SWAP.replace("{secret!r}", repr(str(secret)))
    )
    assert "SECRET" not in why, why
    assert "(exit code 3: the last line its code wrote)" in why, why


HELD_AFTER_DELETION = """
import ctypes, mmap, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
if {fork} and os.fork() != 0:
    os.wait()
    raise RuntimeError("its forked process ended")
held = []
for i in range(16):
    name = f"hidden{{i}}.bin"
    fd = os.open(name, os.O_RDWR | os.O_CREAT)
    os.write(fd, b"x" * 8 * 2**20)
    os.unlink(name)
    if {mapped}:  # mapped, without a descriptor (Python's mmap would keep one)
        held.append(libc.mmap(None, 8 * 2**20, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0))
        os.close(fd)
    else:
        held.append(fd)
time.sleep(3)
if {fork}:
    os._exit(0)
raise RuntimeError(f"held {{len(held)}} deleted files of 8 MiB")
"""


@pytest.mark.parametrize(
    "how", ["open", "mapped", "open in a forked process, without a cgroup"]
)
def test_bytes_in_deleted_files_kept_open_count_too(tmp_path, monkeypatch, how):
    """16 files of 8 MiB, each deleted but kept open (or mapped): 128 MiB held, none of it in
    the folder. The cap counts them, found through the pids cgroup or a walk of /proc."""
    from grader.sandbox import processes, remote
    from grader.sandbox.limits import Limits

    if "without a cgroup" in how:

        class NoCgroup(processes.PidsCgroup):
            def __init__(self, limit: int) -> None:
                self.path = None

        monkeypatch.setattr(remote, "PidsCgroup", NoCgroup)
    code = HELD_AFTER_DELETION.format(fork="fork" in how, mapped=how == "mapped")
    why = _grade_cell(tmp_path, code, limits=Limits(write_bytes=64 * 2**20))
    assert (
        "wrote more than 64 MiB, counting the files it deleted but kept open (stopped)" in why
    ), why
