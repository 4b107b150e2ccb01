"""The grader's own copy of the reference code its broken variants edit.

A broken variant (grader.exercises.broken) is one of these classes with one line of one method
changed. They are kept here, in the grader, so that the variants never read or edit the core's
source: rewording a line of refimpl changes nothing here. Each class subclasses the public
reference class (for its constructor and its input checks) and overrides the upstream-named
methods with the grader's copy, so a variant's mistake runs whatever the core calls internally.
tests/test_course_graders.py checks that every copy, unedited, passes every grader: a copy
that drifted from the reference's behaviour fails there, not in a student's grade.
"""

from __future__ import annotations

from refimpl.errors import InvariantError
from refimpl.hybrid.kv_cache_coordinator import HybridKVCacheCoordinator
from refimpl.hybrid.kv_cache_interface import SlidingWindowSpec
from refimpl.hybrid.kv_cache_utils import BlockHash, KVCacheBlock
from refimpl.hybrid.single_type_kv_cache_manager import (
    FullAttentionManager,
    SlidingWindowManager,
)
from refimpl.paged import BlockManager, Scheduler
from refimpl.paged.hashing import compute_hash
from refimpl.paged.sequence import Sequence, SequenceStatus
from refimpl.validation import is_integer


class BlockManagerCopy(BlockManager):
    """BlockManager's allocation, lookup, append and registration, as the grader keeps them."""

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


