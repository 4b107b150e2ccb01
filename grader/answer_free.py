"""The refimpl a grading child imports: the code an exercise asks for is not in it.

A grading child runs a student's cells next to refimpl, because the exercises build on it (the
scheduler exercise uses the reference BlockManager, the prefix-cache exercise subclasses it).
Traps put over the reference's code after it was loaded leave it to be found (in a closure, a
frozen dataclass, `linecache`, the source file). So the child never loads it at all:

- the grader (the parent) writes, for the exercise being graded, each *answer module* again
  (`answer_free_sources`): every function or method the exercise asks for becomes a stub that
  raises `ReferenceUsed`, and every other function or method that only those used is left out
  (it did their work: the prefix walk, the padding sum). The rest of the module is kept
  as it is, so what the exercise builds on still works;
- the child installs `AnswerFreeFinder` before it imports anything of refimpl. It serves the
  answer modules from those sources (compiled under a name that is no file, with no source
  kept) and refuses to import the course's copies of the reference (`grader.broken`) and the
  course layer (`refimpl.course`, `refimpl.viz`: chapter props that show the answers).

The child never reads the reference's source itself; on Linux with Landlock it cannot either
(`grader.sandbox`).
"""

from __future__ import annotations

import ast
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

# modules (and everything beneath them) the grading child may not import
BLOCKED = ("grader.broken", "refimpl.course", "refimpl.viz")


@dataclass(frozen=True)
class Answer:
    """What one exercise asks for in one module: functions of the module (`owner` None), or
    methods of its class `owner` (`names` None: the whole class)."""

    module: str
    owner: str | None
    names: tuple[str, ...] | None
    # private helpers only the answers use that other modules import (kept, or they break)
    keep: tuple[str, ...] = ()


# check name -> what its exercise asks students to write. The names are those the exercise's
# notebook asks for; helpers of the reference that only these use are left out as well.
ANSWERS: dict[str, tuple[Answer, ...]] = {
    "check_block_manager": (Answer("refimpl.paged.block_manager", "BlockManager", None),),
    "check_prefix_cache": (
        Answer(
            "refimpl.paged.block_manager",
            "BlockManager",
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
            keep=("_check_memory", "_num_blocks"),  # older_planners imports them
        ),
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
        ("remove_skipped_blocks", "_skipped_blocks"),
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
    """module name -> what the graded checks ask for in it."""
    unknown = sorted(set(checks) - set(ANSWERS))
    if unknown:
        raise ValueError(f"check_name must be one of {sorted(ANSWERS)}, got {unknown}")
    modules: dict[str, list[Answer]] = {}
    for check in checks:
        for answer in ANSWERS[check]:
            modules.setdefault(answer.module, []).append(answer)
    return modules


def answer_free_sources(checks: list[str]) -> dict[str, str]:
    """module name -> the source the grading child imports for it (run in the grader)."""
    return dict(_sources(tuple(sorted(set(checks)))))


@functools.cache
def _sources(checks: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    return tuple(
        (module, without_answers(_source(module), module, answers))
        for module, answers in answers_for(list(checks)).items()
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
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"cannot find the source of {module}")
    return Path(spec.origin).read_text(encoding="utf-8")


def without_answers(
    source: str, module: str, answers: list[Answer], removed: dict | None = None
) -> str:
    """`source` with each answer turned into a stub and the helpers only answers used left
    out; `removed`, when given, gets owner name (None: the module) -> the names taken out."""
    tree = ast.parse(source)
    removed = {} if removed is None else removed
    functions = [a for a in answers if a.owner is None]
    if functions:
        names = {n for a in functions for n in a.names or ()}
        keep = {n for a in functions for n in a.keep}
        tree.body = _strip(tree.body, names, module, removed.setdefault(None, set()), keep)
    for answer in answers:
        if answer.owner is None:
            continue
        owner = next(
            (
                node
                for node in tree.body
                if isinstance(node, ast.ClassDef) and node.name == answer.owner
            ),
            None,
        )
        if owner is None:
            raise ValueError(f"{module} defines no class {answer.owner}")
        methods = {
            n.name for n in owner.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        asked = methods if answer.names is None else set(answer.names)
        taken = removed.setdefault(owner.name, set())
        owner.body = _strip(owner.body, asked, f"{module}.{owner.name}", taken) or [ast.Pass()]
    return ast.unparse(ast.fix_missing_locations(tree))


def _strip(
    body: list[ast.stmt],
    asked: set[str],
    prefix: str,
    removed: set[str],
    keep: set[str] = frozenset(),
) -> list[ast.stmt]:
    """`body` with the functions named in `asked` as stubs, and the functions that only
    those (or other left-out functions) mention left out (their names added to `removed`),
    except those in `keep`."""
    defs = {
        node.name: node
        for node in body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    missing = asked - set(defs)
    if missing:
        raise ValueError(f"{prefix} defines no {sorted(missing)}")
    # what the kept code mentions, found from the kept statements outwards
    kept_nodes = [node for node in body if getattr(node, "name", None) not in asked]
    needed: set[str] = set()
    frontier = [
        n for n in kept_nodes if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
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
    stripped: list[ast.stmt] = []
    for node in body:
        name = getattr(node, "name", None)
        if name in asked:
            stripped.append(_stub(node, f"{prefix}.{name}"))
            removed.add(name)
        elif name in defs and not (
            _is_public_or_dunder(name) or name in needed or name in keep
        ):
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
        code = compile(self.source, f"<{module.__name__}, answers removed>", "exec")
        module.__dict__[_RAISE] = ReferenceUsed
        exec(code, module.__dict__)


class AnswerFreeFinder(importlib.abc.MetaPathFinder):
    """Serves the answer modules without their answers and refuses the blocked modules."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.sources = dict(sources)

    def find_spec(self, fullname, path=None, target=None):
        if any(fullname == b or fullname.startswith(b + ".") for b in BLOCKED):
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
