"""Argument checks shared by every part of refimpl, so bad input gets the same clear
ValueError, and the contract every scheduler holds its callers to (`StepContract`)."""

from __future__ import annotations

from collections.abc import Iterable
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


def check_str(name: str, value: object, *, optional: bool = False) -> str | None:
    """Return `value` if it is a string (or None when `optional`), else raise a ValueError
    naming it: a setting such as a dtype or a backend is given by name."""
    if (value is None and optional) or isinstance(value, str):
        return value
    allowed = "a string or None" if optional else "a string"
    raise ValueError(f"{name} must be {allowed}, got {type(value).__name__} {value!r:.60}")


def check_fraction(name: str, value: object) -> float:
    """Return `value` if it is a number in (0, 1] (a share such as gpu_memory_utilization,
    within vLLM's bounds), else raise a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{name} must be a fraction in (0, 1], got {value!r}")
    return value


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


class StepContract:
    """The promises a scheduler checks its callers against, in every part of refimpl.

    `add` accepts a request once: `check_add` refuses one whose key (seq_id, request_id) is
    still waiting or running, and one that needs more blocks than the whole pool holds (it
    could never run: `schedule()` would pass it over forever). `postprocess` takes the batch
    the latest `schedule()` handed out, once (`is_latest`, then `take`): a second postprocess
    would record tokens whose K/V was never computed. Batches are compared by identity, so a
    copy is not the batch. Every check runs before the scheduler changes anything.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind  # "sequence" or "request", for the messages
        self.queued: dict[object, object] = {}  # key -> item add() accepted, until finished
        self.scheduled: tuple[object, ...] | None = None  # the batch awaiting postprocess

    def check_add(
        self,
        key: object,
        queues: Iterable[Iterable[object]],
        need: int,
        capacity: int,
        detail: str,
    ) -> None:
        """Refuse a request already queued under `key` (looked for in `queues`, since code may
        have taken it out by hand) or one that can grow to `need` blocks of a `capacity`-block
        pool; `detail` says where `need` comes from."""
        queued = self.queued.get(key)
        if queued is not None and any(any(q is queued for q in queue) for queue in queues):
            raise ValueError(f"{self.kind} {key} is already scheduled")
        if need > capacity:
            raise ValueError(
                f"{self.kind} {key} can grow to {need} blocks ({detail}) but the pool has "
                f"only {capacity}; it could never run"
            )

    def added(self, key: object, item: object) -> None:
        self.queued[key] = item

    def finished(self, key: object) -> None:
        del self.queued[key]

    def hand_out(self, batch: Iterable[object]) -> None:
        """Remember the batch `schedule()` returns (an empty one awaits nothing)."""
        batch = tuple(batch)
        self.scheduled = batch or None

    def is_latest(self, batch: Iterable[object]) -> bool:
        """Whether `batch` is the batch awaiting postprocess (the same objects, in order)."""
        batch = tuple(batch)
        return (
            self.scheduled is not None
            and len(batch) == len(self.scheduled)
            and all(a is b for a, b in zip(batch, self.scheduled))
        )

    def take(self) -> None:
        """postprocess has recorded the batch: nothing awaits until the next `schedule()`."""
        self.scheduled = None
