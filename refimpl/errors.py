"""Error types shared by every part of refimpl.

Bad user input raises `ValueError` (before any state changes). A broken internal rule, found by
an invariant checker, raises `InvariantError`, which names the rule so a learner can find it.
"""


class InvariantError(AssertionError):
    """An internal consistency rule of a KV-cache data structure does not hold."""


class BackendUnavailableError(RuntimeError):
    """A backend was asked for that this machine cannot run (missing package or device)."""