class SchedulerCopy(Scheduler):
    """Scheduler's schedule, preempt and postprocess, as the grader keeps them."""

    def schedule(self) -> tuple[list[Sequence], bool]:
        """Pick this step's batch: (sequences, is_prefill).

        Sets each scheduled sequence's `num_scheduled_tokens` (the prompt tokens not served by
        the prefix cache, or a chunk of them; 1 for a decode) for the model runner and
        `postprocess`.
        """
        if self.is_finished():
            raise ValueError(
                "nothing to schedule: the waiting and running queues are empty (check "
                "is_finished())"
            )
        scheduled_seqs: list[Sequence] = []
        num_batched_tokens = 0
        self.preempted_last_step = []
        self._contract.take()

        # Prefill: the waiting queue in order, stopping at the first sequence that does not
        # fit.
        while self.waiting and len(scheduled_seqs) < self.max_num_seqs:
            seq = self.waiting[0]
            remaining = self.max_num_batched_tokens - num_batched_tokens
            if remaining == 0:
                break
            # new, or preempted: the cached leading blocks, and room for the rest?
            if not seq.block_table:
                num_cached_blocks = self.block_manager.can_allocate(seq)
                if num_cached_blocks == -1:
                    break
                num_tokens = seq.num_tokens - num_cached_blocks * self.block_size
            else:  # the rest of a prompt that an earlier step cut into a chunk
                num_tokens = seq.num_tokens - seq.num_cached_tokens
            # only the first sequence of a step may be chunked
            if remaining < num_tokens and scheduled_seqs:
                break
            if not seq.block_table:
                self.block_manager.allocate(seq, num_cached_blocks)
            seq.num_scheduled_tokens = min(num_tokens, remaining)
            num_batched_tokens += seq.num_scheduled_tokens
            if seq.num_cached_tokens + seq.num_scheduled_tokens == seq.num_tokens:
                seq.status = SequenceStatus.RUNNING
                self.waiting.popleft()
                self.running.append(seq)
            # else: a partial prefill stays first in `waiting`, holding all its blocks.
            scheduled_seqs.append(seq)
        if scheduled_seqs:
            self._contract.hand_out(scheduled_seqs)
            self._scheduled_is_prefill = True
            return scheduled_seqs, True

        # Decode: one token per running sequence, preempting from the back when blocks run out.
        while self.running and len(scheduled_seqs) < self.max_num_seqs:
            seq = self.running.popleft()
            while not self.block_manager.can_append(seq):
                if self.running:
                    self.preempt(self.running.pop())
                else:
                    # nothing left to take blocks from: wait for recomputation
                    self.preempt(seq)
                    break
            else:
                seq.num_scheduled_tokens = 1
                seq.is_prefill = False
                self.block_manager.may_append(seq)
                scheduled_seqs.append(seq)
        if not scheduled_seqs:
            raise InvariantError(
                "schedule() found nothing to run although sequences are queued"
            )
        self.running.extendleft(reversed(scheduled_seqs))
        self._contract.hand_out(scheduled_seqs)
        self._scheduled_is_prefill = False
        return scheduled_seqs, False

    def preempt(self, seq: Sequence) -> None:
        """Free the sequence's blocks and put it first in line to be prefilled again.

        `schedule` calls it on a running sequence it has already taken out of `running`.
        """
        if not seq.block_table:
            raise ValueError(
                f"sequence {seq.seq_id} holds no blocks, so there is nothing to preempt"
            )
        if seq in self.running:
            raise ValueError(
                f"sequence {seq.seq_id} is still in `running`: schedule() takes a sequence "
                "out before preempting it"
            )
        self.block_manager.deallocate(seq)  # first: it refuses a sequence it did not allocate
        seq.status = SequenceStatus.WAITING
        seq.is_prefill = True
        seq.num_scheduled_tokens = 0
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        self.preempted_last_step.append(seq.seq_id)

    def postprocess(
        self, seqs: list[Sequence], token_ids: list[int], is_prefill: bool
    ) -> list[bool]:
        """Record a step's results; returns, per sequence, whether it finished.

        Blocks filled this step are registered in the prefix cache (`hash_blocks`), then the
        computed tokens count as cached. A sampled token is kept only when the whole prompt has
        been computed (a chunk in the middle of a prompt produces no usable token).
        """
        self._check_step_results(seqs, token_ids, is_prefill)
        self._contract.take()
        finished = []
        for seq, token_id in zip(seqs, token_ids):
            self.block_manager.hash_blocks(seq)
            seq.num_cached_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            if is_prefill and seq.num_cached_tokens < seq.num_tokens:
                finished.append(False)
                continue
            seq.append_token(token_id)
            eos_hit = not seq.ignore_eos and token_id == self.eos
            if eos_hit or seq.num_completion_tokens == seq.max_tokens:
                seq.status = SequenceStatus.FINISHED
                self.block_manager.deallocate(seq)
                self.running.remove(seq)
                self._contract.finished(seq.seq_id)
                finished.append(True)
            else:
                finished.append(False)
        return finished


class SlidingWindowManagerCopy(SlidingWindowManager):
    """SlidingWindowManager's skipped-token rule and freeing, as the grader keeps them."""

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """The next token to compute sits at `num_computed_tokens`; it reads back W - 1
        tokens."""
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def _skipped_blocks(self, request_id: str, total_computed_tokens: int) -> list[int]:
        """Table indices that left the window and are not yet null, last first."""
        table = self.req_to_blocks.get(request_id) or []
        num_skipped = min(
            self.get_num_skipped_tokens(total_computed_tokens) // self.block_size, len(table)
        )
        indices = []
        for i in range(num_skipped - 1, -1, -1):
            if table[i].is_null:
                break
            indices.append(i)
        return indices

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int
    ) -> list[KVCacheBlock]:
        """Free the blocks that left the window and put the null block in their place.

        Walks backwards from the last skipped block and stops at the first null (everything
        before it was freed earlier); frees in that backward order. Returns the freed blocks.
        """
        table = self.req_to_blocks.get(request_id)
        if not table:
            return []
        removed = []
        for i in self._skipped_blocks(request_id, total_computed_tokens):
            removed.append(table[i])
            table[i] = self._null_block
        self.block_pool.free_blocks(removed)
        return removed


