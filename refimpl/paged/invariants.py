"""check_invariants: every rule that must hold between a BlockManager and its live
sequences."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from refimpl.errors import InvariantError
from refimpl.paged.block_manager import BlockManager
from refimpl.paged.hashing import compute_hash
from refimpl.paged.sequence import Sequence, SequenceStatus


def _fail(rule: str, detail: str) -> None:
    raise InvariantError(f"[{rule}] {detail}")


def check_invariants(block_manager: BlockManager, seqs: Iterable[Sequence]) -> None:
    """Raise InvariantError naming the first broken rule; `seqs` must be every sequence holding
    blocks.

    A block table may be one block short of `num_blocks` only while the newest token starts a
    new block that `may_append` has not added yet (between `postprocess` and the next decode).
    A running sequence has at most one token whose K/V is neither cached nor scheduled: the
    token `postprocess` sampled last (a second postprocess of one step would leave two).
    """
    bm = block_manager
    seqs = list(seqs)
    num_blocks = len(bm.blocks)
    free = list(bm.free_block_ids)
    free_set = set(free)
    used = bm.used_block_ids

    if len(free) != len(free_set):
        dupes = sorted(b for b, n in Counter(free).items() if n > 1)
        _fail("free-queue-unique", f"blocks {dupes} appear more than once in the free queue")
    if free_set & used:
        _fail("used-free-disjoint", f"blocks {sorted(free_set & used)} are both used and free")
    if free_set | used != set(range(num_blocks)):
        missing = sorted(set(range(num_blocks)) - (free_set | used))
        extra = sorted((free_set | used) - set(range(num_blocks)))
        _fail("used-free-partition", f"blocks lost: {missing}, unknown ids: {extra}")
    for i, block in enumerate(bm.blocks):
        if block.block_id != i:
            _fail("block-id", f"blocks[{i}] has block_id {block.block_id}")

    holders: Counter[int] = Counter()
    for seq in seqs:
        cached, scheduled = seq.num_cached_tokens, seq.num_scheduled_tokens
        if seq.status == SequenceStatus.RUNNING and not (
            cached >= 0 and scheduled >= 0 and len(seq) - 1 <= cached + scheduled <= len(seq)
        ):
            _fail(
                "one-uncached-token",
                f"running sequence {seq.seq_id} has num_tokens={len(seq)}, "
                f"num_cached_tokens={cached} and "
                f"num_scheduled_tokens={scheduled}: all its tokens but the last sampled one "
                "must be cached or scheduled",
            )
        table = seq.block_table
        if len(set(table)) != len(table):
            _fail("table-unique", f"sequence {seq.seq_id} holds a block twice: {table}")
        holders.update(table)
        if not table:
            continue
        short = seq.num_blocks - len(table)
        pending_new_block = (len(seq) - 1) % bm.block_size == 0
        if not (short == 0 or (short == 1 and pending_new_block)):
            _fail(
                "table-length",
                f"sequence {seq.seq_id} has {len(table)} blocks for {len(seq)} tokens "
                f"(num_blocks={seq.num_blocks})",
            )
        h = -1
        for i, block_id in enumerate(table):
            block = bm.blocks[block_id]
            if block.hash == -1:
                # registration stops here: no later block of this table may be registered
                h = None
                continue
            if h is None:
                _fail(
                    "hash-prefix",
                    f"block {block_id} (logical {i} of sequence {seq.seq_id}) is registered "
                    "after an unregistered block",
                )
            if block.token_ids != seq.block(i):
                _fail(
                    "block-content",
                    f"block {block_id} (logical {i} of sequence {seq.seq_id}) holds other "
                    "tokens",
                )
            h = compute_hash(block.token_ids, h)
            if block.hash != h:
                _fail(
                    "hash-chain",
                    f"block {block_id} (logical {i} of sequence {seq.seq_id}) has a hash that "
                    "breaks the chain",
                )

    for block in bm.blocks:
        expected = holders.get(block.block_id, 0)
        if block.ref_count != expected:
            _fail(
                "ref-count",
                f"block {block.block_id} has ref_count {block.ref_count} but {expected} "
                "sequences hold it",
            )
        if block.block_id in free_set and block.ref_count != 0:
            _fail(
                "free-ref-zero", f"free block {block.block_id} has ref_count {block.ref_count}"
            )
        if block.block_id in used and block.ref_count < 1:
            _fail(
                "used-ref-positive",
                f"used block {block.block_id} has ref_count {block.ref_count}",
            )

    if not bm.enable_prefix_caching and bm.hash_to_block_id:
        _fail(
            "no-cache-when-disabled", "prefix caching is off but hash_to_block_id has entries"
        )
    for h, block_id in bm.hash_to_block_id.items():
        if not 0 <= block_id < num_blocks:
            _fail("hash-map-target", f"hash {h} points to unknown block {block_id}")
        block = bm.blocks[block_id]
        if block.hash != h:
            _fail(
                "hash-map-agrees",
                f"hash_to_block_id[{h}] = {block_id} but that block's hash is {block.hash}",
            )
        if len(block.token_ids) != bm.block_size:
            _fail(
                "hash-map-full",
                f"cached block {block_id} holds {len(block.token_ids)} tokens, not a full "
                "block",
            )
