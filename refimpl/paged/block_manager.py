"""BlockManager: the ledger of physical KV blocks, with nano-vllm's xxhash prefix cache.

It never touches K/V numbers. It decides which physical block holds which logical block of
which sequence, shares full blocks between sequences with the same prefix, and keeps freed
blocks findable until they are actually reused.

Its public face is nano-vllm's six methods, which the Scheduler calls and nothing else:
`can_allocate`, `allocate`, `deallocate`, `can_append`, `may_append`, `hash_blocks`. Speed
lives inside: an O(1) free queue, block hashes computed once and kept on the sequence
(`seq.block_hashes`, as vLLM keeps `request.block_hashes`), and `allocate` reusing the walk of
`can_allocate`.
"""

from __future__ import annotations

from refimpl.errors import InvariantError
from refimpl.paged.block import Block
from refimpl.paged.free_queue import FreeBlockQueue
from refimpl.paged.hashing import compute_hash
from refimpl.paged.sequence import Sequence, check_block_size
from refimpl.validation import check_instance, check_positive_int, is_integer


class BlockManager:
    """Allocate, append and free KV blocks for sequences; match and register cached prefixes.

    Orders match nano-vllm exactly: new blocks come from the head of a FIFO free queue, freed
    blocks go to its tail, and a sequence frees its blocks last-to-first so that shared early
    blocks stay cached longest.
    """

    def __init__(
        self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True
    ) -> None:
        check_positive_int("num_blocks (the pool size)", num_blocks)
        self.block_size = check_block_size(block_size)
        if not isinstance(enable_prefix_caching, bool):
            raise ValueError(
                f"enable_prefix_caching must be True or False, got {enable_prefix_caching!r}"
            )
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks: list[Block] = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids = FreeBlockQueue(range(num_blocks))
        self.used_block_ids: set[int] = set()
        # seq_id -> the block table `allocate` filled (the very list the sequence holds). Not
        # in nano-vllm, which trusts `seq.block_table`; vLLM's managers keep the same record
        # (`req_to_blocks`). With it, a copy of a sequence, or one already freed, is refused
        # instead of driving a ref_count below zero.
        self.block_tables: dict[int, list[int]] = {}
        # `can_allocate`'s walk, kept for the `allocate` that follows it: (sequence, cache
        # version, hit ids). The version moves whenever a cached block or a hash entry changes,
        # so a kept walk is used only while it is still what a new walk would find (nano-vllm
        # walks twice).
        self._cache_version = 0
        self._last_match: tuple[Sequence, int, list[int]] | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @staticmethod
    def compute_hash(token_ids: list[int], prefix: int = -1) -> int:
        return compute_hash(token_ids, prefix)

    # --- internal moves (nano-vllm's)
    def _allocate_block(self) -> int:
        """Take the head of the free queue and hand it to a new owner."""
        block_id = self.free_block_ids.popleft()
        block = self.blocks[block_id]
        if block.ref_count != 0:
            raise InvariantError(
                f"block {block_id} was in the free queue with ref_count {block.ref_count}"
            )
        # The block is about to be overwritten. Drop its cache entry, but only if the entry
        # still points here: a later block with the same content may have taken the entry over.
        if block.hash != -1 and self.hash_to_block_id.get(block.hash) == block_id:
            del self.hash_to_block_id[block.hash]
        block.reset()
        self._cache_version += 1
        self.used_block_ids.add(block_id)
        return block_id

    def _deallocate_block(self, block_id: int) -> None:
        """Return an unreferenced block to the tail; its hash and tokens stay so it can still
        be hit."""
        self.used_block_ids.remove(block_id)
        self.free_block_ids.append(block_id)

    # --- prefix matching (nano-vllm inlines this walk in can_allocate and again in allocate)
    def _block_hashes(self, seq: Sequence, num_blocks: int) -> list[int]:
        """`seq.block_hashes`, extended to cover its first `num_blocks` (full) blocks.

        Each full block of a sequence is hashed once and the chain is kept on the sequence, as
        vLLM keeps block hashes on its Request; nano-vllm rehashes the chain on every walk (in
        `can_allocate`, again in `allocate`, and in `hash_blocks`). Full blocks never change.
        """
        hashes = seq.block_hashes
        if len(hashes) < num_blocks:
            bs, packed = self.block_size, seq.prompt_bytes
            h = hashes[-1] if hashes else -1
            for i in range(len(hashes), num_blocks):
                # a block of the prompt: its bytes are packed already
                if 8 * (i + 1) * bs <= len(packed):
                    h = compute_hash(packed[8 * i * bs : 8 * (i + 1) * bs], h)
                else:
                    h = compute_hash(seq.token_ids[i * bs : (i + 1) * bs], h)
                hashes.append(h)
        return hashes

    def _prefix_hits(self, seq: Sequence, limit: int) -> list[int]:
        """The block ids of the leading blocks (at most `limit`) found in the prefix cache.

        A hash hit counts only if the cached block holds exactly the same tokens (a collision
        must never reuse K/V), and the first miss ends the walk, because later blocks depend on
        K/V that is not cached.
        """
        if not self.enable_prefix_caching or limit <= 0:
            return []
        hashes = self._block_hashes(seq, limit)
        hash_to_block_id, blocks = self.hash_to_block_id, self.blocks
        bs, token_ids = self.block_size, seq.token_ids
        hits: list[int] = []
        for i in range(limit):
            block_id = hash_to_block_id.get(hashes[i], -1)
            if block_id == -1 or blocks[block_id].token_ids != token_ids[i * bs : i * bs + bs]:
                break
            hits.append(block_id)
        return hits

    def _match_prefix(self, seq: Sequence) -> tuple[int, int]:
        """Walk the hash chain: (number of leading cached blocks, free blocks still needed).

        The last block is never looked up: the model must compute at least one token of the
        prompt to get logits for the next token. A hit on a block in use costs no free block;
        a hit on a freed block must be pulled out of the free queue, so it still costs one.
        """
        hits = self._prefix_hits(seq, seq.num_blocks - 1)
        self._last_match = (seq, self._cache_version, hits)
        used = self.used_block_ids
        return len(hits), seq.num_blocks - sum(1 for block_id in hits if block_id in used)

    # --- argument checks (none of these is in nano-vllm, which trusts its one caller)
    def _check_sequence(self, seq: Sequence) -> None:
        """Refuse what is not a Sequence of this block size (each public method tests the
        common case inline and calls this only when it fails)."""
        check_instance("seq", seq, Sequence)
        if seq.block_size != self.block_size:
            raise ValueError(
                f"sequence {seq.seq_id} has block_size {seq.block_size} but this BlockManager "
                f"uses {self.block_size}"
            )

    def _check_holder(self, seq: Sequence) -> None:
        """Refuse a sequence whose block table this manager did not hand out.

        A deep copy of a sequence has its own list, so it is told apart from the sequence
        `allocate` served; a sequence freed before has no record at all. `allocate` records
        every table it fills (`block_tables`, as vLLM's managers keep `req_to_blocks`), so the
        record alone decides. A subclass that writes its own `allocate` records its tables
        there too, or `deallocate` and `may_append` refuse its sequences (nano-vllm keeps no
        record and checks nothing).
        """
        table = seq.block_table
        if not table:
            raise ValueError(
                f"sequence {seq.seq_id} holds no blocks: it was never allocated or is already "
                "freed"
            )
        recorded = self.block_tables.get(seq.seq_id)
        if recorded is not table:
            raise ValueError(
                f"seq: sequence {seq.seq_id} holds blocks {table} that this BlockManager did "
                "not give it "
                "(a copy of a sequence, or one that was already freed? allocate records each "
                "table it fills in block_tables)"
            )

    def _cached_block_ids(self, seq: Sequence, num_cached_blocks: int) -> list[int]:
        """The ids of the first `num_cached_blocks` blocks, checked to be hits.

        nano-vllm trusts `can_allocate`'s count; here a wrong count gets a ValueError before
        anything changes. Right after `can_allocate(seq)` the hits of its walk are taken as
        they are; otherwise the chain is walked again.
        """
        if is_integer(num_cached_blocks) and 0 <= num_cached_blocks < seq.num_blocks:
            match = self._last_match
            if (
                match is not None
                and match[0] is seq
                and match[1] == self._cache_version
                and num_cached_blocks <= len(match[2])
            ):
                return match[2][:num_cached_blocks]
        if is_integer(num_cached_blocks) and num_cached_blocks >= 0:
            hit_block_ids = self._prefix_hits(seq, min(num_cached_blocks, seq.num_blocks - 1))
            if num_cached_blocks == len(hit_block_ids):
                return hit_block_ids
        available_hits, _ = self._match_prefix(seq)  # only to say what would have been right
        raise ValueError(
            f"num_cached_blocks must be an integer from 0 to {available_hits} (the leading "
            "blocks of "
            f"sequence {seq.seq_id} found in the prefix cache; pass can_allocate's result), "
            f"got {num_cached_blocks!r}"
        )

    # --- allocate
    def can_allocate(self, seq: Sequence) -> int:
        """-1 if the sequence does not fit now, else how many leading blocks are prefix-cache
        hits."""
        if type(seq) is not Sequence or seq.block_size != self.block_size:
            self._check_sequence(seq)
        num_cached_blocks, num_new_blocks = self._match_prefix(seq)
        if len(self.free_block_ids) < num_new_blocks:
            return -1
        return num_cached_blocks

    def allocate(self, seq: Sequence, num_cached_blocks: int) -> None:
        """Give the sequence its whole block table: cached hits first, then fresh blocks.

        `num_cached_blocks` is what `can_allocate` returned; it is checked against the cache
        before anything changes.
        """
        if type(seq) is not Sequence or seq.block_size != self.block_size:
            self._check_sequence(seq)
        if seq.block_table or seq.seq_id in self.block_tables:
            raise ValueError(
                f"sequence {seq.seq_id} already has blocks {seq.block_table}; deallocate it "
                "first"
            )
        hit_block_ids = self._cached_block_ids(seq, num_cached_blocks)
        used, blocks, table = self.used_block_ids, self.blocks, seq.block_table
        needed = seq.num_blocks - sum(1 for block_id in hit_block_ids if block_id in used)
        if len(self.free_block_ids) < needed:
            raise ValueError(
                f"sequence {seq.seq_id} needs {needed} free blocks but only "
                f"{len(self.free_block_ids)} are free"
            )
        for block_id in hit_block_ids:
            block = blocks[block_id]
            if block_id in used:
                block.ref_count += 1  # shared with a running sequence
            else:
                block.ref_count = 1  # freed but not yet overwritten: bring it back
                self.free_block_ids.remove(block_id)
                used.add(block_id)
            table.append(block_id)
        for _ in range(len(hit_block_ids), seq.num_blocks):
            table.append(self._allocate_block())
        seq.num_cached_tokens = len(hit_block_ids) * self.block_size
        self.block_tables[seq.seq_id] = table

    # --- free
    def deallocate(self, seq: Sequence) -> None:
        """Drop the sequence's references, last block first; unreferenced blocks go to the
        queue tail."""
        if type(seq) is not Sequence or seq.block_size != self.block_size:
            self._check_sequence(seq)
        self._check_holder(seq)
        table = seq.block_table
        blocks = self.blocks
        # Every id must name a block in use, once: a -1, an id past the pool, a block already
        # free or a block listed twice would drive a ref_count below zero.
        try:
            valid = (
                min(table) >= 0
                and max(table) < len(blocks)
                and len(set(table)) == len(table)
                and all(blocks[b].ref_count >= 1 for b in table)
            )
        except TypeError:  # an id that is not an integer
            valid = False
        if not valid:
            raise ValueError(
                f"seq: the block table of sequence {seq.seq_id}, {table}, must list blocks in "
                "use, each once"
            )
        for block_id in reversed(table):
            block = blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._deallocate_block(block_id)
        self.block_tables.pop(seq.seq_id, None)
        seq.num_cached_tokens = 0
        seq.block_table.clear()

    # --- append (decode)
    def _needs_new_block(self, seq: Sequence) -> bool:
        """True when the newest token is the first token of a new block.

        nano-vllm writes `len(seq) % block_size == 1`; `(len - 1) % block_size == 0` is the
        same test for block_size >= 2 and is also right for block_size 1.
        """
        return (seq.num_tokens - 1) % self.block_size == 0

    def can_append(self, seq: Sequence) -> bool:
        """Is there a free block for this decode step if the sequence crosses into a new
        block?"""
        if type(seq) is not Sequence or seq.block_size != self.block_size:
            self._check_sequence(seq)
        return not self._needs_new_block(seq) or len(self.free_block_ids) > 0

    def may_append(self, seq: Sequence) -> None:
        """Add a block to the table when the token to compute starts a new block."""
        if (
            type(seq) is not Sequence
            or self.block_tables.get(seq.seq_id) is not seq.block_table
        ):
            # Not the table `allocate` filled (whose sequence it checked then): check it all.
            self._check_sequence(seq)
            if not seq.block_table:
                raise ValueError(
                    f"sequence {seq.seq_id} holds no blocks; allocate it before appending"
                )
            self._check_holder(seq)
        if self._needs_new_block(seq):
            if len(seq.block_table) >= seq.num_blocks:
                raise ValueError(
                    f"sequence {seq.seq_id} already has a block for token {len(seq)}"
                )
            if not self.free_block_ids:
                raise ValueError(
                    f"no free block to append to sequence {seq.seq_id}: the pool is full"
                )
            seq.block_table.append(self._allocate_block())

    # --- register (postprocess)
    def hash_blocks(self, seq: Sequence) -> None:
        """Register the blocks that this step's tokens filled, chaining from the previous
        block's hash.

        nano-vllm chains from the hash stored on block start-1; on every path through the
        Scheduler that is the sequence's own chain, so its kept hashes are used. Should a
        caller have left block start-1 registered under another chain, the chain starts from
        what that block stores, as upstream.
        """
        if type(seq) is not Sequence or seq.block_size != self.block_size:
            self._check_sequence(seq)
        cached, computed = (
            seq.num_cached_tokens,
            seq.num_cached_tokens + seq.num_scheduled_tokens,
        )
        if computed < cached or computed > seq.num_tokens:
            raise ValueError(
                f"sequence {seq.seq_id} has num_cached_tokens={cached} and "
                f"num_scheduled_tokens={seq.num_scheduled_tokens}: num_scheduled_tokens must "
                "be >= 0 and "
                f"their sum at most its {seq.num_tokens} tokens"
            )
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        start = cached // bs
        end = computed // bs
        if start == end:
            return
        table = seq.block_table
        if end > len(table):
            raise ValueError(
                f"sequence {seq.seq_id} schedules tokens up to block {end - 1} but holds only "
                f"{len(table)} blocks"
            )
        self._check_holder(seq)
        blocks, token_ids = self.blocks, seq.token_ids
        hashes = self._block_hashes(seq, end)
        h = blocks[table[start - 1]].hash if start > 0 else -1
        own_chain = start == 0 or hashes[start - 1] == h
        for i in range(start, end):
            block = blocks[table[i]]
            block_tokens = token_ids[i * bs : (i + 1) * bs]
            h = hashes[i] if own_chain else compute_hash(block_tokens, h)
            block.update(h, block_tokens)
            # the newest block with this content wins
            self.hash_to_block_id[h] = block.block_id
        self._cache_version += 1

    # --- views
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def __repr__(self) -> str:
        return (
            f"BlockManager(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"free={len(self.free_block_ids)}, used={len(self.used_block_ids)}, "
            f"cached={len(self.hash_to_block_id)})"
        )
