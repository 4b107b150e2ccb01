"""Explain, block by block, how a request would match the prefix cache, without changing anything.

`BlockManager.can_allocate` answers with one number. `explain_prefix_match` walks the same
hash chain and says, for every logical block of the request, what would happen to it:

- ``HIT_IN_USE``: the cached block is held by another sequence; it is shared (ref count + 1)
  and costs no free block.
- ``HIT_FREE``: the cached block was freed but not yet overwritten; it is pulled back out of
  the free queue, so it still uses up one free block.
- ``MISS``: no cached block with this hash, or one whose tokens differ (a hash collision).
  The first miss stops the walk.
- ``NOT_LOOKED_UP``: a block after the first miss; its K/V depends on the missed block, so it
  is never looked up and gets a fresh block.
- ``LAST_BLOCK``: the request's last block is never looked up: prefill must compute at least
  one token to get the logits that sample the next token.

It also predicts which physical block each logical block would get from `allocate`.
The module also holds the small scenarios the notebooks replay (the 12-token example of the nano-vllm write-up "3.4 KV Cache and BlockManager",
the 600-token shared prefix, and what reverse-order freeing buys).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from refimpl.paged.block_manager import BlockManager
from refimpl.paged.hashing import compute_hash
from refimpl.paged.sequence import Sequence
from refimpl.validation import check_int_at_least, check_positive_int


class MatchOutcome(Enum):
    """What matching does with one logical block of a new request."""

    HIT_IN_USE = "hit, in use"
    HIT_FREE = "hit, freed"
    MISS = "miss"
    NOT_LOOKED_UP = "not looked up"
    LAST_BLOCK = "last block"


@dataclass(frozen=True)
class BlockMatch:
    """The fate of logical block `index` of the request.

    `hash` is the chained hash computed for the lookup (None when the block is not looked up).
    `cached_block_id` is the block the hash table pointed at (also set for a collision, None
    otherwise). `block_id` is the physical block `allocate` would put in the block table
    (None when the request does not fit). `ref_count_before/after` describe that block.
    """

    index: int
    outcome: MatchOutcome
    token_ids: tuple[int, ...]
    hash: int | None
    cached_block_id: int | None
    block_id: int | None
    ref_count_before: int | None
    ref_count_after: int | None
    from_queue_head: bool
    reason: str


@dataclass(frozen=True)
class PrefixMatch:
    """Per-block explanation of one request's prefix match, plus the free-block arithmetic."""

    block_size: int
    num_tokens: int
    blocks: tuple[BlockMatch, ...]
    num_cached_blocks: int
    num_free_blocks_needed: int
    num_free_blocks: int

    @property
    def fits(self) -> bool:
        return self.num_free_blocks >= self.num_free_blocks_needed

    @property
    def can_allocate(self) -> int:
        """What `BlockManager.can_allocate` returns: -1, or the number of cached blocks."""
        return self.num_cached_blocks if self.fits else -1

    @property
    def num_cached_tokens(self) -> int:
        """Tokens whose K/V prefill can skip (set on the sequence by `allocate`)."""
        return self.num_cached_blocks * self.block_size if self.fits else 0

    @property
    def num_fresh_blocks(self) -> int:
        """Blocks taken from the head of the free queue (everything that is not a hit)."""
        return len(self.blocks) - self.num_cached_blocks

    def outcomes(self) -> list[MatchOutcome]:
        return [b.outcome for b in self.blocks]


def _reason(outcome: MatchOutcome, cached_block_id: int | None) -> str:
    return {
        MatchOutcome.HIT_IN_USE: f"hash and tokens match block {cached_block_id}, which is in use: share it",
        MatchOutcome.HIT_FREE: f"hash and tokens match freed block {cached_block_id}: pull it out of the free queue",
        MatchOutcome.NOT_LOOKED_UP: "an earlier block missed, so the chain is broken",
        MatchOutcome.LAST_BLOCK: "the last block is always recomputed (prefill needs logits)",
    }.get(outcome, "")


