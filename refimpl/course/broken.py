"""Deliberately broken implementations: each is the reference with one classic mistake.

They exist to test the graders: every grader must fail every variant it is relevant to and pass
the reference. Instructors can also hand them out ("find the bug with check_prefix_cache").
"""

from __future__ import annotations

from dataclasses import dataclass

from refimpl.errors import InvariantError
from refimpl.paged import BlockManager, Scheduler, SequenceStatus
from refimpl.paged.hashing import compute_hash


# --- block manager mistakes
class FreeForwardOrder(BlockManager):
    """Frees a sequence's blocks first to last, so shared early blocks are overwritten first."""

    def deallocate(self, seq):
        for block_id in seq.block_table:
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._deallocate_block(block_id)
        seq.num_cached_tokens = 0
        seq.block_table.clear()


class AllocateFromTail(BlockManager):
    """Takes new blocks from the tail of the free queue (LIFO), evicting the freshest cache first."""

    def _allocate_block(self):
        block_id = list(self.free_block_ids)[-1]
        self.free_block_ids.remove(block_id)
        block = self.blocks[block_id]
        if block.hash != -1 and self.hash_to_block_id.get(block.hash) == block_id:
            del self.hash_to_block_id[block.hash]
        block.reset()
        self.used_block_ids.add(block_id)
        return block_id


class AppendOnMultiple(BlockManager):
    """Adds a block when len(seq) % block_size == 0, one token too early."""

    def _needs_new_block(self, seq):
        return len(seq) % self.block_size == 0


class AppendWhenLenModIsOne(BlockManager):
    """Tests nano-vllm's literal `len % block_size == 1`, which is never true for block_size 1."""

    def _needs_new_block(self, seq):
        return len(seq) % self.block_size == 1


class CanAllocateStrict(BlockManager):
    """Refuses a prompt that needs exactly the free blocks left (`>` where `>=` is meant)."""

    def can_allocate(self, seq):
        num_cached_blocks, num_new_blocks = self._match_prefix(seq)
        return num_cached_blocks if len(self.free_block_ids) > num_new_blocks else -1


class CanAppendNeedsAFreeBlock(BlockManager):
    """Refuses any decode while the pool is empty, even one that still has room in its last block."""

    def can_append(self, seq):
        return len(self.free_block_ids) > 0


class FreeIgnoresRefCount(BlockManager):
    """Frees every block of a finished sequence, also the ones another sequence still shares."""

    def deallocate(self, seq):
        for block_id in reversed(seq.block_table):
            self.blocks[block_id].ref_count = 0
            self._deallocate_block(block_id)
        seq.num_cached_tokens = 0
        seq.block_table.clear()


class HitResetsRefCount(BlockManager):
    """Sets ref_count = 1 on every cache hit, also on a block another sequence is using."""

    def allocate(self, seq, num_cached_blocks):
        shared = set(self.used_block_ids)
        super().allocate(seq, num_cached_blocks)
        for block_id in seq.block_table[:num_cached_blocks]:
            if block_id in shared:
                self.blocks[block_id].ref_count = 1


class KeepsReusedBlockEntry(BlockManager):
    """Never deletes the hash entry of a block it hands out again, so the table points at new contents."""

    def _allocate_block(self):
        block_id = self.free_block_ids.popleft()
        self.blocks[block_id].reset()
        self.used_block_ids.add(block_id)
        return block_id


class NoStaleHashGuard(BlockManager):
    """Deletes a reused block's hash entry even when the entry points to another block."""

    def _allocate_block(self):
        block_id = self.free_block_ids.popleft()
        block = self.blocks[block_id]
        if block.hash != -1:
            self.hash_to_block_id.pop(block.hash, None)
        block.reset()
        self.used_block_ids.add(block_id)
        return block_id


