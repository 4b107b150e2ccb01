"""The refimpl a grading child imports: the code an exercise asks for is not in it.

A grading child runs a student's cells next to refimpl, because the exercises build on it (the
scheduler exercise uses the reference BlockManager, the prefix-cache exercise subclasses it).
Traps put over the reference's code after it was loaded leave it to be found (in a closure, a
frozen dataclass, `linecache`, the source file). So the child never loads it at all:

- the grader (the parent) writes each *answer module* of every exercise again
  (`answer_free_sources`): every function or method the graded exercise asks for, and every one
  a later exercise asks for, becomes a stub that raises `ReferenceUsed`, and every other
  function or method that only those used is left out (it did their work: the prefix walk, the
  padding sum). The rest of the module is kept as it is, so what the exercise builds on (the
  earlier exercises' answers: the scheduler's BlockManager) still works, and every public
  module imports (`import refimpl.kernels` in exercise 1). The answer modules are those
  `ANSWERS` names and every other module of refimpl that defines an answer under the same name
  (`same_named`: the Triton kernel beside its torch twin), found in the source;
- the child installs `AnswerFreeFinder` before it imports anything of refimpl. It serves the
  answer modules from those sources (compiled under a name that is no file; the answer-free
  text sits in `linecache` only while its module runs, for Triton's jit) and refuses to import
  the course's copies of the reference (`grader.exercises.broken` and the `reference_copies`
  it edits) and the course layer's props
  (`refimpl.course`: the prefix walk and other chapter props that show the answers;
  `refimpl.viz` imports, its drawings that use those props do not).

The child never reads the reference's source itself; on Linux with Landlock it cannot either:
the answer modules' files and the blocked packages' folders are unreadable there
(`grader.exercises.reference_code.reference_sources`, `grader.sandbox.limits`).
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import linecache
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

# modules (and everything beneath them) the grading child may not import: the broken variants
# and the grader's own copies of the reference they are built on, and the course layer
BLOCKED = (
    "grader.exercises.broken",
    "grader.exercises.reference_copies",
    "grader.exercises.reference_copies_v4",
    "refimpl.course",
)


@dataclass(frozen=True)
class Answer:
    """What one exercise asks for in one module: functions of the module (`owner` None), or
    methods of its class `owner` (`names` None: the whole class)."""

    module: str
    owner: str | None
    names: tuple[str, ...] | None


# check name -> what its exercise asks students to write. The names are those the exercise's
# notebook asks for; helpers of the reference that only these use are left out as well.
ANSWERS: dict[str, tuple[Answer, ...]] = {
    "check_block_manager": (Answer("refimpl.paged.block_manager", "BlockManager", None),),
    "check_prefix_cache": (
        Answer(
            "refimpl.paged.block_manager",
            "BlockManager",
            # `_allocate_block` is private in nano-vllm too; the exercise asks for it by name
            ("_allocate_block", "can_allocate", "allocate", "hash_blocks"),
        ),
    ),
    "check_scheduler": (Answer("refimpl.paged.scheduler", "Scheduler", None),),
    "check_approximate_gcd": (
        Answer("refimpl.hybrid.kv_cache_planning", None, ("approximate_gcd", "padding_curve")),
    ),
    "check_packed_groups": (
        Answer("refimpl.hybrid.kv_cache_planning", None, ("get_packed_kv_cache_groups",)),
    ),
    "check_packed_layout": (
        Answer(
            "refimpl.hybrid.kv_cache_planning",
            None,
            ("get_kv_cache_config", "get_kv_cache_bytes_per_block"),
        ),
        # planner B's packed layout computes the same block stride under another name (with
        # it, only the loop over spec runs is left to write); planner B's own entry points
        # call it, so they raise in this child too
        Answer("refimpl.hybrid.older_planners", None, ("get_packed_kv_cache_layout",)),
    ),
    "check_swa_indices": (
        Answer("refimpl.kernels.reference_v4", None, ("compute_swa_indices_and_lens",)),
    ),
}
# exercise 5, the hybrid allocator: the window's frees and the coordinator's fixed point
ANSWERS["check_window_frees"] = (
    Answer(
        "refimpl.hybrid.single_type_kv_cache_manager",
        "SlidingWindowManager",
        ("get_num_skipped_tokens",),
    ),
    Answer(
        "refimpl.hybrid.single_type_kv_cache_manager",
        "SingleTypeKVCacheManager",
        # `_skipped_blocks` is remove_skipped_blocks's walk over the table, which the public
        # num_freeable_skipped_blocks shares (so it is no helper "only the answer uses"):
        # calling it would hand over the answer's loop
        ("remove_skipped_blocks", "_skipped_blocks"),
    ),
    # the Mamba manager's align-mode retirement nulls and frees table slots the same way
    Answer(
        "refimpl.hybrid.single_type_kv_cache_manager",
        "MambaManager",
        ("remove_skipped_blocks",),
    ),
)
ANSWERS["check_fixed_point_hit"] = (
    Answer(
        "refimpl.hybrid.kv_cache_coordinator",
        "HybridKVCacheCoordinator",
        ("find_longest_cache_hit",),
    ),
)

_RAISE = "__reference_used__"


class ReferenceUsed(BaseException):
    """Raised by a stub: the student's code ran the reference's version of what it should
    write.

    A BaseException, so a student's `except Exception:` does not hide it by accident (catching
    it on purpose gains nothing: the reference's code is not there).
    """

    def __init__(self, qualified_name: str) -> None:
        super().__init__(qualified_name)
        self.qualified_name = qualified_name


def answers_for(checks: list[str]) -> dict[str, list[Answer]]:
    """module name -> what the graded checks ask for in it: `ANSWERS`, and every other module
    of refimpl that defines the same thing under the same name (`same_named`)."""
    unknown = sorted(set(checks) - set(ANSWERS))
    if unknown:
        raise ValueError(f"check_name must be one of {sorted(ANSWERS)}, got {unknown}")
    modules: dict[str, list[Answer]] = {}
    for check in checks:
        for answer in (*ANSWERS[check], *same_named(check)):
            modules.setdefault(answer.module, []).append(answer)
    return modules


@functools.cache
def same_named(check: str) -> tuple[Answer, ...]:
    """The answers of `check` that refimpl defines again elsewhere under the same name: a
    function of the same name (the Triton kernel beside its torch twin), a class of the same
    name, with the asked methods it defines (the whole class when the whole class is asked).

    Derived from the source, so a module added later is covered without being named here.
    """
    found = []
    for answer in ANSWERS[check]:
        for module in refimpl_modules():
            if module == answer.module:
                continue
            defs = _defs(_tree(module).body)
            if answer.owner is None:
                names = tuple(n for n in answer.names or () if _is_function(defs.get(n)))
                if names:
                    found.append(Answer(module, None, names))
                continue
            owner = defs.get(answer.owner)
            if not isinstance(owner, ast.ClassDef):
                continue
            methods = {n for n, node in _defs(owner.body).items() if _is_function(node)}
            if answer.names is None:
                found.append(Answer(module, answer.owner, None))
            elif methods & set(answer.names):
                names = tuple(n for n in answer.names if n in methods)
                found.append(Answer(module, answer.owner, names))
    return tuple(found)


def refimpl_modules() -> list[str]:
    """Every module of refimpl the grading child may import (the blocked ones left out)."""
    return sorted(_module_files())


@functools.cache
def _module_files() -> dict[str, Path]:
    import refimpl

    root = Path(refimpl.__file__).resolve().parent
    files = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("refimpl", *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        if "__pycache__" not in parts and not _blocked(name):
            files[name] = path
    return files


def _blocked(fullname: str) -> bool:
    return any(fullname == b or fullname.startswith(b + ".") for b in BLOCKED)


@functools.cache
def _tree(module: str) -> ast.Module:
    return ast.parse(_source(module))


@functools.cache
def _imported_elsewhere(module: str) -> frozenset[str]:
    """Names other modules the child may import take from `module` with `from module import`
    (a private helper of an answer that one of them imports must stay, or that one breaks)."""
    import grader

    names = set()
    grader_root = Path(grader.__file__).resolve().parent
    trees = [_tree(m) for m in refimpl_modules() if m != module]
    trees += [
        ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(grader_root.glob("*.py"))
        if not _blocked(f"grader.{path.stem}")
    ]
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == module:
                names.update(alias.name for alias in node.names)
    return frozenset(names)


def answer_free_sources(checks: list[str]) -> dict[str, str]:
    """module name -> the source the grading child of the exercise graded by `checks` imports
    for it (run in the grader): every answer module of every exercise, without the answers of
    `stripped_checks`."""
    return dict(_sources(tuple(sorted(set(checks)))))


def stripped_checks(checks: list[str]) -> list[str]:
    """The checks whose answers the grading child lacks: `checks`, and every check of a later
    exercise. An exercise builds on the earlier ones (the scheduler on the block manager), so
    their answers stay."""
    from grader.exercises.catalogue import EXERCISES

    unknown = sorted(set(checks) - set(ANSWERS))
    if unknown:
        raise ValueError(f"check_name must be one of {sorted(ANSWERS)}, got {unknown}")
    order = [[check for check, _ in exercise.checks] for exercise in EXERCISES.values()]
    last = max(i for i, group in enumerate(order) if set(group) & set(checks))
    return sorted({*checks, *(c for group in order[last + 1 :] for c in group)})


@functools.cache
def _sources(checks: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    stripped = answers_for(stripped_checks(list(checks)))
    return tuple(
        (module, without_answers(_source(module), module, stripped.get(module, [])))
        for module in answers_for(list(ANSWERS))
    )


def removed_names(check: str) -> list[tuple[str, str | None, tuple[str, ...]]]:
    """(module, owner (None: the module), names) of every function the child's refimpl lacks
    for `check`: the answers (stubs there) and the helpers only they used (absent there)."""
    rows = []
    for module, answers in answers_for([check]).items():
        removed: dict = {}
        without_answers(_source(module), module, answers, removed)
        rows.extend((module, owner, tuple(sorted(names))) for owner, names in removed.items())
    return rows


def _source(module: str) -> str:
    path = _module_files().get(module)
    if path is None:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise ValueError(f"cannot find the source of {module}")
        path = Path(spec.origin)
    return path.read_text(encoding="utf-8")


def without_answers(
    source: str, module: str, answers: list[Answer], removed: dict | None = None
) -> str:
    """`source` with each answer turned into a stub and the helpers only answers used left
    out; `removed`, when given, gets owner name (None: the module) -> the names taken out.

    Module-level helpers that another module imports are kept (`_imported_elsewhere`).
    """
    tree = ast.parse(source)
    removed = {} if removed is None else removed
    functions = [a for a in answers if a.owner is None]
    if functions:
        names = {n for a in functions for n in a.names or ()}
        keep = set(_imported_elsewhere(module)) if module in _module_files() else set()
        tree.body = _strip(tree.body, names, module, removed.setdefault(None, set()), keep)
    for answer in answers:
        if answer.owner is None:
            continue
        owner = _defs(tree.body).get(answer.owner)
        if not isinstance(owner, ast.ClassDef):
            raise ValueError(f"{module} defines no class {answer.owner}")
        methods = {n for n, node in _defs(owner.body).items() if _is_function(node)}
        asked = methods if answer.names is None else set(answer.names)
        taken = removed.setdefault(owner.name, set())
        owner.body = _strip(owner.body, asked, f"{module}.{owner.name}", taken) or [ast.Pass()]
    return ast.unparse(ast.fix_missing_locations(tree))


# statements whose blocks hold definitions of the same level (`if HAS_TRITON:` around kernels)
_COMPOUND = (ast.If, ast.Try, ast.TryStar)


def _blocks(node: ast.stmt) -> list[str]:
    """The fields of a compound statement that hold statements of the enclosing level."""
    if isinstance(node, ast.If):
        return ["body", "orelse"]
    return ["body", "orelse", "finalbody"]


def _defs(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """name -> the function or class a body defines, those inside if/try blocks included."""
    defs: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defs[node.name] = node
        elif isinstance(node, _COMPOUND):
            for field in _blocks(node):
                defs.update(_defs(getattr(node, field)))
            for handler in getattr(node, "handlers", ()):
                defs.update(_defs(handler.body))
    return defs


def _is_function(node: ast.stmt | None) -> bool:
    return isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)


def _others(body: list[ast.stmt]) -> list[ast.AST]:
    """What a body holds besides its functions: statements, and the tests of if/try blocks."""
    out: list[ast.AST] = []
    for node in body:
        if _is_function(node):
            continue
        if isinstance(node, _COMPOUND):
            out.extend([node.test] if isinstance(node, ast.If) else [])
            for field in _blocks(node):
                out.extend(_others(getattr(node, field)))
            for handler in getattr(node, "handlers", ()):
                out.extend([handler.type] if handler.type is not None else [])
                out.extend(_others(handler.body))
        else:
            out.append(node)
    return out


def _strip(
    body: list[ast.stmt],
    asked: set[str],
    prefix: str,
    removed: set[str],
    keep: set[str] = frozenset(),
) -> list[ast.stmt]:
    """`body` with the functions named in `asked` as stubs, and the functions that only
    those (or other left-out functions) mention left out (their names added to `removed`),
    except those in `keep`. Functions inside if/try blocks count as the body's own."""
    defs = {name: node for name, node in _defs(body).items() if _is_function(node)}
    missing = asked - set(defs)
    if missing:
        raise ValueError(f"{prefix} defines no {sorted(missing)}")
    # what the kept code mentions, found from the kept statements outwards
    needed: set[str] = set()
    frontier = _others(body)
    frontier += [
        defs[name]
        for name in defs
        if name not in asked and (_is_public_or_dunder(name) or name in keep)
    ]
    seen: set[int] = set()
    while frontier:
        node = frontier.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for name in _mentioned(node):
            if name in defs and name not in asked and name not in needed:
                needed.add(name)
                frontier.append(defs[name])
    return _rewrite(body, asked, prefix, removed, needed | keep)


