"""Explain, block by block, how a request would match the prefix cache, without changing
anything.

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
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from refimpl.paged.block_manager import BlockManager
from refimpl.paged.hashing import compute_hash
from refimpl.paged.sequence import Sequence


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
        MatchOutcome.HIT_IN_USE: (
            f"hash and tokens match block {cached_block_id}, which is in use: share it"
        ),
        MatchOutcome.HIT_FREE: (
            f"hash and tokens match freed block {cached_block_id}: "
            "pull it out of the free queue"
        ),
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
        raise ValueError(
            f"sequence {seq.seq_id} has block_size {seq.block_size} but the BlockManager uses "
            f"{bm.block_size}"
        )
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
            reasons.append(
                "no cached block has this hash"
                if cached is None
                else f"hash points to block {cached} but its tokens differ "
                "(hash collision caught)"
            )
        elif outcome is MatchOutcome.NOT_LOOKED_UP and not bm.enable_prefix_caching:
            reasons.append("prefix caching is off")
        else:
            reasons.append(_reason(outcome, cached))

    hits = (MatchOutcome.HIT_IN_USE, MatchOutcome.HIT_FREE)
    num_cached = sum(o in hits for o in outcomes)
    num_needed = n - sum(o is MatchOutcome.HIT_IN_USE for o in outcomes)
    num_free = len(bm.free_block_ids)
    fits = num_free >= num_needed

    # allocate takes the hits first (freed hits leave the queue), then pops fresh blocks from
    # the head.
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
