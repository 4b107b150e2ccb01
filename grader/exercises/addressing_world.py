"""The world of exercise 06: `compute_swa_indices_and_lens` called on plain lists.

Kept apart from `grader.exercises.addressing_checks` (which loads the reference) so that the
grading child can build it next to the student's function; torch is imported on the first call.
"""

from __future__ import annotations

from collections.abc import Callable


def swa_world(implementation: Callable | None) -> Callable:
    """A world around `compute_swa_indices_and_lens`: called with plain lists, it builds the
    int32 tensors, calls the function, and answers plain data (dtypes, shapes, values)."""
    if implementation is None:
        raise ValueError("a function world is built around the student's function only")

    def call(qsl, seq_lens, t2r, valid, block_table, block_size, window, offset, num_rows):
        import torch

        def ints(values):
            return torch.tensor(values, dtype=torch.int32)

        table = ints(block_table) if block_table else torch.zeros((0, 1), dtype=torch.int32)
        answer = implementation(
            ints(qsl),
            ints(seq_lens),
            ints(t2r),
            torch.tensor(valid, dtype=torch.bool),
            table,
            block_size,
            window,
            offset,
            num_rows,
        )
        if not (
            isinstance(answer, tuple)
            and len(answer) == 2
            and all(isinstance(t, torch.Tensor) for t in answer)
        ):
            return {"answer": f"not a pair of tensors: {type(answer).__name__}"}
        indices, lens = answer
        return {
            "answer": "a pair of tensors",
            "indices dtype": str(indices.dtype),
            "indices shape": list(indices.shape),
            "lens dtype": str(lens.dtype),
            "lens shape": list(lens.shape),
            "indices": indices.tolist(),
            "lens": lens.tolist(),
        }

    return call