class HybridKVCacheCoordinatorCopy(HybridKVCacheCoordinator):
    """HybridKVCacheCoordinator's fixed-point lookup, as the grader keeps it."""

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int, int]:
        """Blocks per group, the hit length in tokens that every group can serve, and how much
        longer the longest single-group hit was (the uncached shared prefix).

        A fixed point: each spec group may shorten the candidate length, and the loop repeats
        until nobody shortens it. Full attention is looked up once (its hits only shrink). An
        eagle spec group looks one block further (`max_length + block_size`) and drops a block,
        at most once per candidate length, so it lands back on the candidate. When some group
        (full attention, say) could serve more than the agreed length, the difference is a
        prefix other requests share that a sliding window has not kept: `get_computed_blocks`
        reports where it ends, and a scheduler that pins it makes this request keep it.
        """
        num_groups = len(self.specs)
        hit_length = max_cache_hit_length
        longest_hit_length = 0
        hits: list[list[KVCacheBlock] | None] = [None] * num_groups
        hit_tokens = [0] * num_groups
        simple_hybrid = len(self.attention_groups) == 2 and not isinstance(
            self.attention_groups[0].kv_cache_spec, SlidingWindowSpec
        )
        eagle_verified: set[int] = set()
        hashed_tokens = len(block_hashes) * self.hash_block_size
        while True:
            candidate = hit_length
            for idx, (spec, group_ids, use_eagle) in enumerate(self.attention_groups):
                first = group_ids[0]
                manager = self.single_type_managers[first]
                full_attention = isinstance(manager, FullAttentionManager)
                if full_attention and hits[first] is not None:
                    candidate = min(candidate, hit_tokens[first])
                    continue
                drop = use_eagle and idx not in eagle_verified
                max_length = (
                    min(candidate + spec.block_size, hashed_tokens) if drop else candidate
                )
                manager_cls = type(manager)
                fine = manager.is_fine_grained and full_attention
                found = manager_cls.find_longest_cache_hit(
                    block_hashes,
                    max_length,
                    group_ids,
                    self.block_pool,
                    spec,
                    hash_block_size=self.hash_block_size,
                    alignment_tokens=self.scheduler_block_size,
                    drop_eagle_block=drop and not fine,
                )
                found_tokens = len(found[0]) * spec.block_size
                if fine and found_tokens < max_length:
                    partial = manager_cls.find_partial_block_hit(
                        block_hashes,
                        len(found[0]),
                        max_length,
                        group_ids,
                        self.block_pool,
                        spec,
                        self.hash_block_size,
                        self.scheduler_block_size,
                    )
                    if partial is not None:
                        for blocks, block in zip(found, partial[0]):
                            blocks.append(block)
                        found_tokens += partial[1]
                    # drop one hash unit, then re-trim the blocks
                    if drop and found_tokens > 0:
                        found_tokens -= min(self.scheduler_block_size, spec.block_size)
                        found_tokens -= found_tokens % self.scheduler_block_size
                        for blocks in found:
                            del blocks[-(-found_tokens // spec.block_size) :]
                if drop:
                    eagle_verified.add(idx)
                elif found_tokens < candidate:
                    eagle_verified.clear()
                candidate = found_tokens
                for gid, blocks in zip(group_ids, found):
                    hits[gid] = blocks
                    hit_tokens[gid] = found_tokens
                longest_hit_length = max(longest_hit_length, candidate)
            if candidate >= hit_length:
                break
            hit_length = candidate
            if simple_hybrid:
                break
        # Full attention may have found more than the agreed length: trim it. Sliding-window
        # hits already end at the agreed length.
        for gid, manager in enumerate(self.single_type_managers):
            if isinstance(manager, FullAttentionManager) and hits[gid] is not None:
                del hits[gid][-(-hit_length // self.specs[gid].block_size) :]
        return (
            tuple(blocks if blocks is not None else [] for blocks in hits),
            hit_length,
            longest_hit_length - hit_length,
        )
