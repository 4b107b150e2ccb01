"""What a grader asks of a world: one `Call` (a method name and plain arguments), the
`WorldSpec` a world is built from, and the `StateFields` a world reports after each step.

Plain picklable data: the same objects are applied to the reference here and sent to the
student's world in another process (`grader.remote`). `grader.paged_worlds.build_world`
turns a spec into a world.
"""

from __future__ import annotations

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
