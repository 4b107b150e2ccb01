"""The running example has the shape its chapters describe: 2 shared blocks, C hits A's full
blocks."""

from __future__ import annotations

import pytest

from refimpl.course.paged_steps import prefill
from refimpl.course.running_example import SYSTEM, names_by_seq_id, prompt, requests
from refimpl.paged import BlockManager


def test_shapes_at_block_size_4():
    seqs = requests()
    assert list(seqs) == ["A", "B", "C"]
    assert [(s.num_tokens, s.num_blocks, s.last_block_num_tokens) for s in seqs.values()] == [
        (11, 3, 3),
        (13, 4, 1),
        (11, 3, 3),
    ]
    assert len(SYSTEM) == 8 and prompt("C") == prompt("A")
    assert names_by_seq_id(seqs) == {seqs[n].seq_id: n for n in "ABC"}
    with pytest.raises(ValueError, match="users A, B, C"):
        prompt("D")


def test_b_shares_the_system_blocks_and_c_hits_all_of_as_full_blocks():
    bm = BlockManager(16, 4)
    seqs = requests()
    prefill(bm, seqs["A"])
    assert bm.can_allocate(seqs["B"]) == 2  # the two system-prompt blocks
    assert bm.can_allocate(seqs["C"]) == 2  # A's third block is partial: never registered
    prefill(bm, seqs["B"])
    assert seqs["B"].block_table[:2] == seqs["A"].block_table[:2]
