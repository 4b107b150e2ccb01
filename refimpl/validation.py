"""Argument checks shared by every part of refimpl, so bad input gets the same clear
ValueError."""

from __future__ import annotations

from numbers import Integral


def is_integer(value: object) -> bool:
    """True for ints and numpy integers; False for bools and floats.

    True and 2.0 are rejected (a bool or a float where a count belongs is almost always a
    mistake); numpy integers are accepted because counts often come out of numpy arrays.
    """
    if type(value) is int:  # the common case, without the slower abstract-class check
        return True
    return not isinstance(value, bool) and isinstance(value, Integral)


def check_int_at_least(name: str, value: object, minimum: int, meaning: str = "") -> int:
    """Return `value` as an int if it is an integer >= `minimum`, else raise a ValueError
    naming it; `meaning` (e.g. " (a token index)") is added to the message."""
    if not is_integer(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}{meaning}, got {value!r}")
    return int(value)


def check_positive_int(name: str, value: object) -> int:
    """Return `value` as an int if it is a positive integer, else raise a ValueError naming
    it."""
    if not is_integer(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_bool(name: str, value: object) -> bool:
    """Return `value` if it is a bool, else raise a TypeError naming it ("no" is not False)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_instance(name: str, value: object, expected: type) -> None:
    """Raise a TypeError naming the argument unless `value` is an `expected` (or a
    subclass)."""
    if not isinstance(value, expected):
        raise TypeError(
            f"{name} must be a {expected.__name__}, got {type(value).__name__} {value!r:.80}"
        )
