"""What a grader hands back: one row per check, the first divergence, a printable table and a
score."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Divergence:
    """The first step where the student's state differs from the reference's.

    `where` names the value that differs (a return value, `free_block_ids`,
    `blocks[3].ref_count`, ...); `expected` and `found` are short deterministic renderings of
    the two sides.
    """

    step: int
    action: str
    where: str
    expected: str
    found: str

    @property
    def key(self) -> tuple[str, str, str]:
        """What differs, without where it happened: equal keys are the same mistake seen
        again."""
        return (self.where, self.expected, self.found)

    def lines(self) -> list[str]:
        return [
            f"first difference at step {self.step}: {self.action}",
            f"{self.where}:",
            f"  expected {self.expected}",
            f"  found    {self.found}",
        ]


@dataclass(frozen=True)
class CheckResult:
    """One row of the table: a named scenario or workload, replayed in lockstep."""

    name: str
    description: str
    passed: bool
    steps: int
    divergence: Divergence | None = None

    def row(self, name_width: int) -> list[str]:
        status = "PASS" if self.passed else "FAIL"
        steps = f"{self.steps} step" if self.steps == 1 else f"{self.steps} steps"
        head = f"  {status}  {self.name:<{name_width}}  {self.description} ({steps})"
        if self.divergence is None:
            return [head]
        pad = " " * (8 + name_width)
        return [head] + [pad + line for line in self.divergence.lines()]


@dataclass
class GradeReport:
    """All rows of one grader run; `passed` only when every row passed."""

    title: str
    results: list[CheckResult] = field(default_factory=list)
    # a grader of one function: every row calls it, so naming the call shared says nothing
    one_function: bool = False

    @property
    def num_passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def num_checks(self) -> int:
        return len(self.results)

    @property
    def passed(self) -> bool:
        return self.num_checks > 0 and self.num_passed == self.num_checks

    @property
    def failed_checks(self) -> list[str]:
        return [r.name for r in self.results if not r.passed]

    def common_calls(self) -> str | None:
        """One line naming the calls where several failing rows first go wrong, in different
        ways (a hint at one cause behind many rows), or None when no call is shared so."""
        failing = [r.divergence for r in self.results if r.divergence is not None]
        calls = Counter(_call_name(d.action) for d in failing)
        # rows with one and the same difference are already shown once (`table`)
        keys: dict[str, set] = {}
        for d in failing:
            keys.setdefault(_call_name(d.action), set()).add(d.key)
        shared = [(n, call) for call, n in calls.most_common() if len(keys[call]) > 1]
        if not shared or self.one_function:
            return None
        failing = sum(calls.values())
        first, *others = shared
        more = "".join(f", {n} in {call}" for n, call in others)
        rows = "all" if first[0] == failing else f"{first[0]} of"
        return (
            f"  {rows} {failing} failing rows first go wrong in a call to {first[1]}{more}: "
            "one mistake there may explain them all"
        )

    def table(self) -> str:
        """The header line, the calls several failing rows share (`common_calls`), and one row
        per check. A first difference that several rows share (one wrong return type fails
        them all) is shown once, with the number of rows it fails; the other rows point back
        to it."""
        width = max((len(r.name) for r in self.results), default=0)
        lines = [f"{self.title}: {self.num_passed}/{self.num_checks} checks passed"]
        common = self.common_calls()
        if common is not None:
            lines.append(common)
        counts = Counter(r.divergence.key for r in self.results if r.divergence is not None)
        first_row: dict[tuple[str, str, str], str] = {}
        for result in self.results:
            key = result.divergence.key if result.divergence is not None else None
            if key is None or counts[key] == 1:
                lines.extend(result.row(width))
            elif key in first_row:
                lines.append(f"{result.row(width)[0]}: same difference as {first_row[key]}")
            else:
                first_row[key] = result.name
                lines.extend(result.row(width))
                lines.append(
                    " " * (8 + width) + f"(the same difference fails {counts[key]} rows)"
                )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _call_name(action: str) -> str:
    """The method or function a step called: `allocate_slots` in `allocate_slots(A, 16 new
    tokens)` or in `group 1: allocate_slots(...)`; the whole action when it calls nothing."""
    match = re.match(r"(?:[^(]*: )?([A-Za-z_][\w.]*)\(", action)
    return match.group(1) if match else action


def seeded_checks(
    name: str, description: str, make: Callable[[int], Any], seeds: Iterable[int]
) -> list[tuple[str, str, Any]]:
    """One row per seed of a randomised check: `name_<seed>`, the description with the seed,
    and what `make(seed)` returns (a check to run or its cases). Seeded, so a failure can be
    replayed exactly."""
    return [(f"{name}_{seed}", f"{description} (seed {seed})", make(seed)) for seed in seeds]
