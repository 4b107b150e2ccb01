"""What a grader asks of a world: one `Call` (a method name and plain arguments), the
`WorldSpec` a world is built from, and the `StateFields` a world reports after each step.

Plain picklable data: the same objects are applied to the reference here and sent to the
student's world in another process (`grader.sandbox.remote`). `build_world` (below)
turns a spec into a world.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

StateFields = list[tuple[str, Any]]


@dataclass(frozen=True)
class Call:
    """One action on a world: its method `name` with plain (picklable) arguments."""

    name: str
    args: tuple = ()

    def __call__(self, world: Any) -> Any:
        return getattr(world, self.name)(*self.args)


@dataclass(frozen=True)
class WorldSpec:
    """How to build a world: its kind ("manager", "scheduler", "function") and plain
    arguments."""

    kind: str
    args: tuple = ()


def plain(value: Any) -> Any:
    """`value` as plain data that compares by content and crosses the wire: a dataclass (a
    `KVCacheGroupSpec`, a spec, a `KVCacheConfig`) becomes a dict with its class name and its
    fields, a tuple a list. Part II graders whose answers are such objects compare these on
    both sides (the grading child applies it to the student's answer before sending it)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {"class": type(value).__name__}
        for field in dataclasses.fields(value):
            fields[field.name] = plain(getattr(value, field.name))
        return fields
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    return value


# The world kinds and contexts a spec can name. The exercises that define them fill these in
# when imported (`grader.exercises.paged_worlds`); the lockstep engine and the grading child
# only look them up, so the engine names no exercise.
WORLD_KINDS: dict[str, Callable[..., Any]] = {}
CONTEXTS: dict[str, Callable[..., Any]] = {}


def build_world(spec: WorldSpec, implementation: Any | None) -> Any:
    """The world `spec` describes around `implementation` (a student's class or function), or
    around the reference's (None)."""
    if spec.kind not in WORLD_KINDS:
        raise ValueError(
            f"no world kind {spec.kind!r} is registered (known: {sorted(WORLD_KINDS)}); "
            "import the exercise that defines it"
        )
    return WORLD_KINDS[spec.kind](implementation, *spec.args)