def _rewrite(
    body: list[ast.stmt], asked: set[str], prefix: str, removed: set[str], kept: set[str]
) -> list[ast.stmt]:
    stripped: list[ast.stmt] = []
    for node in body:
        if isinstance(node, _COMPOUND):
            node = copy.copy(node)
            for field in _blocks(node):
                block = getattr(node, field)
                new = _rewrite(block, asked, prefix, removed, kept)
                setattr(node, field, new or ([ast.Pass()] if field == "body" else []))
            if hasattr(node, "handlers"):
                node.handlers = [copy.copy(h) for h in node.handlers]
                for handler in node.handlers:
                    handler.body = _rewrite(handler.body, asked, prefix, removed, kept) or [
                        ast.Pass()
                    ]
            stripped.append(node)
            continue
        name = getattr(node, "name", None)
        if not _is_function(node):
            stripped.append(node)
        elif name in asked:
            stripped.append(_stub(node, f"{prefix}.{name}"))
            removed.add(name)
        elif not (_is_public_or_dunder(name) or name in kept):
            removed.add(name)  # a helper only the answers used
        else:
            stripped.append(node)
    return stripped


def _is_public_or_dunder(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _mentioned(node: ast.AST) -> set[str]:
    """Names and attribute names a statement mentions (self.x and x alike)."""
    names = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            names.add(child.id)
        elif isinstance(child, ast.Attribute):
            names.add(child.attr)
    return names


def _stub(node: ast.FunctionDef | ast.AsyncFunctionDef, qualified_name: str) -> ast.stmt:
    """A function with the same name and decorators whose every call raises ReferenceUsed."""
    call = ast.Call(ast.Name(_RAISE, ast.Load()), [ast.Constant(qualified_name)], [])
    return ast.FunctionDef(
        name=node.name,
        args=ast.arguments(
            posonlyargs=[],
            args=[],
            vararg=ast.arg("args"),
            kwonlyargs=[],
            kw_defaults=[],
            kwarg=ast.arg("kwargs"),
            defaults=[],
        ),
        body=[ast.Raise(call, None)],
        decorator_list=node.decorator_list,
        returns=None,
        type_params=[],
    )


class _BlockedLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        raise ImportError(f"{spec.name} is not available while an exercise is graded")

    def exec_module(self, module: ModuleType) -> None:  # pragma: no cover - never reached
        raise ImportError(module.__name__)


class _SourceLoader(importlib.abc.Loader):
    def __init__(self, source: str) -> None:
        self.source = source

    def exec_module(self, module: ModuleType) -> None:
        filename = f"<{module.__name__}, answers removed>"
        code = compile(self.source, filename, "exec")
        module.__dict__[_RAISE] = ReferenceUsed
        # Triton's jit reads a kernel's source when the kernel is defined: the answer-free
        # text is in `linecache` while the module runs, and only then
        lines = self.source.splitlines(keepends=True)
        linecache.cache[filename] = (len(self.source), None, lines, filename)
        try:
            exec(code, module.__dict__)
        finally:
            linecache.cache.pop(filename, None)


class AnswerFreeFinder(importlib.abc.MetaPathFinder):
    """Serves the answer modules without their answers and refuses the blocked modules."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.sources = dict(sources)

    def find_spec(self, fullname, _path=None, _target=None):  # called positionally
        if _blocked(fullname):
            return importlib.machinery.ModuleSpec(fullname, _BlockedLoader())
        source = self.sources.pop(fullname, None)
        if source is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _SourceLoader(source), origin=None)


def install(sources: dict[str, str]) -> AnswerFreeFinder:
    """Put the finder first on `sys.meta_path` (before any answer module is imported)."""
    loaded = sorted(m for m in sources if m in sys.modules)
    if loaded:
        raise RuntimeError(f"answer modules already imported: {loaded}")
    finder = AnswerFreeFinder(sources)
    sys.meta_path.insert(0, finder)
    return finder
