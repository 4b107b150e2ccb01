"""One scheduler step for one sequence, without a Scheduler: what notebooks and scenarios
replay.

`Scheduler.schedule` + `postprocess` do this for a whole batch; here a single sequence is
allocated, computed and registered so a reader can watch the block manager alone.
"""

from __future__ import annotations

from refimpl.paged.block_manager import BlockManager
from refimpl.paged.sequence import Sequence


def compute_tokens(block_manager: BlockManager, seq: Sequence, num_tokens: int) -> list[int]:
    """The model computed the next `num_tokens` tokens of `seq`: register the blocks they
    filled (`hash_blocks`, as postprocess does) and mark the tokens cached.

    Returns the ids of the blocks registered in the prefix cache by this step.
    """
    if not 0 <= num_tokens <= len(seq) - seq.num_cached_tokens:
        raise ValueError(
            f"sequence {seq.seq_id} has {len(seq) - seq.num_cached_tokens} uncomputed tokens; "
            f"cannot compute {num_tokens}"
        )
    start = seq.num_cached_tokens // block_manager.block_size
    seq.num_scheduled_tokens = num_tokens
    block_manager.hash_blocks(seq)
    seq.num_cached_tokens += num_tokens
    seq.num_scheduled_tokens = 0
    end = seq.num_cached_tokens // block_manager.block_size
    if not block_manager.enable_prefix_caching:
        return []
    return list(seq.block_table[start:end])


def prefill(block_manager: BlockManager, seq: Sequence) -> int:
    """Allocate `seq` and compute its whole prompt in one step, as schedule + postprocess do.

    Registers the blocks this step filled (`hash_blocks`) and marks the tokens cached; no token
    is sampled. Returns the number of prefix-cache hit blocks. Raises ValueError if it does not
    fit.
    """
    num_cached_blocks = block_manager.can_allocate(seq)
    if num_cached_blocks == -1:
        raise ValueError(
            f"sequence {seq.seq_id} needs more free blocks than the "
            f"{len(block_manager.free_block_ids)} available"
        )
    block_manager.allocate(seq, num_cached_blocks)
    compute_tokens(block_manager, seq, len(seq) - seq.num_cached_tokens)
    return num_cached_blocks


def decode_step(block_manager: BlockManager, seq: Sequence, token_id: int) -> bool:
    """One decode step after `prefill`: `token_id` (sampled last step) joins the sequence and
    its K/V is computed now, in a new block if it is the first token of one.

    Runs `can_append`, `may_append`, then registers a block this token filled (`hash_blocks`),
    as schedule + postprocess do. Returns True when a new block was added. Raises ValueError
    (before changing anything) when a new block is needed and none is free.
    """
    if seq.num_cached_tokens != len(seq):
        raise ValueError(f"sequence {seq.seq_id} has uncomputed tokens; prefill it first")
    before = len(seq.block_table)
    seq.append_token(token_id)
    if not block_manager.can_append(seq):
        seq.token_ids.pop()
        seq.num_tokens -= 1
        seq.last_token = seq.token_ids[-1]
        raise ValueError(
            f"sequence {seq.seq_id} needs a new block but the free queue is empty"
        )
    block_manager.may_append(seq)
    compute_tokens(block_manager, seq, 1)
    return len(seq.block_table) > before
