"""Grader for exercise 06 (slot addressing): the torch twin of DeepSeek V4's sliding-window
index kernel, `compute_swa_indices_and_lens`.

The function is pure, so a step is one call on one batch: the student's answer is compared
with `refimpl.kernels.reference_v4` on hand-made batches (decodes, a prefill whose window
reaches back into earlier blocks, a young request whose window is shorter than W, padding rows,
prefill rows read from `token_offset`) and on seeded random batches. Arguments travel as plain
lists; the world (`swa_world`) turns them into int32 tensors, calls the function and turns its
two tensors back into plain data, so the same call runs here or in a grading child.

The rules checked (each with its scenario and a broken variant in `grader.exercises.rules`):
the window of the token at position `pos` starts at `max(pos - W + 1, 0)`, so its length is
`min(pos + 1, W)`; the slot of position p is `block_table[r, p // block_size] * block_size +
p % block_size`, oldest first, the rest of the row -1; an invalid token (padding) gets an all
-1 row and length 0; rows are tokens `token_offset ..`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from grader.exercises.addressing_world import swa_world
from grader.exercises.hybrid_checks import Case, CheckCases, _grade
from grader.lockstep.engine import render
from grader.lockstep.report import GradeReport, seeded_checks
from grader.lockstep.time_limit import DEFAULT_TIME_LIMIT
from refimpl.kernels.reference_v4 import (
    compute_swa_indices_and_lens as reference_swa_indices,
)


def _compare_swa(expected: Any, found: Any) -> tuple[str, str, str] | None:
    """(where, expected, found) of the first difference: the kind of answer, dtypes and
    shapes, then the first row whose length or slots differ."""
    if not isinstance(found, dict):
        return "result", "a dict of plain data", render(found)
    for key in ("answer", "indices dtype", "indices shape", "lens dtype", "lens shape"):
        if expected.get(key) != found.get(key):
            return key, render(expected.get(key)), render(found.get(key))
    for row, (want, got) in enumerate(zip(expected["lens"], found["lens"])):
        if want != got:
            return f"lens[{row}]", render(want), render(got)
    for row, (want, got) in enumerate(zip(expected["indices"], found["indices"])):
        if want != got:
            return f"indices[{row}]", render(want), render(got)
    return None


def swa_case(
    seq_lens: list[int],
    query_lens: list[int],
    block_table: list[list[int]],
    block_size: int,
    window: int,
    *,
    padding: int = 0,
    token_offset: int = 0,
    num_rows: int | None = None,
    stale_request: int = 0,
) -> Case:
    """One batch: request r has `query_lens[r]` new tokens ending at position seq_lens[r] - 1;
    `padding` invalid tokens follow (their request id is `stale_request`, as a reused buffer
    may hold)."""
    qsl = [0]
    for q in query_lens:
        qsl.append(qsl[-1] + q)
    t2r = [r for r, q in enumerate(query_lens) for _ in range(q)] + [stale_request] * padding
    valid = [True] * qsl[-1] + [False] * padding
    label = (
        f"compute_swa_indices_and_lens(seq_lens={seq_lens}, query_lens={query_lens}"
        f"{f', padding={padding}' if padding else ''}, block_size={block_size}, "
        f"window={window}{f', token_offset={token_offset}' if token_offset else ''}"
        f"{f', num_rows={num_rows}' if num_rows is not None else ''})"
    )
    args = (qsl, seq_lens, t2r, valid, block_table, block_size, window, token_offset, num_rows)
    return label, args


def random_swa_cases(seed: int, n: int) -> list[Case]:
    """Seeded batches: 1 to 4 requests (decodes and prefills), blocks of 1 to 8 tokens,
    windows of 1 to 12, shuffled block ids, some padding rows, sometimes only the prefill rows
    (token_offset = the decode tokens)."""
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        block_size, window = rng.choice([1, 2, 4, 8]), rng.randint(1, 12)
        num_reqs = rng.randint(1, 4)
        decodes = rng.randint(0, num_reqs)
        query_lens = [1] * decodes + [rng.randint(1, 6) for _ in range(num_reqs - decodes)]
        seq_lens = [q + rng.randint(0, 20) for q in query_lens]
        width = max(-(-s // block_size) for s in seq_lens)
        ids = list(range(num_reqs * width))
        rng.shuffle(ids)
        table = [ids[r * width : (r + 1) * width] for r in range(num_reqs)]
        offset = decodes if rng.random() < 0.3 else 0
        cases.append(
            swa_case(
                seq_lens,
                query_lens,
                table,
                block_size,
                window,
                padding=rng.choice([0, 0, 1, 3]),
                token_offset=offset,
                stale_request=rng.randrange(num_reqs),
            )
        )
    return cases


def swa_indices_checks() -> CheckCases:
    """The rows of `check_swa_indices`, each with its batches."""
    checks = [
        (
            "decodes",
            "one new token per request: the last W positions of each sequence",
            [swa_case([5, 9], [1, 1], [[3, 1, 0], [7, 2, 5]], 4, 4)],
        ),
        (
            "window_reaches_back",
            "a prefill whose windows start W - 1 positions back, across blocks",
            [
                swa_case([10], [6], [[4, 0, 3, 6, 1]], 2, 4),
                swa_case([12, 7], [3, 2], [[2, 5, 0], [1, 4, 3]], 4, 6),
            ],
        ),
        (
            "young_request_short_window",
            "a window never starts before position 0: length min(pos + 1, W)",
            [
                swa_case([2], [2], [[5]], 4, 4),
                swa_case([3, 8], [3, 1], [[1, 0], [2, 3]], 4, 6),
            ],
        ),
        (
            "padding_rows",
            "an invalid (padding) token: all -1 row and length 0, whatever its request id",
            [
                swa_case([6], [1], [[2, 0]], 4, 4, padding=2),
                swa_case(
                    [9, 4], [2, 1], [[0, 3, 5], [1, 2, 4]], 4, 3, padding=3, stale_request=1
                ),
            ],
        ),
        (
            "prefill_rows_from_offset",
            "rows start at token_offset (vLLM's prefill rows after the decodes)",
            [
                swa_case(
                    [7, 11, 5], [1, 1, 3], [[0, 1], [2, 3, 4], [5, 6]], 4, 5, token_offset=2
                ),
                swa_case([7, 5], [1, 3], [[0, 1], [5, 6]], 4, 5, token_offset=1, num_rows=2),
            ],
        ),
    ]
    checks += seeded_checks(
        "random_batches",
        "seeded random batches",
        lambda seed: random_swa_cases(seed, 25),
        range(2),
    )
    return checks


def check_swa_indices(
    student_fn: Callable,
    *,
    verbose: bool = True,
    allow_reference: bool = False,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
) -> GradeReport:
    """Grade `compute_swa_indices_and_lens(query_start_loc, seq_lens, token_to_req_indices,
    is_valid_token, block_table, block_size, window_size, token_offset=0, num_rows=None)`
    against the package's torch twin in `refimpl.kernels.reference_v4`.

    Answers are compared as plain data: dtypes and shapes, then each row's length and slots. A
    call that runs the reference fails unless `allow_reference`. A check still running after
    `time_limit` seconds (None: no limit) is stopped and fails.
    """
    return _grade(
        "check_swa_indices",
        student_fn,
        swa_world(reference_swa_indices),
        swa_indices_checks(),
        _compare_swa,
        verbose,
        allow_reference,
        time_limit,
        world="swa",
    )