def explain_prefix_match(block_manager: BlockManager, seq: Sequence) -> PrefixMatch:
    """How `seq` would match the prefix cache of `block_manager`; nothing is changed.

    Follows `can_allocate`/`allocate` exactly: walk the chain over all blocks but the last,
    stop at the first miss, count a freed hit as needing a free block, then predict the fresh
    blocks as the head of the free queue once the freed hits have left it.
    """
    bm = block_manager
    if seq.block_size != bm.block_size:
        raise ValueError(f"sequence {seq.seq_id} has block_size {seq.block_size} but the BlockManager uses {bm.block_size}")
    n = seq.num_blocks
    outcomes: list[MatchOutcome] = []
    hashes: list[int | None] = []
    cached_ids: list[int | None] = []
    reasons: list[str] = []
    h = -1
    missed = not bm.enable_prefix_caching
    for i in range(n):
        if i == n - 1:
            outcome, hv, cached = MatchOutcome.LAST_BLOCK, None, None
        elif missed:
            outcome, hv, cached = MatchOutcome.NOT_LOOKED_UP, None, None
        else:
            tokens = seq.block(i)
            h = compute_hash(tokens, h)
            hv = h
            cached = bm.hash_to_block_id.get(h)
            if cached is None or bm.blocks[cached].token_ids != tokens:
                outcome, missed = MatchOutcome.MISS, True
            elif cached in bm.used_block_ids:
                outcome = MatchOutcome.HIT_IN_USE
            else:
                outcome = MatchOutcome.HIT_FREE
        outcomes.append(outcome)
        hashes.append(hv)
        cached_ids.append(cached)
        if outcome is MatchOutcome.MISS:
            reasons.append("no cached block has this hash" if cached is None else
                           f"hash points to block {cached} but its tokens differ (hash collision caught)")
        elif outcome is MatchOutcome.NOT_LOOKED_UP and not bm.enable_prefix_caching:
            reasons.append("prefix caching is off")
        else:
            reasons.append(_reason(outcome, cached))

    hits = (MatchOutcome.HIT_IN_USE, MatchOutcome.HIT_FREE)
    num_cached = sum(o in hits for o in outcomes)
    num_needed = n - sum(o is MatchOutcome.HIT_IN_USE for o in outcomes)
    num_free = len(bm.free_block_ids)
    fits = num_free >= num_needed

    # allocate takes the hits first (freed hits leave the queue), then pops fresh blocks from the head.
    revived = {cached_ids[i] for i, o in enumerate(outcomes) if o is MatchOutcome.HIT_FREE}
    queue_after_hits = (b for b in bm.free_block_ids if b not in revived)
    blocks = []
    for i, outcome in enumerate(outcomes):
        cached = cached_ids[i]
        if outcome in hits:
            block_id = cached
            before = bm.blocks[cached].ref_count
            after = before + 1
        elif fits:
            block_id = next(queue_after_hits)
            before, after = 0, 1
        else:
            block_id, before, after = None, None, None
        blocks.append(
            BlockMatch(
                index=i,
                outcome=outcome,
                token_ids=tuple(seq.block(i)),
                hash=hashes[i],
                cached_block_id=cached,
                block_id=block_id,
                ref_count_before=before,
                ref_count_after=after,
                from_queue_head=outcome not in hits and fits,
                reason=reasons[i],
            )
        )
    return PrefixMatch(
        block_size=bm.block_size,
        num_tokens=len(seq),
        blocks=tuple(blocks),
        num_cached_blocks=num_cached,
        num_free_blocks_needed=num_needed,
        num_free_blocks=num_free,
    )


# --------------------------------------------------------------------------- scenario helpers
def prefill(block_manager: BlockManager, seq: Sequence) -> int:
    """Allocate `seq` and compute its whole prompt in one step, as schedule + postprocess do.

    Registers the blocks this step filled (`hash_blocks`) and marks the tokens cached; no token
    is sampled. Returns the number of prefix-cache hit blocks. Raises ValueError if it does not fit.
    """
    num_cached_blocks = block_manager.can_allocate(seq)
    if num_cached_blocks == -1:
        raise ValueError(
            f"sequence {seq.seq_id} needs more free blocks than the {len(block_manager.free_block_ids)} available"
        )
    block_manager.allocate(seq, num_cached_blocks)
    seq.num_scheduled_tokens = len(seq) - seq.num_cached_tokens
    block_manager.hash_blocks(seq)
    seq.num_cached_tokens += seq.num_scheduled_tokens
    seq.num_scheduled_tokens = 0
    return num_cached_blocks


