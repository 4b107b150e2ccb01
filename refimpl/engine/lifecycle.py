"""Closing an engine: both engines (`LLM`, `V4LLM`) free their KV cache the same way.

A cache sized from a GPU's free memory must be given back before a second engine in the same
process can size its own; `close()` (or leaving a `with` block) does that, and a closed engine
refuses new work with a clear error instead of failing deep inside the model runner.
"""

from __future__ import annotations


class ClosableEngine:
    """`close()`, `with` support and the open check, for an engine with `model_runner` and
    `scheduler`."""

    closed: bool = False

    def close(self) -> None:
        """Release the KV cache and the model and forget queued requests; the engine refuses
        work afterwards."""
        self.model_runner.close()
        self.scheduler.waiting.clear()
        self.scheduler.running.clear()
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(f"this {type(self).__name__} is closed; create a new one")