def _match(manager, seq, *, last_block: bool, double_check: bool, in_use_free: bool, free_hits_free: bool, stop_at_miss: bool = True):
    """A configurable copy of prefix matching, to inject exactly one mistake at a time."""
    num_new_blocks = seq.num_blocks
    h = -1
    num_cached_blocks = 0
    for i in range(seq.num_blocks if last_block else seq.num_blocks - 1):
        token_ids = seq.block(i)
        h = compute_hash(token_ids, h)
        block_id = manager.hash_to_block_id.get(h, -1)
        if block_id == -1 or (double_check and manager.blocks[block_id].token_ids != token_ids):
            if stop_at_miss:
                break
            continue
        num_cached_blocks += 1
        if free_hits_free or (in_use_free and block_id in manager.used_block_ids):
            num_new_blocks -= 1
    return num_cached_blocks, num_new_blocks


class ConfirmHitByHash(BlockManager):
    """Confirms a hit by comparing the cached block's hash with the looked-up one, not its tokens."""

    def _match_prefix(self, seq):
        num_new_blocks = seq.num_blocks
        h = -1
        num_cached_blocks = 0
        for i in range(seq.num_blocks - 1):
            h = compute_hash(seq.block(i), h)
            block_id = self.hash_to_block_id.get(h, -1)
            if block_id == -1 or self.blocks[block_id].hash != h:  # always equal when the table is right
                break
            num_cached_blocks += 1
            if block_id in self.used_block_ids:
                num_new_blocks -= 1
        return num_cached_blocks, num_new_blocks


class LooksUpLastBlock(BlockManager):
    """Also matches the last block, so a fully cached prompt would leave nothing to compute."""

    def _match_prefix(self, seq):
        return _match(self, seq, last_block=True, double_check=True, in_use_free=True, free_hits_free=False)


class NoTokenDoubleCheck(BlockManager):
    """Trusts a hash hit without comparing tokens: a collision reuses the wrong K/V."""

    def _match_prefix(self, seq):
        return _match(self, seq, last_block=False, double_check=False, in_use_free=True, free_hits_free=False)


class InUseHitsNeedFreeBlocks(BlockManager):
    """Counts a hit on a block in use as needing a free block, so can_allocate refuses too often."""

    def _match_prefix(self, seq):
        return _match(self, seq, last_block=False, double_check=True, in_use_free=False, free_hits_free=False)


class FreeHitsCostNothing(BlockManager):
    """Counts a hit on a freed block as costing nothing, although it leaves the free queue."""

    def _match_prefix(self, seq):
        return _match(self, seq, last_block=False, double_check=True, in_use_free=True, free_hits_free=True)


class KeepMatchingAfterMiss(BlockManager):
    """Skips a missing block and keeps matching, counting later cached blocks as hits."""

    def _match_prefix(self, seq):
        return _match(self, seq, last_block=False, double_check=True, in_use_free=True, free_hits_free=False, stop_at_miss=False)


class HashWithoutChain(BlockManager):
    """Hashes each block on its own, so equal blocks after different prefixes collide."""

    def hash_blocks(self, seq):
        start = seq.num_cached_tokens // self.block_size
        end = (seq.num_cached_tokens + seq.num_scheduled_tokens) // self.block_size
        for i in range(start, end):
            block = self.blocks[seq.block_table[i]]
            token_ids = seq.block(i)
            h = compute_hash(token_ids)
            block.update(h, token_ids)
            self.hash_to_block_id[h] = block.block_id

    def _match_prefix(self, seq):
        num_new_blocks = seq.num_blocks
        num_cached_blocks = 0
        for i in range(seq.num_blocks - 1):
            token_ids = seq.block(i)
            block_id = self.hash_to_block_id.get(compute_hash(token_ids), -1)
            if block_id == -1 or self.blocks[block_id].token_ids != token_ids:
                break
            num_cached_blocks += 1
            if block_id in self.used_block_ids:
                num_new_blocks -= 1
        return num_cached_blocks, num_new_blocks

    def allocate(self, seq, num_cached_blocks):
        # Same as the reference, but looks hits up with the unchained hash.
        for i in range(num_cached_blocks):
            block_id = self.hash_to_block_id[compute_hash(seq.block(i))]
            block = self.blocks[block_id]
            if block_id in self.used_block_ids:
                block.ref_count += 1
            else:
                block.ref_count = 1
                self.free_block_ids.remove(block_id)
                self.used_block_ids.add(block_id)
            seq.block_table.append(block_id)
        for _ in range(num_cached_blocks, seq.num_blocks):
            seq.block_table.append(self._allocate_block())
        seq.num_cached_tokens = num_cached_blocks * self.block_size


