"""Argument checks shared by every part of refimpl, so bad input gets the same clear ValueError."""

from __future__ import annotations

from numbers import Integral


def check_positive_int(name: str, value: object) -> int:
    """Return `value` as an int if it is a positive integer, else raise a ValueError naming it.

    True and 2.0 are rejected (a bool or a float there is almost always a mistake); numpy
    integers are accepted because counts often come out of numpy arrays.
    """
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)
