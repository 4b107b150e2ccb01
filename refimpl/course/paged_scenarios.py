"""Small worked scenarios on a real BlockManager that the notebooks replay and the tests pin.

- `prefix_cache_example`: the block_size=4 picture of the article "3.4 KV Cache and
  BlockManager"
  (about nano-vllm): a 12-token request that hits one block in use and one freed block;
- `reusable_prefix_tokens` / `measure_reusable_prefix_tokens`: how much of a shared prefix a
  block size lets a second prompt reuse, as a formula and measured;
- `cached_prefix_after_reuse`: what freeing a sequence's blocks last-to-first buys.
"""

from __future__ import annotations

from refimpl.course.paged_steps import prefill
from refimpl.course.prefix_match import explain_prefix_match
from refimpl.paged.block_manager import BlockManager
from refimpl.paged.sequence import Sequence
from refimpl.validation import check_int_at_least, check_positive_int

# Token ids of the article's example: three 4-token blocks it calls A, B, C, of a 12-token
# request. (The letters are the article's; they are not the running example's users A, B and
# C.)
EXAMPLE_A = [101, 102, 103, 104]
EXAMPLE_B = [201, 202, 203, 204]
EXAMPLE_C = [301, 302, 303, 304]


def prefix_cache_example() -> tuple[BlockManager, dict[str, Sequence], Sequence]:
    """The article's block_size=4 picture: (block manager, sequences holding blocks, new
    request).

    Built with real calls on an 8-block pool: `other0` takes #0; `holder` = A + 1 token takes
    #1 (A) and #2; `finished` = A + B + 1 token shares #1 and takes #3 (B) and #4, then
    finishes (freeing #4, then #3); `other1` takes #5. The new 12-token request A + B + C then
    hits #1 in use (ref 1 -> 2), pulls #3 out of the free queue, and gets #6 from the queue
    head.
    """
    bm = BlockManager(8, 4)
    other0 = Sequence([1, 2, 3], block_size=4)
    holder = Sequence(EXAMPLE_A + [11], block_size=4)
    finished = Sequence(EXAMPLE_A + EXAMPLE_B + [21], block_size=4)
    other1 = Sequence([5, 6], block_size=4)
    prefill(bm, other0)
    prefill(bm, holder)
    prefill(bm, finished)
    bm.deallocate(finished)
    prefill(bm, other1)
    request = Sequence(EXAMPLE_A + EXAMPLE_B + EXAMPLE_C, block_size=4)
    return bm, {"other0": other0, "holder": holder, "other1": other1}, request


def reusable_prefix_tokens(shared_prefix_len: int, prompt_len: int, block_size: int) -> int:
    """Tokens of a prompt that a cached shared prefix saves: whole blocks only, never the last
    block.

    A prompt of `prompt_len` tokens starting with a `shared_prefix_len`-token prefix that is
    already cached hits `min(shared // block_size, num_blocks - 1)` blocks.
    """
    check_int_at_least("shared_prefix_len", shared_prefix_len, 0)
    check_positive_int("prompt_len", prompt_len)
    check_positive_int("block_size", block_size)
    if shared_prefix_len > prompt_len:
        raise ValueError(
            f"shared_prefix_len ({shared_prefix_len}) cannot exceed prompt_len ({prompt_len})"
        )
    num_blocks = (prompt_len + block_size - 1) // block_size
    return min(shared_prefix_len // block_size, num_blocks - 1) * block_size


def measure_reusable_prefix_tokens(
    shared_prefix_len: int, prompt_len: int, block_size: int
) -> int:
    """The same number measured on a real BlockManager: prefill one prompt, then match a
    second.

    Both prompts start with the same `shared_prefix_len` tokens and differ afterwards; the
    second has `prompt_len` tokens. Returns the second request's `num_cached_tokens`.
    """
    if shared_prefix_len > prompt_len:
        raise ValueError(
            f"shared_prefix_len ({shared_prefix_len}) cannot exceed prompt_len ({prompt_len})"
        )
    prefix = list(range(1, shared_prefix_len + 1))
    suffix_len = prompt_len - shared_prefix_len
    first = Sequence(prefix + [10**6 + i for i in range(suffix_len)], block_size=block_size)
    second = Sequence(
        prefix + [2 * 10**6 + i for i in range(suffix_len)], block_size=block_size
    )
    pool = first.num_blocks + second.num_blocks
    bm = BlockManager(pool, block_size)
    prefill(bm, first)
    bm.allocate(second, bm.can_allocate(second))
    return second.num_cached_tokens


class _ForwardFreeBlockManager(BlockManager):
    """A counterfactual BlockManager that frees a sequence's blocks first-to-last (not
    nano-vllm)."""

    def deallocate(self, seq: Sequence) -> None:
        # the real deallocate walks the table backwards: now first to last
        seq.block_table.reverse()
        super().deallocate(seq)


def cached_prefix_after_reuse(
    num_prompt_blocks: int, block_size: int, *, reverse_free: bool = True
) -> list[int]:
    """How many leading blocks of a finished prompt still hit after k = 0, 1, ... blocks are
    reused.

    A prompt of `num_prompt_blocks` full blocks plus one token is prefilled and freed into an
    otherwise empty free queue; then unrelated one-block requests take blocks from the queue
    head one at a time. Entry k is the number of leading prompt blocks still in the cache (what
    a repeat of the prompt would hit, given room) after k such requests. nano-vllm frees
    last-to-first (`reverse_free=True`), so the tail of the prompt is overwritten first and the
    shared prefix survives longest.
    """
    if num_prompt_blocks < 1:
        raise ValueError(f"num_prompt_blocks must be >= 1, got {num_prompt_blocks}")
    cls = BlockManager if reverse_free else _ForwardFreeBlockManager
    num_seq_blocks = num_prompt_blocks + 1
    bm = cls(num_seq_blocks, block_size)
    prompt = list(range(1, num_prompt_blocks * block_size + 2))
    first = Sequence(prompt, block_size=block_size)
    prefill(bm, first)
    bm.deallocate(first)
    hits = []
    for k in range(num_seq_blocks + 1):
        repeat = Sequence(prompt, block_size=block_size)
        hits.append(explain_prefix_match(bm, repeat).num_cached_blocks)
        if k < num_seq_blocks:  # one more unrelated request takes the block at the queue head
            bm.allocate(Sequence([10**6 + k], block_size=block_size), 0)
    return hits
