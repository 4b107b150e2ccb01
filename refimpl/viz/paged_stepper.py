"""Step through the BlockManager: the lists of real calls chapters 03 and 04 play.

`running_example_actions` (chapter 03) and `prefix_cache_actions` (chapter 04) step users A, B
and C of `refimpl.course.running_example` (and A's second turn, `A2`) through a real
BlockManager. With `refimpl.viz.record_frames` and `refimpl.viz.paged.pool_snapshot` they make
those chapters' `Stepper`s, drawn by `draw_pool_snapshot` with `pool_snapshot_text` as its text
twin.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from refimpl.course import running_example
from refimpl.course.paged_steps import compute_tokens, decode_step
from refimpl.paged.block_manager import BlockManager
from refimpl.paged.sequence import Sequence

#: Tokens generated in the running example's decode steps (2xx/3xx like the users' questions).
DECODE_TOKENS = {"A": [211, 212], "B": [311, 312]}
#: A's second turn (chapter 04): A's prompt, A's answer, then a new 5-token question.
SECOND_TURN_QUESTION = [221, 222, 223, 224, 225]


def second_turn_prompt() -> list[int]:
    """The 18 tokens of A's second turn: the system prompt, A's question, A's answer, a new
    question."""
    return running_example.prompt("A") + DECODE_TOKENS["A"] + SECOND_TURN_QUESTION


def running_example_actions(
    bm: BlockManager, seqs: Mapping[str, Sequence]
) -> list[tuple[str, Callable[[], object]]]:
    """The calls chapter 03 steps through, in order, on the running example's A, B and C.

    A arrives and is prefilled; B arrives and shares the system prompt's two registered blocks;
    A decodes two tokens (the second starts a new block), B one; A finishes; C (A's prompt
    again) arrives and shares the system prompt blocks B still holds; then B and C finish.
    """
    a, b, c = seqs["A"], seqs["B"], seqs["C"]

    def admit(seq: Sequence) -> None:
        bm.allocate(seq, bm.can_allocate(seq))

    def computed(seq: Sequence) -> None:
        compute_tokens(bm, seq, len(seq) - seq.num_cached_tokens)  # postprocess: hash_blocks

    return [
        ("A: allocate(A, can_allocate(A))", lambda: admit(a)),
        ("A's prompt computed: hash_blocks(A)", lambda: computed(a)),
        ("B: allocate(B, can_allocate(B))", lambda: admit(b)),
        ("B's prompt computed: hash_blocks(B)", lambda: computed(b)),
        (
            f"A decodes token {DECODE_TOKENS['A'][0]} (may_append)",
            lambda: decode_step(bm, a, DECODE_TOKENS["A"][0]),
        ),
        (
            f"A decodes token {DECODE_TOKENS['A'][1]} (may_append)",
            lambda: decode_step(bm, a, DECODE_TOKENS["A"][1]),
        ),
        (
            f"B decodes token {DECODE_TOKENS['B'][0]} (may_append)",
            lambda: decode_step(bm, b, DECODE_TOKENS["B"][0]),
        ),
        ("A finishes: deallocate(A)", lambda: bm.deallocate(a)),
        ("C: allocate(C, can_allocate(C))", lambda: admit(c)),
        ("B finishes: deallocate(B)", lambda: bm.deallocate(b)),
        ("C finishes: deallocate(C)", lambda: bm.deallocate(c)),
    ]


def prefix_cache_actions(
    bm: BlockManager, seqs: Mapping[str, Sequence]
) -> list[tuple[str, Callable[[], object]]]:
    """The calls chapter 04 steps through: registration chunk by chunk, then lookups that hit.

    A is prefilled in two chunks (6, then 5 tokens) and decodes two tokens, each step
    registering the blocks it filled; B shares the two system-prompt blocks; A finishes; A's
    second turn (`seqs["A2"]`, built from `second_turn_prompt()`) hits two blocks in use, pulls
    A's freed third block out of the free queue, and misses on the fourth.
    """
    a, b, a2 = seqs["A"], seqs["B"], seqs["A2"]

    def admit(seq: Sequence) -> None:
        bm.allocate(seq, bm.can_allocate(seq))

    def decode(seq: Sequence, token: int) -> None:
        seq.append_token(token)
        bm.may_append(seq)
        compute_tokens(bm, seq, 1)

    return [
        ("A: allocate(A, can_allocate(A))", lambda: admit(a)),
        ("A, chunk 1: 6 tokens computed, hash_blocks(A)", lambda: compute_tokens(bm, a, 6)),
        ("A, chunk 2: 5 tokens computed, hash_blocks(A)", lambda: compute_tokens(bm, a, 5)),
        (
            f"A decodes {DECODE_TOKENS['A'][0]}: block L2 is full",
            lambda: decode(a, DECODE_TOKENS["A"][0]),
        ),
        (
            f"A decodes {DECODE_TOKENS['A'][1]}: a new block L3",
            lambda: decode(a, DECODE_TOKENS["A"][1]),
        ),
        ("B: allocate, 2 hits in use", lambda: admit(b)),
        (
            "B's prompt computed: hash_blocks(B)",
            lambda: compute_tokens(bm, b, len(b) - b.num_cached_tokens),
        ),
        ("A finishes: deallocate(A)", lambda: bm.deallocate(a)),
        ("A2: allocate, 2 hits in use + 1 freed hit", lambda: admit(a2)),
        (
            "A2's prompt computed: hash_blocks(A2)",
            lambda: compute_tokens(bm, a2, len(a2) - a2.num_cached_tokens),
        ),
    ]
