"""The grader never reads the core's source: a reworded core still grades the same.

The broken variants used to recompile the core's own methods after matching exact lines of
their source, so rewording one line broke the grader's import. Here a copy of the repository
has the core methods those variants edited reworded (same behaviour, different text); the
grader, run against that copy, imports, passes the reworded reference and fails every variant
that edits one of those methods.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (core file, class, method): the core methods the broken variants edited through their source
REWORDED = [
    ("refimpl/paged/block_manager.py", "BlockManager", "_allocate_block"),
    ("refimpl/paged/block_manager.py", "BlockManager", "_prefix_hits"),
    ("refimpl/paged/block_manager.py", "BlockManager", "_match_prefix"),
    ("refimpl/paged/block_manager.py", "BlockManager", "_block_hashes"),
    (
        "refimpl/hybrid/single_type_kv_cache_manager.py",
        "SingleTypeKVCacheManager",
        "_skipped_blocks",
    ),
]


def _reword(source: str, cls: str, method: str) -> str:
    """`source` with each simple statement of `cls.method` written differently: the
    expression of an assignment, `return` or `if` in parentheses, one per line."""
    tree = ast.parse(source)
    (node,) = [
        f
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == cls
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == method
    ]
    lines = source.splitlines()
    changed = 0
    for stmt in ast.walk(node):
        if not isinstance(stmt, ast.stmt) or stmt is node or stmt.lineno != stmt.end_lineno:
            continue  # only one-line statements, rewritten in place
        i = stmt.lineno - 1
        line = lines[i]
        indent = line[: len(line) - len(line.lstrip())]
        if isinstance(stmt, ast.Assign | ast.AugAssign | ast.AnnAssign) and stmt.value:
            head = line[: stmt.value.col_offset]
            expr = ast.get_source_segment(source, stmt.value)
            lines[i] = f"{head}({expr})"
        elif isinstance(stmt, ast.Return) and stmt.value is not None:
            lines[i] = f"{indent}return ({ast.get_source_segment(source, stmt.value)})"
        else:
            continue
        changed += 1
    for stmt in ast.walk(node):
        if isinstance(stmt, ast.If) and stmt.test.lineno == stmt.test.end_lineno:
            i = stmt.lineno - 1
            test = ast.get_source_segment(source, stmt.test)
            if lines[i].lstrip().startswith(f"if {test}:"):
                lines[i] = lines[i].replace(f"if {test}:", f"if ({test}):", 1)
                changed += 1
    assert changed, f"{cls}.{method}: nothing reworded"
    return "\n".join(lines) + "\n"


_CHILD = textwrap.dedent(
    """
    import inspect, json
    import grader as course
    from grader.exercises import broken
    from refimpl.hybrid.single_type_kv_cache_manager import SingleTypeKVCacheManager
    from refimpl.paged import BlockManager

    reworded = [inspect.getsource(BlockManager._allocate_block),
                inspect.getsource(SingleTypeKVCacheManager._skipped_blocks)]
    edited = {"_allocate_block", "_prefix_hits", "_match_prefix", "_block_hashes",
              "_skipped_blocks"}
    rows = {}
    for variant in broken.BROKEN_VARIANTS:
        if not edited & set(vars(variant.implementation)):
            continue
        for grader in variant.graders:
            report = getattr(course, grader)(
                variant.implementation, verbose=False, allow_reference=True)
            rows[f"{variant.name}/{grader}"] = report.passed
    reference = {
        g: getattr(course, g)(cls, verbose=False, allow_reference=True).passed
        for g, cls in [("check_block_manager", BlockManager),
                       ("check_prefix_cache", BlockManager)]
    }
    print(json.dumps({"reworded": reworded, "variants": rows, "reference": reference}))
    """
)


def test_a_reworded_core_still_imports_and_catches_every_variant(tmp_path):
    for package in ("refimpl", "grader"):
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    for path, cls, method in REWORDED:
        file = tmp_path / path
        file.write_text(_reword(file.read_text(), cls, method))
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = __import__("json").loads(done.stdout.splitlines()[-1])
    assert "return (" in result["reworded"][0] and "(" in result["reworded"][1]
    assert all(result["reference"].values()), result["reference"]
    # the 13 variants that edited those core methods, each on every grader it must fail
    assert len(result["variants"]) >= 13, sorted(result["variants"])
    assert not any(result["variants"].values()), result["variants"]
