"""The check behind every chapter's "Build it" section: the reader's version against the
package's, step by step.

A chapter's Compare cell calls `check_build(your_x, cases, run=..., reference=...)`:

- while the reader's function (or any method of the reader's class) is still a stub (its body
  only a docstring and `...`), it prints one line naming what to write first and returns, so a
  chapter runs clean before the reader has written anything;
- otherwise it replays every case through `run(your_x, case)` and through `reference(case)`,
  both generators of `(step label, state)` pairs, and stops at the first step whose states
  differ: it prints the expected state against the found one, down to the first differing
  index of a list with the elements around it, and raises AssertionError. On success it
  prints one short line.

Stubs are told apart by their bytecode, not their source text: a body of a docstring and `...`
compiles to the same code as an empty function, and anything the reader writes does not.
"""

from __future__ import annotations

import dis
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import CodeType
from typing import Any

Step = tuple[str, Any]  # (what just happened, the state to compare after it)

__all__ = ["check_build", "describe_difference", "first_stub", "is_stub", "same"]

AROUND = 2  # list elements shown on each side of the first difference
WIDTH = 96  # printed lines stay under the 100 columns a laptop screen shows


def _empty() -> None: ...


def _instructions(code: CodeType) -> list[tuple[str, Any]]:
    """The code's instructions with constants resolved: a docstring moves the index of the
    `None` a function returns, not what it loads."""
    return [(i.opname, i.argval) for i in dis.get_instructions(code)]


_EMPTY = _instructions(_empty.__code__)


def is_stub(function: Any) -> bool:
    """True when `function` (a function, method or property) has a body of only a docstring
    and `...` (or `pass`): the same bytecode as an empty function."""
    if isinstance(function, property):
        function = function.fget
    if isinstance(function, staticmethod | classmethod):
        function = function.__func__
    code = getattr(function, "__code__", None)
    return isinstance(code, CodeType) and _instructions(code) == _EMPTY


def first_stub(built: Any) -> str | None:
    """The qualified name of the first thing still to write in `built` (a function, a class
    whose own methods are checked in the order they are written, or a tuple of these), or
    None when nothing is a stub."""
    for part in built if isinstance(built, tuple) else (built,):
        if isinstance(part, type):
            for name, member in vars(part).items():
                if is_stub(member):
                    return f"{part.__qualname__}.{name}"
        elif is_stub(part):
            return part.__qualname__
    return None


def _names(built: Any) -> str:
    parts = built if isinstance(built, tuple) else (built,)
    return ", ".join(getattr(p, "__qualname__", repr(p)) for p in parts)


def _short(value: Any, width: int = WIDTH) -> str:
    text = f"{value:.7g}" if isinstance(value, float) else repr(value)
    return text if len(text) <= width else text[: width - 5] + " ..."


def _window(items: list, index: int, width: int = WIDTH - 16) -> str:
    """The elements around `index`, numbered, the one at `index` marked `>`: AROUND on each
    side when they fit in `width` columns, fewer (or shortened) when they do not."""
    for around, element_width in ((AROUND, 40), (1, 40), (1, 24), (0, width - 8)):
        low, high = max(0, index - around), min(len(items), index + around + 1)
        shown = [
            (">" if i == index else "") + f"[{i}] {_short(items[i], element_width)}"
            for i in range(low, high)
        ]
        if index >= len(items):
            shown.append(f">[{index}] (nothing: the list ends before it)")
        before, after = "... " if low > 0 else "", " ..." if high < len(items) else ""
        text = before + ", ".join(shown) + after
        if len(text) <= width:
            break
    return text


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def same(expected: Any, found: Any, atol: float = 0.0) -> bool:
    """Equal, except that two numbers within `atol` of each other count as equal (at any depth
    of lists, tuples and dicts): float results of a different summation order still match."""
    if atol and _number(expected) and _number(found):
        return abs(expected - found) <= atol
    if atol and isinstance(expected, Mapping) and isinstance(found, Mapping):
        return expected.keys() == found.keys() and all(
            same(expected[k], found[k], atol) for k in expected
        )
    if atol and isinstance(expected, list | tuple) and isinstance(found, list | tuple):
        return len(expected) == len(found) and all(
            same(e, f, atol) for e, f in zip(expected, found, strict=True)
        )
    return expected == found


