"""The grading child's refimpl holds no answer under an answer's name, anywhere.

For each exercise, a fresh Python installs the answer-free finder exactly as a grading child
does, imports every module of refimpl it finds on disk (not the list `grader.exercises.answer_free`
derives: the test must not trust what it checks), and looks at everything they define. A
function named like an answer (or a private one named after it, such as a Triton kernel behind
its wrapper) must be a stub that raises `ReferenceUsed`; so must every method of a class named
like a class the exercise asks for whole, and the asked methods of a class named like one it
asks methods of (a later exercise's answers are stubs too). The blocked packages must refuse
to import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grader.exercises.answer_free import ANSWERS, BLOCKED, answer_free_sources
from grader.exercises.catalogue import EXERCISES

pytestmark = pytest.mark.slow  # imports all of refimpl in a fresh Python per exercise

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import importlib, inspect, json, sys, types
from pathlib import Path

spec = json.load(open("spec.json"))
from grader.exercises import answer_free
answer_free.install(spec["sources"])
from grader.exercises.answer_free import ReferenceUsed

functions, whole, methods = set(spec["functions"]), set(spec["whole"]), spec["methods"]
problems, refused = [], []


def is_stub(function):
    try:
        function(*[None] * function.__code__.co_argcount)
    except ReferenceUsed:
        return True
    except BaseException:
        return False
    return False


def plain(member):
    member = getattr(member, "fget", None) or getattr(member, "__func__", member)
    member = getattr(member, "fn", member)  # a Triton kernel holds its Python function
    return member if isinstance(member, types.FunctionType) else None


def written_in_refimpl(function):
    filename = function.__code__.co_filename
    return filename.endswith(", answers removed>") or filename.startswith(spec["root"])


def named_like_answer(name):
    return any(name == f or name.startswith("_" + f) for f in functions)


root = Path(spec["root"])
for path in sorted(root.rglob("*.py")):
    parts = ("refimpl", *path.relative_to(root).with_suffix("").parts)
    if "__pycache__" in parts or parts[-1] == "__main__":
        continue
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        # blocked, or built on a blocked module (a drawing of refimpl.viz on a course prop)
        blocked = any(name == b or name.startswith(b + ".") for b in spec["blocked"])
        if blocked or "is not available while an exercise is graded" in str(exc):
            refused.append(name)
            continue
        raise
    for attr, value in list(vars(module).items()):
        function = plain(value)
        if function is not None and named_like_answer(function.__name__):
            if not is_stub(function):
                problems.append(f"{name}.{attr}")
        if isinstance(value, type) and value.__name__ in whole | set(methods):
            asked = None if value.__name__ in whole else set(methods[value.__name__])
            for member_name, member in vars(value).items():
                function = plain(member)
                # code written in refimpl (not a dataclass's generated methods)
                if function is None or not written_in_refimpl(function):
                    continue
                if asked is None or member_name in asked:
                    if not is_stub(function):
                        problems.append(f"{name}.{value.__name__}.{member_name}")
print(json.dumps({"problems": sorted(set(problems)), "refused": sorted(set(refused))}))
"""


def _asked(checks: list[str]) -> dict:
    """What the exercise asks for, by name: functions, classes asked whole, class -> methods
    asked (from `ANSWERS` and the names the notebook defines)."""
    functions, whole, methods = set(), set(), {}
    for check in checks:
        for answer in ANSWERS[check]:
            if answer.owner is None:
                functions.update(answer.names)
            elif answer.names is None:
                whole.add(answer.owner)
            else:
                methods.setdefault(answer.owner, set()).update(answer.names)
    return {
        "functions": sorted(functions),
        "whole": sorted(whole),
        "methods": {k: sorted(v) for k, v in methods.items()},
    }


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_no_module_of_the_childs_refimpl_defines_an_answer(exercise, tmp_path):
    import refimpl

    checks = [check for check, _ in EXERCISES[exercise].checks]
    spec = {
        **_asked(checks),
        "sources": answer_free_sources(checks),
        "blocked": list(BLOCKED),
        "root": str(Path(refimpl.__file__).resolve().parent),
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["problems"] == [], found
    # the course layer is refused; refimpl.viz imports (its drawings on course props do not)
    assert "refimpl.course" in found["refused"] and "refimpl.viz" not in found["refused"]