def decode_step(block_manager: BlockManager, seq: Sequence, token_id: int) -> bool:
    """One decode step after `prefill`: `token_id` (sampled last step) joins the sequence and its
    K/V is computed now, in a new block if it is the first token of one.

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
        raise ValueError(f"sequence {seq.seq_id} needs a new block but the free queue is empty")
    block_manager.may_append(seq)
    seq.num_scheduled_tokens = 1
    block_manager.hash_blocks(seq)
    seq.num_cached_tokens += 1
    seq.num_scheduled_tokens = 0
    return len(seq.block_table) > before


# Token ids of the write-up's example: three 4-token blocks A, B, C of a 12-token request.
EXAMPLE_A = [101, 102, 103, 104]
EXAMPLE_B = [201, 202, 203, 204]
EXAMPLE_C = [301, 302, 303, 304]


def prefix_cache_example() -> tuple[BlockManager, dict[str, Sequence], Sequence]:
    """The nano-vllm write-up's block_size=4 picture: (block manager, sequences holding blocks, new request).

    Built with real calls on an 8-block pool: `other0` takes #0; `holder` = A + 1 token takes
    #1 (A) and #2; `finished` = A + B + 1 token shares #1 and takes #3 (B) and #4, then finishes
    (freeing #4, then #3); `other1` takes #5. The new 12-token request A + B + C then hits #1
    in use (ref 1 -> 2), pulls #3 out of the free queue, and gets #6 from the queue head.
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
    """Tokens of a prompt that a cached shared prefix saves: whole blocks only, never the last block.

    A prompt of `prompt_len` tokens starting with a `shared_prefix_len`-token prefix that is
    already cached hits `min(shared // block_size, num_blocks - 1)` blocks.
    """
    check_int_at_least("shared_prefix_len", shared_prefix_len, 0)
    check_positive_int("prompt_len", prompt_len)
    check_positive_int("block_size", block_size)
    if shared_prefix_len > prompt_len:
        raise ValueError(f"shared_prefix_len ({shared_prefix_len}) cannot exceed prompt_len ({prompt_len})")
    num_blocks = (prompt_len + block_size - 1) // block_size
    return min(shared_prefix_len // block_size, num_blocks - 1) * block_size


def measure_reusable_prefix_tokens(shared_prefix_len: int, prompt_len: int, block_size: int) -> int:
    """The same number measured on a real BlockManager: prefill one prompt, then match a second.

    Both prompts start with the same `shared_prefix_len` tokens and differ afterwards; the
    second has `prompt_len` tokens. Returns the second request's `num_cached_tokens`.
    """
    if shared_prefix_len > prompt_len:
        raise ValueError(f"shared_prefix_len ({shared_prefix_len}) cannot exceed prompt_len ({prompt_len})")
    prefix = list(range(1, shared_prefix_len + 1))
    suffix_len = prompt_len - shared_prefix_len
    first = Sequence(prefix + [10**6 + i for i in range(suffix_len)], block_size=block_size)
    second = Sequence(prefix + [2 * 10**6 + i for i in range(suffix_len)], block_size=block_size)
    pool = first.num_blocks + second.num_blocks
    bm = BlockManager(pool, block_size)
    prefill(bm, first)
    bm.allocate(second, bm.can_allocate(second))
    return second.num_cached_tokens


class _ForwardFreeBlockManager(BlockManager):
    """A counterfactual BlockManager that frees a sequence's blocks first-to-last (not nano-vllm)."""

    def deallocate(self, seq: Sequence) -> None:
        seq.block_table.reverse()  # the real deallocate walks the table backwards: now first to last
        super().deallocate(seq)


def cached_prefix_after_reuse(num_prompt_blocks: int, block_size: int, *, reverse_free: bool = True) -> list[int]:
    """How many leading blocks of a finished prompt still hit after k = 0, 1, ... blocks are reused.

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


__all__ = [
    "BlockMatch",
    "MatchOutcome",
    "PrefixMatch",
    "cached_prefix_after_reuse",
    "decode_step",
    "explain_prefix_match",
    "measure_reusable_prefix_tokens",
    "prefill",
    "reusable_prefix_tokens",
    "prefix_cache_example",
]