def _container(value: Any) -> bool:
    return isinstance(value, list | tuple | Mapping)


def describe_difference(
    expected: Any, found: Any, where: str = "", atol: float = 0.0
) -> list[str]:
    """Lines that show the first place where `found` differs from `expected`: the key of a
    dict, the first differing index of a list or tuple (with the elements around it, so
    nothing that differs is elided), down to the innermost differing value. Empty when the
    two are equal (numbers within `atol` count as equal)."""
    if same(expected, found, atol):
        return []
    if isinstance(expected, Mapping) and isinstance(found, Mapping):
        for key in list(expected) + [k for k in found if k not in expected]:
            if key not in found:
                return [f"{where}[{key!r}]: expected {_short(expected[key])}, found no key"]
            if key not in expected:
                return [f"{where}[{key!r}]: not expected, found {_short(found[key])}"]
            inner = describe_difference(expected[key], found[key], f"{where}[{key!r}]", atol)
            if inner:
                return inner
    if isinstance(expected, list | tuple) and isinstance(found, list | tuple):
        expected, found = list(expected), list(found)
        index = next(
            (
                i
                for i, (e, f) in enumerate(zip(expected, found, strict=False))
                if not same(e, f, atol)
            ),
            min(len(expected), len(found)),
        )
        both = index < len(expected) and index < len(found)
        if both and _container(expected[index]) and _container(found[index]):
            return describe_difference(
                expected[index], found[index], f"{where}[{index}]", atol
            )
        return [
            f"{where or 'list'}: first difference at index {index}",
            f"  expected {_window(expected, index)}",
            f"  found    {_window(found, index)}",
        ]
    return [f"{where or 'value'}: expected {_short(expected)}, found {_short(found)}"]


def check_build(
    built: Any,
    cases: Mapping[str, Any],
    *,
    run: Callable[[Any, Any], Iterable[Step]],
    reference: Callable[[Any], Iterable[Step]],
    atol: float = 0.0,
) -> None:
    """Check the reader's `built` (a function, a class, or a tuple of them) on every case.

    `run(built, case)` and `reference(case)` yield `(step label, state)` pairs: the same
    steps, on the reader's version and on the package's. A stub prints one line and returns;
    the first differing step (or an exception the reader's version raises) prints the
    expected state against the found one and raises AssertionError. With `atol`, numbers
    within it of each other count as equal (for float results).
    """
    stub = first_stub(built)
    if stub is not None:
        print(f"{stub} is still a stub: write it, then run this cell again.")
        return
    num_steps = 0
    for label, case in cases.items():
        expected = list(reference(case))
        found: Iterator[Step] = iter(run(built, case))
        previous = "the start"
        for want in expected:
            try:
                got = next(found, None)
            except Exception as error:
                message = (
                    f"case {label!r}, {want[0]} (after {previous}): your version raised "
                    f"{type(error).__name__}: {error}"
                )
                print(message)
                raise AssertionError(message) from error
            if got is None:
                message = f"case {label!r}: your version stopped before {want[0]}"
                print(message)
                raise AssertionError(message)
            _fail_if_different(label, want, got, atol)
            previous = repr(want[0])
        extra = next(found, None)
        if extra is not None:
            message = f"case {label!r}: your version has a step past the end: {extra[0]!r}"
            print(message)
            raise AssertionError(message)
        num_steps += len(expected)
    cases_text = f"{len(cases)} case" + ("s" if len(cases) != 1 else "")
    print(f"{_names(built)} matches the package: {cases_text}, {num_steps} steps.")


def _fail_if_different(label: str, want: Step, got: Step, atol: float) -> None:
    (step, expected), (got_step, found) = want, got
    lines = []
    if got_step != step:
        lines.append(f"  step label: expected {step!r}, found {got_step!r}")
    lines += ["  " + line for line in describe_difference(expected, found, atol=atol)]
    if not lines:
        return
    header = f"case {label!r}, {step}: your version differs"
    message = "\n".join([header, *lines])
    print(message)
    raise AssertionError(f"case {label!r}, {step}: expected != found (printed above)")