class PrefixHashFromTable(BlockManager):
    """Continues the chain from the hash whose table entry points at the previous block (not its own hash).

    Right until another sequence takes that entry over: then no entry points at the block and the
    chain restarts from -1.
    """

    def hash_blocks(self, seq):
        start = seq.num_cached_tokens // self.block_size
        end = (seq.num_cached_tokens + seq.num_scheduled_tokens) // self.block_size
        if start == end:
            return
        h = -1
        if start > 0:
            previous = seq.block_table[start - 1]
            h = next((k for k, v in self.hash_to_block_id.items() if v == previous), -1)
        for i in range(start, end):
            block = self.blocks[seq.block_table[i]]
            token_ids = seq.block(i)
            h = compute_hash(token_ids, h)
            block.update(h, token_ids)
            self.hash_to_block_id[h] = block.block_id


class RegistersPartialBlock(BlockManager):
    """Rounds the end of the step up, registering a block the step left only partly filled."""

    def hash_blocks(self, seq):
        start = seq.num_cached_tokens // self.block_size
        end = min(-(-(seq.num_cached_tokens + seq.num_scheduled_tokens) // self.block_size), len(seq.block_table))
        h = self.blocks[seq.block_table[start - 1]].hash if start > 0 else -1
        for i in range(start, end):
            block = self.blocks[seq.block_table[i]]
            token_ids = seq.block(i)
            h = compute_hash(token_ids, h)
            block.update(h, token_ids)
            self.hash_to_block_id[h] = block.block_id


# --- scheduler mistakes
class _ConfigurableScheduler(Scheduler):
    """A copy of the reference schedule/preempt/postprocess with switches for single mistakes."""

    preempt_first = False
    chunk_any = False
    preempt_to_back = False
    keep_decode_flag = False
    register_after_commit = False
    drop_instead_of_self_preempt = False
    budget_counts_cached = False
    skip_blocked_head = False
    one_more_seq = False
    batch_to_back = False
    keep_chunk_token = False
    eos_despite_ignore = False

    def schedule(self):
        scheduled_seqs = []
        num_batched_tokens = 0
        max_num_seqs = self.max_num_seqs + (1 if self.one_more_seq else 0)
        skipped = 0  # waiting sequences passed over (only with skip_blocked_head)
        while len(self.waiting) > skipped and len(scheduled_seqs) < max_num_seqs:
            seq = self.waiting[skipped]
            remaining = self.max_num_batched_tokens - num_batched_tokens
            if remaining == 0:
                break
            if not seq.block_table:
                num_cached_blocks = self.block_manager.can_allocate(seq)
                if num_cached_blocks == -1:
                    if self.skip_blocked_head:
                        skipped += 1
                        continue
                    break
                num_tokens = seq.num_tokens - (0 if self.budget_counts_cached else num_cached_blocks * self.block_size)
                if remaining < num_tokens and scheduled_seqs and not self.chunk_any:
                    break
                self.block_manager.allocate(seq, num_cached_blocks)
            num_tokens = seq.num_tokens - seq.num_cached_tokens
            if remaining < num_tokens and scheduled_seqs and not self.chunk_any:
                break
            seq.num_scheduled_tokens = min(num_tokens, remaining)
            num_batched_tokens += seq.num_scheduled_tokens
            if seq.num_cached_tokens + seq.num_scheduled_tokens == seq.num_tokens:
                seq.status = SequenceStatus.RUNNING
                del self.waiting[skipped]
                self.running.append(seq)
            scheduled_seqs.append(seq)
        if scheduled_seqs:
            return scheduled_seqs, True
        while self.running and len(scheduled_seqs) < max_num_seqs:
            seq = self.running.popleft()
            while not self.block_manager.can_append(seq):
                if self.running:
                    self.preempt(self.running.popleft() if self.preempt_first else self.running.pop())
                else:
                    if not self.drop_instead_of_self_preempt:
                        self.preempt(seq)
                    break
            else:
                seq.num_scheduled_tokens = 1
                seq.is_prefill = False
                self.block_manager.may_append(seq)
                scheduled_seqs.append(seq)
        if not scheduled_seqs:
            raise InvariantError("schedule() found nothing to run although sequences are queued")
        if self.batch_to_back:
            self.running.extend(scheduled_seqs)
        else:
            self.running.extendleft(reversed(scheduled_seqs))
        return scheduled_seqs, False

    def preempt(self, seq):
        seq.status = SequenceStatus.WAITING
        if not self.keep_decode_flag:
            seq.is_prefill = True
        seq.num_scheduled_tokens = 0
        self.block_manager.deallocate(seq)
        if self.preempt_to_back:
            self.waiting.append(seq)
        else:
            self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def postprocess(self, seqs, token_ids, is_prefill):
        for seq, token_id in zip(seqs, token_ids):
            if self.register_after_commit:
                seq.num_cached_tokens += seq.num_scheduled_tokens
                self.block_manager.hash_blocks(seq)
            else:
                self.block_manager.hash_blocks(seq)
                seq.num_cached_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            if is_prefill and seq.num_cached_tokens < seq.num_tokens and not self.keep_chunk_token:
                continue
            seq.append_token(token_id)
            if ((not seq.ignore_eos or self.eos_despite_ignore) and token_id == self.eos) or seq.num_completion_tokens == seq.max_tokens:
                seq.status = SequenceStatus.FINISHED
                self.block_manager.deallocate(seq)
                self.running.remove(seq)


class PreemptFirstRunning(_ConfigurableScheduler):
    """Preempts the oldest running sequence instead of the newest."""

    preempt_first = True


class ChunkAnyWaiting(_ConfigurableScheduler):
    """Cuts any waiting sequence to the leftover budget, not only the first of the batch."""

    chunk_any = True


class PreemptToBack(_ConfigurableScheduler):
    """Puts a preempted sequence at the back of the waiting queue instead of the front."""

    preempt_to_back = True


class KeepDecodeFlagOnPreempt(_ConfigurableScheduler):
    """Forgets to reset is_prefill when preempting, so the recompute is treated as a decode."""

    keep_decode_flag = True


class DropInsteadOfSelfPreempt(_ConfigurableScheduler):
    """When no other request is left to preempt, skips the request instead of preempting it (it is lost)."""

    drop_instead_of_self_preempt = True


class BudgetCountsCachedTokens(_ConfigurableScheduler):
    """Checks a new request's whole prompt against the token budget, cached blocks included."""

    budget_counts_cached = True


class SkipBlockedWaitingHead(_ConfigurableScheduler):
    """Passes over a waiting request that does not fit and prefills a later one that does."""

    skip_blocked_head = True


class OneSeqTooMany(_ConfigurableScheduler):
    """Lets a batch hold max_num_seqs + 1 sequences (`<=` where `<` is meant)."""

    one_more_seq = True


class BatchToBackOfRunning(_ConfigurableScheduler):
    """Puts the decode batch back at the end of running, so the requests left out of it run first next."""

    batch_to_back = True


class KeepTokenAfterChunk(_ConfigurableScheduler):
    """Appends the token sampled after a prefill chunk that did not reach the end of the prompt."""

    keep_chunk_token = True


class EosDespiteIgnoreEos(_ConfigurableScheduler):
    """Finishes a request on eos even when its sampling params say ignore_eos."""

    eos_despite_ignore = True


class RegisterAfterCommit(_ConfigurableScheduler):
    """Advances num_cached_tokens before hash_blocks, so filled blocks are never registered."""

    register_after_commit = True


# --- Part II mistakes
def approximate_gcd_smaller_wins_ties(values, lower_bound=None):
    """Keeps the first d with the least padding, so ties go to the smaller d."""
    lo, hi = max(1, lower_bound or 1), max(values)
    if lo > hi:
        return lo
    pads = {d: sum((d - x % d) % d for x in values) for d in range(lo, hi + 1)}
    return min(pads, key=lambda d: (pads[d], d))


def approximate_gcd_ignores_lower_bound(values, lower_bound=None):
    """Searches from d = 1 whatever the lower bound, so DeepSeek V4's MLA group could be split."""
    from refimpl.hybrid.kv_cache_planning import approximate_gcd

    return approximate_gcd(values, None)


def approximate_gcd_exclusive_max(values, lower_bound=None):
    """Stops the search one short of max(values)."""
    lo, hi = max(1, lower_bound or 1), max(values)
    if lo >= hi:
        return lo
    pads = {d: sum((d - x % d) % d for x in values) for d in range(lo, hi)}
    return max(pads, key=lambda d: (-pads[d], d))


def approximate_gcd_accepts_non_ints(values, lower_bound=None):
    """Checks only `x <= 0`, so True, 2.5 or a non-int lower bound are taken as numbers."""
    values = list(values)
    if not values or any(x <= 0 for x in values):
        raise ValueError(f"approximate_gcd needs positive values, got {values}")
    lo, hi = max(1, lower_bound or 1), max(values)
    if lo > hi:
        return lo
    pads = {d: sum((d - x % d) % d for x in values) for d in range(int(lo), int(hi) + 1)}
    return max(pads, key=lambda d: (-pads[d], d))


def approximate_gcd_dedupes_values(values, lower_bound=None):
    """Counts the padding once per distinct value, so repeated values weigh no more than one."""
    from refimpl.hybrid.kv_cache_planning import approximate_gcd

    values = list(values)
    return approximate_gcd(sorted(set(values)) if values else values, lower_bound)


def approximate_gcd_clamps_to_max(values, lower_bound=None):
    """Returns max(values) when the lower bound is above it, instead of the lower bound."""
    from refimpl.hybrid.kv_cache_planning import approximate_gcd

    result = approximate_gcd(values, lower_bound)
    return min(result, max(values))


def approximate_gcd_trusts_lower_bound(values, lower_bound=None):
    """Starts the search at the lower bound as given (`lower_bound if lower_bound is not None else 1`), so 0 tries d = 0."""
    values = list(values)
    if not values or any(isinstance(x, bool) or not isinstance(x, int) or x <= 0 for x in values):
        raise ValueError(f"approximate_gcd needs positive ints, got {values}")
    lo, hi = (lower_bound if lower_bound is not None else 1), max(values)
    if lo > hi:
        return lo
    best_d, best_pad = lo, None
    for d in range(lo, hi + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad <= best_pad:
            best_d, best_pad = d, pad
    return best_d


def packed_layout_stride_is_sum(groups):
    """Adds the group widths for the stride, as if groups did not overlay each other."""
    from refimpl.hybrid.older_planners import get_packed_kv_cache_layout

    _, layers_by_offset = get_packed_kv_cache_layout(groups)
    return sum(sum(g.page_size_of(n) for n in g.layer_names) for g in groups), layers_by_offset


def packed_layout_no_overlay(groups):
    """Keeps counting offsets across groups instead of restarting each group at byte 0."""
    layers_by_offset, offset = {}, 0
    for group in groups:
        for name in group.layer_names:
            layers_by_offset.setdefault(offset, []).append(name)
            offset += group.page_size_of(name)
    return offset, layers_by_offset


def packed_layout_real_pages(groups):
    """Packs layers by their unpadded page size, so alignment padding is lost."""
    layers_by_offset, stride = {}, 0
    for group in groups:
        offset = 0
        for name in group.layer_names:
            layers_by_offset.setdefault(offset, []).append(name)
            offset += group.layer_spec(name).real_page_size_bytes
        stride = max(stride, offset)
    return stride, layers_by_offset


def packed_layout_empty_is_zero(groups):
    """Returns (0, {}) for no groups instead of raising: a slab with 0-byte blocks."""
    from refimpl.hybrid.older_planners import get_packed_kv_cache_layout

    return (0, {}) if not list(groups) else get_packed_kv_cache_layout(groups)


def packed_layout_sorted_names(groups):
    """Lays each group's layers out in sorted name order, not in the group's order."""
    layers_by_offset, stride = {}, 0
    for group in groups:
        offset = 0
        for name in sorted(group.layer_names):
            layers_by_offset.setdefault(offset, []).append(name)
            offset += group.page_size_of(name)
        stride = max(stride, offset)
    return stride, layers_by_offset


def packed_layout_last_layer_wins(groups):
    """Stores one layer per offset, so the overlaid layers of earlier groups are lost."""
    layers_by_offset, stride = {}, 0
    for group in groups:
        offset = 0
        for name in group.layer_names:
            layers_by_offset[offset] = [name]
            offset += group.page_size_of(name)
        stride = max(stride, offset)
    return stride, layers_by_offset


# --- the catalogue
@dataclass(frozen=True)
class BrokenVariant:
    """A broken implementation and the graders that must catch it."""

    name: str
    implementation: object  # a class (Part I) or a function (Part II)
    graders: tuple[str, ...]

    @property
    def mistake(self) -> str:
        return (self.implementation.__doc__ or "").strip().splitlines()[0]


BLOCK_MANAGER_GRADERS = ("check_block_manager", "check_prefix_cache")
PREFIX_GRADERS = ("check_prefix_cache",)
SCHEDULER_GRADERS = ("check_scheduler",)

PAGED_BROKEN_VARIANTS: list[BrokenVariant] = [
    BrokenVariant("free_in_forward_order", FreeForwardOrder, BLOCK_MANAGER_GRADERS),
    BrokenVariant("allocate_from_tail", AllocateFromTail, BLOCK_MANAGER_GRADERS),
    BrokenVariant("append_on_len_mod_0", AppendOnMultiple, BLOCK_MANAGER_GRADERS),
    BrokenVariant("append_on_len_mod_1", AppendWhenLenModIsOne, BLOCK_MANAGER_GRADERS),
    BrokenVariant("can_allocate_strict", CanAllocateStrict, BLOCK_MANAGER_GRADERS),
    BrokenVariant("can_append_needs_a_free_block", CanAppendNeedsAFreeBlock, BLOCK_MANAGER_GRADERS),
    BrokenVariant("free_ignores_ref_count", FreeIgnoresRefCount, PREFIX_GRADERS),
    BrokenVariant("hit_resets_ref_count", HitResetsRefCount, PREFIX_GRADERS),
    BrokenVariant("keeps_reused_block_entry", KeepsReusedBlockEntry, PREFIX_GRADERS),
    BrokenVariant("confirm_hit_by_hash", ConfirmHitByHash, PREFIX_GRADERS),
    BrokenVariant("prefix_hash_from_table", PrefixHashFromTable, PREFIX_GRADERS),
    BrokenVariant("registers_partial_block", RegistersPartialBlock, PREFIX_GRADERS),
    BrokenVariant("no_stale_hash_guard", NoStaleHashGuard, PREFIX_GRADERS),
    BrokenVariant("look_up_last_block", LooksUpLastBlock, PREFIX_GRADERS),
    BrokenVariant("skip_token_double_check", NoTokenDoubleCheck, PREFIX_GRADERS),
    BrokenVariant("in_use_hits_need_free_blocks", InUseHitsNeedFreeBlocks, PREFIX_GRADERS),
    BrokenVariant("free_hits_cost_nothing", FreeHitsCostNothing, PREFIX_GRADERS),
    BrokenVariant("keep_matching_after_miss", KeepMatchingAfterMiss, PREFIX_GRADERS),
    BrokenVariant("hash_without_chain", HashWithoutChain, PREFIX_GRADERS),
    BrokenVariant("preempt_first_running", PreemptFirstRunning, SCHEDULER_GRADERS),
    BrokenVariant("chunk_any_waiting", ChunkAnyWaiting, SCHEDULER_GRADERS),
    BrokenVariant("preempt_to_back", PreemptToBack, SCHEDULER_GRADERS),
    BrokenVariant("keep_decode_flag_on_preempt", KeepDecodeFlagOnPreempt, SCHEDULER_GRADERS),
    BrokenVariant("register_after_commit", RegisterAfterCommit, SCHEDULER_GRADERS),
    BrokenVariant("drop_instead_of_self_preempt", DropInsteadOfSelfPreempt, SCHEDULER_GRADERS),
    BrokenVariant("budget_counts_cached_tokens", BudgetCountsCachedTokens, SCHEDULER_GRADERS),
    BrokenVariant("skip_blocked_waiting_head", SkipBlockedWaitingHead, SCHEDULER_GRADERS),
    BrokenVariant("one_seq_too_many", OneSeqTooMany, SCHEDULER_GRADERS),
    BrokenVariant("batch_to_back_of_running", BatchToBackOfRunning, SCHEDULER_GRADERS),
    BrokenVariant("keep_token_after_chunk", KeepTokenAfterChunk, SCHEDULER_GRADERS),
    BrokenVariant("eos_despite_ignore_eos", EosDespiteIgnoreEos, SCHEDULER_GRADERS),
]

HYBRID_BROKEN_VARIANTS: list[BrokenVariant] = [
    BrokenVariant("gcd_smaller_wins_ties", approximate_gcd_smaller_wins_ties, ("check_approximate_gcd",)),
    BrokenVariant("gcd_ignores_lower_bound", approximate_gcd_ignores_lower_bound, ("check_approximate_gcd",)),
    BrokenVariant("gcd_exclusive_max", approximate_gcd_exclusive_max, ("check_approximate_gcd",)),
    BrokenVariant("gcd_accepts_non_ints", approximate_gcd_accepts_non_ints, ("check_approximate_gcd",)),
    BrokenVariant("gcd_dedupes_values", approximate_gcd_dedupes_values, ("check_approximate_gcd",)),
    BrokenVariant("gcd_clamps_to_max", approximate_gcd_clamps_to_max, ("check_approximate_gcd",)),
    BrokenVariant("gcd_trusts_lower_bound", approximate_gcd_trusts_lower_bound, ("check_approximate_gcd",)),
    BrokenVariant("layout_stride_is_sum", packed_layout_stride_is_sum, ("check_packed_layout",)),
    BrokenVariant("layout_no_overlay", packed_layout_no_overlay, ("check_packed_layout",)),
    BrokenVariant("layout_real_pages", packed_layout_real_pages, ("check_packed_layout",)),
    BrokenVariant("layout_empty_is_zero", packed_layout_empty_is_zero, ("check_packed_layout",)),
    BrokenVariant("layout_sorted_names", packed_layout_sorted_names, ("check_packed_layout",)),
    BrokenVariant("layout_last_layer_wins", packed_layout_last_layer_wins, ("check_packed_layout",)),
]

BROKEN_VARIANTS: list[BrokenVariant] = PAGED_BROKEN_VARIANTS + HYBRID_BROKEN_VARIANTS
