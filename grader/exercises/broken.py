"""Deliberately broken implementations: each is the reference with one classic mistake.

They exist to test the graders: every grader must fail every variant it is relevant to and pass
the reference. Instructors can also hand them out ("find the bug with check_prefix_cache").

A variant is one of the grader's own copies of the reference
(grader.exercises.reference_copies) with one small hook overridden (`_needs_new_block`, the
Scheduler's `__init__`), or one of its methods recompiled with one line of its source edited
(`edited`): the edit, shown next to the copy's line, is the whole mistake. The copies live in
the grader, so rewording a line of the core never breaks a variant; that each copy still
behaves as the reference is tested.
"""

from __future__ import annotations
import __future__

import functools
import inspect
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from grader.exercises.reference_copies import (
    BlockManagerCopy,
    HybridKVCacheCoordinatorCopy,
    SchedulerCopy,
    SlidingWindowManagerCopy,
)


# --- one edited line
def edited(function: Callable, *edits: tuple[str, str]) -> Callable:
    """`function` recompiled from its own source with each `(line, replacement)` edit applied.

    `line` is the code of one line of the source (stripped, without its trailing comment) and
    must match exactly one line; the replacement keeps that line's indentation and may hold
    several lines. The new function runs in the reference module's namespace, so it sees the
    same names.
    """
    lines = textwrap.dedent(inspect.getsource(function)).splitlines()
    for old, new in edits:
        matches = [i for i, line in enumerate(lines) if line.split("  # ")[0].strip() == old]
        if len(matches) != 1:
            raise ValueError(
                f"{function.__qualname__} has {len(matches)} lines {old!r}; an edit needs "
                "exactly one"
            )
        i = matches[0]
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        lines[i : i + 1] = [indent + part for part in new.splitlines()]
    namespace: dict = {}
    code = compile(
        "\n".join(lines) + "\n",
        f"<{function.__qualname__}, edited>",
        "exec",
        flags=__future__.annotations.compiler_flag,
        dont_inherit=True,
    )
    exec(code, dict(vars(sys.modules[function.__module__])), namespace)
    new_function = namespace[function.__name__]
    new_function.__qualname__ = function.__qualname__
    return new_function


# --- block manager mistakes
class FreeForwardOrder(BlockManagerCopy):
    """Frees a sequence's blocks first to last, so shared early blocks are overwritten
    first."""

    deallocate = edited(
        BlockManagerCopy.deallocate,
        ("for block_id in reversed(table):", "for block_id in table:"),
    )


class AllocateFromTail(BlockManagerCopy):
    """Takes new blocks from the tail of the free queue (LIFO), evicting the freshest cache
    first."""

    _allocate_block = edited(
        BlockManagerCopy._allocate_block,
        (
            "block_id = self.free_block_ids.popleft()",
            "block_id = list(self.free_block_ids)[-1]\nself.free_block_ids.remove(block_id)",
        ),
    )


class AppendOnMultiple(BlockManagerCopy):
    """Adds a block when len(seq) % block_size == 0, one token too early."""

    def _needs_new_block(self, seq):
        return len(seq) % self.block_size == 0


class AppendWhenLenModIsOne(BlockManagerCopy):
    """Tests nano-vllm's literal `len % block_size == 1`, which is never true for block_size
    1."""

    def _needs_new_block(self, seq):
        return len(seq) % self.block_size == 1


class CanAllocateStrict(BlockManagerCopy):
    """Refuses a prompt that needs exactly the free blocks left (`>` where `>=` is meant)."""

    can_allocate = edited(
        BlockManagerCopy.can_allocate,
        (
            "if len(self.free_block_ids) < num_new_blocks:",
            "if len(self.free_block_ids) <= num_new_blocks:",
        ),
    )


class CanAppendNeedsAFreeBlock(BlockManagerCopy):
    """Refuses any decode while the pool is empty, even one that still has room in its last
    block."""

    can_append = edited(
        BlockManagerCopy.can_append,
        (
            "return not self._needs_new_block(seq) or len(self.free_block_ids) > 0",
            "return len(self.free_block_ids) > 0",
        ),
    )


class FreeIgnoresRefCount(BlockManagerCopy):
    """Frees every block of a finished sequence, also the ones another sequence still
    shares."""

    deallocate = edited(
        BlockManagerCopy.deallocate, ("block.ref_count -= 1", "block.ref_count = 0")
    )


class HitResetsRefCount(BlockManagerCopy):
    """Sets ref_count = 1 on every cache hit, also on a block another sequence is using."""

    allocate = edited(
        BlockManagerCopy.allocate, ("block.ref_count += 1", "block.ref_count = 1")
    )


_REUSED_ENTRY_GUARD = (
    "if block.hash != -1 and self.hash_to_block_id.get(block.hash) == block_id:"
)


class KeepsReusedBlockEntry(BlockManagerCopy):
    """Never deletes the hash entry of a block it hands out again, so the table points at new
    contents."""

    _allocate_block = edited(
        BlockManagerCopy._allocate_block, (_REUSED_ENTRY_GUARD, "if False:")
    )


class NoStaleHashGuard(BlockManagerCopy):
    """Deletes a reused block's hash entry even when the entry points to another block."""

    _allocate_block = edited(
        BlockManagerCopy._allocate_block,
        (_REUSED_ENTRY_GUARD, "if block.hash != -1 and block.hash in self.hash_to_block_id:"),
    )


_HIT_TEST = (
    "if block_id == -1 or blocks[block_id].token_ids != token_ids[i * bs : i * bs + bs]:"
)


class ConfirmHitByHash(BlockManagerCopy):
    """Confirms a hit by comparing the cached block's hash with the looked-up one, not its
    tokens."""

    # always equal when the table is right, so a real collision passes
    _prefix_hits = edited(
        BlockManagerCopy._prefix_hits,
        (_HIT_TEST, "if block_id == -1 or blocks[block_id].hash != hashes[i]:"),
    )


class NoTokenDoubleCheck(BlockManagerCopy):
    """Trusts a hash hit without comparing tokens: a collision reuses the wrong K/V."""

    _prefix_hits = edited(BlockManagerCopy._prefix_hits, (_HIT_TEST, "if block_id == -1:"))


class KeepMatchingAfterMiss(BlockManagerCopy):
    """Skips a missing block and keeps matching, counting later cached blocks as hits."""

    _prefix_hits = edited(BlockManagerCopy._prefix_hits, ("break", "continue"))


class LooksUpLastBlock(BlockManagerCopy):
    """Also matches the last block, so a fully cached prompt would leave nothing to compute."""

    _match_prefix = edited(
        BlockManagerCopy._match_prefix,
        (
            "hits = self._prefix_hits(seq, seq.num_blocks - 1)",
            "hits = self._prefix_hits(seq, seq.num_blocks)",
        ),
    )


_MATCH_RESULT = (
    "return len(hits), seq.num_blocks - sum(1 for block_id in hits if block_id in used)"
)


class InUseHitsNeedFreeBlocks(BlockManagerCopy):
    """Counts a hit on a block in use as needing a free block, so can_allocate refuses too
    often."""

    _match_prefix = edited(
        BlockManagerCopy._match_prefix, (_MATCH_RESULT, "return len(hits), seq.num_blocks")
    )


class FreeHitsCostNothing(BlockManagerCopy):
    """Counts a hit on a freed block as costing nothing, although it leaves the free queue."""

    _match_prefix = edited(
        BlockManagerCopy._match_prefix,
        (_MATCH_RESULT, "return len(hits), seq.num_blocks - len(hits)"),
    )


class HashWithoutChain(BlockManagerCopy):
    """Hashes each block on its own, so equal blocks after different prefixes collide."""

    _block_hashes = edited(
        BlockManagerCopy._block_hashes,
        (
            "h = compute_hash(packed[8 * i * bs : 8 * (i + 1) * bs], h)",
            "h = compute_hash(packed[8 * i * bs : 8 * (i + 1) * bs])",
        ),
        (
            "h = compute_hash(seq.token_ids[i * bs : (i + 1) * bs], h)",
            "h = compute_hash(seq.token_ids[i * bs : (i + 1) * bs])",
        ),
    )


class PrefixHashFromTable(BlockManagerCopy):
    """Continues the chain from the hash whose table entry points at the previous block (not
    its own hash).

    Right until another sequence takes that entry over: then no entry points at the block and
    the chain restarts from -1.
    """

    hash_blocks = edited(
        BlockManagerCopy.hash_blocks,
        (
            "h = blocks[table[start - 1]].hash if start > 0 else -1",
            "h = next((k for k, v in self.hash_to_block_id.items() if v == table[start - 1]), "
            "-1) if start > 0 else -1",
        ),
    )


class RegistersPartialBlock(BlockManagerCopy):
    """Rounds the end of the step up, registering a block the step left only partly filled."""

    hash_blocks = edited(
        BlockManagerCopy.hash_blocks,
        (
            "end = computed // bs",
            "end = min(-(-computed // bs), len(seq.block_table))",
        ),
    )


# --- scheduler mistakes
_CHUNK_RULE = "if remaining < num_tokens and scheduled_seqs:"


class PreemptFirstRunning(SchedulerCopy):
    """Preempts the oldest running sequence instead of the newest."""

    schedule = edited(
        SchedulerCopy.schedule,
        ("self.preempt(self.running.pop())", "self.preempt(self.running.popleft())"),
    )


class ChunkAnyWaiting(SchedulerCopy):
    """Cuts any waiting sequence to the leftover budget, not only the first of the batch."""

    schedule = edited(SchedulerCopy.schedule, (_CHUNK_RULE, "if False:"))


class BudgetCountsCachedTokens(SchedulerCopy):
    """Checks a new request's whole prompt against the token budget, cached blocks included."""

    schedule = edited(
        SchedulerCopy.schedule,
        (_CHUNK_RULE, "if remaining < seq.num_tokens and scheduled_seqs:"),
    )


class SkipBlockedWaitingHead(SchedulerCopy):
    """Passes over a waiting request that does not fit and prefills a later one that does."""

    schedule = edited(
        SchedulerCopy.schedule,
        (
            "num_batched_tokens = 0",
            "num_batched_tokens = 0\nskipped = 0  # waiting requests passed over",
        ),
        (
            "while self.waiting and len(scheduled_seqs) < self.max_num_seqs:",
            "while len(self.waiting) > skipped and len(scheduled_seqs) < self.max_num_seqs:",
        ),
        ("seq = self.waiting[0]", "seq = self.waiting[skipped]"),
        (
            "if num_cached_blocks == -1:",
            "if num_cached_blocks == -1:\n    skipped += 1\n    continue",
        ),
        ("self.waiting.popleft()", "del self.waiting[skipped]"),
    )


class DropInsteadOfSelfPreempt(SchedulerCopy):
    """When no other request is left to preempt, skips the request instead of preempting it (it
    is lost)."""

    schedule = edited(SchedulerCopy.schedule, ("self.preempt(seq)", "pass"))


class OneSeqTooMany(SchedulerCopy):
    """Lets a batch hold max_num_seqs + 1 sequences (`<=` where `<` is meant)."""

    def __init__(self, config):
        super().__init__(config)
        self.max_num_seqs += 1


class BatchToBackOfRunning(SchedulerCopy):
    """Puts the decode batch back at the end of running, so the requests left out of it run
    first next."""

    schedule = edited(
        SchedulerCopy.schedule,
        (
            "self.running.extendleft(reversed(scheduled_seqs))",
            "self.running.extend(scheduled_seqs)",
        ),
    )


class PreemptToBack(SchedulerCopy):
    """Puts a preempted sequence at the back of the waiting queue instead of the front."""

    preempt = edited(
        SchedulerCopy.preempt, ("self.waiting.appendleft(seq)", "self.waiting.append(seq)")
    )


class KeepDecodeFlagOnPreempt(SchedulerCopy):
    """Forgets to reset is_prefill when preempting, so the recompute is treated as a decode."""

    preempt = edited(SchedulerCopy.preempt, ("seq.is_prefill = True", "pass"))


class KeepTokenAfterChunk(SchedulerCopy):
    """Appends the token sampled after a prefill chunk that did not reach the end of the
    prompt."""

    postprocess = edited(
        SchedulerCopy.postprocess,
        ("if is_prefill and seq.num_cached_tokens < seq.num_tokens:", "if False:"),
    )


class EosDespiteIgnoreEos(SchedulerCopy):
    """Finishes a request on eos even when its sampling params say ignore_eos."""

    postprocess = edited(
        SchedulerCopy.postprocess,
        (
            "eos_hit = not seq.ignore_eos and token_id == self.eos",
            "eos_hit = token_id == self.eos",
        ),
    )


class RegisterAfterCommit(SchedulerCopy):
    """Advances num_cached_tokens before hash_blocks, so filled blocks are never registered."""

    postprocess = edited(
        SchedulerCopy.postprocess,
        ("self.block_manager.hash_blocks(seq)", "pass"),
        (
            "seq.num_scheduled_tokens = 0",
            "seq.num_scheduled_tokens = 0\nself.block_manager.hash_blocks(seq)",
        ),
    )


# --- Part II mistakes
def approximate_gcd_smaller_wins_ties(values, lower_bound=None):
    """Keeps the first d with the least padding, so ties go to the smaller d."""
    lo, hi = max(1, lower_bound or 1), max(values)
    if lo > hi:
        return lo
    pads = {d: sum((d - x % d) % d for x in values) for d in range(lo, hi + 1)}
    return min(pads, key=lambda d: (pads[d], d))


def approximate_gcd_ignores_lower_bound(values, lower_bound=None):  # noqa: ARG001 (the bug)
    """Searches from d = 1 whatever the lower bound, so DeepSeek V4's MLA group could be
    split."""
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
    """Counts the padding once per distinct value, so repeated values weigh no more than
    one."""
    from refimpl.hybrid.kv_cache_planning import approximate_gcd

    values = list(values)
    return approximate_gcd(sorted(set(values)) if values else values, lower_bound)


def approximate_gcd_clamps_to_max(values, lower_bound=None):
    """Returns max(values) when the lower bound is above it, instead of the lower bound."""
    from refimpl.hybrid.kv_cache_planning import approximate_gcd

    result = approximate_gcd(values, lower_bound)
    return min(result, max(values))


def approximate_gcd_trusts_lower_bound(values, lower_bound=None):
    """Starts the search at the lower bound as given (`lower_bound if lower_bound is not None
    else 1`), so 0 tries d = 0."""
    values = list(values)
    if not values or any(
        isinstance(x, bool) or not isinstance(x, int) or x <= 0 for x in values
    ):
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


def _packed_groups(
    specs,
    *,
    mla_first=False,
    lower_bound=True,
    floor_split=False,
    contiguous=False,
    split_unbalanced=False,
    none_for_one_size=True,
    state_split=True,
):
    """vLLM's DeepSeek V4 grouping with one switch per classic mistake (all off: the
    reference)."""
    from refimpl.hybrid.kv_cache_interface import (
        KVCacheGroupSpec,
        SlidingWindowSpec,
        UniformTypeKVCacheSpecs,
        cdiv,
    )
    from refimpl.hybrid.kv_cache_planning import approximate_gcd

    if none_for_one_size and len({s.page_size_bytes for s in specs.values()}) <= 1:
        return None
    buckets = []
    for name, spec in specs.items():
        for bucket in buckets:
            if UniformTypeKVCacheSpecs.is_uniform_type({**bucket, name: spec}):
                bucket[name] = spec
                break
        else:
            buckets.append({name: spec})
    if mla_first:  # full attention first, as the article's planner orders them
        buckets.sort(key=lambda b: isinstance(next(iter(b.values())), SlidingWindowSpec))
    bucketed = []
    for bucket in buckets:
        merged = UniformTypeKVCacheSpecs.from_specs(bucket)
        by_page = {}
        for name, spec in bucket.items():
            by_page.setdefault(spec.page_size_bytes, []).append(name)
        balanced = split_unbalanced or len({len(v) for v in by_page.values()}) == 1
        bucketed.append((merged, by_page, balanced))
    mixed = [
        m.get_num_layer_tuples() for m, by_page, ok in bucketed if ok and len(by_page) > 1
    ]
    min_repeats = max(mixed, default=0)
    repeats = None
    if min_repeats:
        values = [m.get_num_layer_tuples() for m, _, ok in bucketed if ok]
        repeats = approximate_gcd(values, min_repeats if lower_bound else None)

    def count(merged, ok):
        if not ok or repeats is None:
            return 1
        tuples = merged.get_num_layer_tuples()
        return max(tuples // repeats, 1) if floor_split else cdiv(tuples, repeats)

    def is_state(merged):
        return (
            state_split
            and repeats is None
            and isinstance(merged.first_spec, SlidingWindowSpec)
        )

    def width(by_page, n):
        return sum(cdiv(len(names), n) * page for page, names in by_page.items())

    anchor = max(
        width(by_page, len(m.kv_cache_specs) if is_state(m) else count(m, ok))
        for m, by_page, ok in bucketed
    )
    groups = []
    for merged, by_page, ok in bucketed:
        n = count(merged, ok)
        if anchor and is_state(merged):
            per_block = max(anchor // merged.first_spec.page_size_bytes, 1)
            n = max(n, cdiv(len(merged.kv_cache_specs), per_block))
        if n == 1:
            groups.append(KVCacheGroupSpec(list(merged.kv_cache_specs), merged))
            continue
        tuples = list(zip(*by_page.values()))
        if contiguous:
            size = cdiv(len(tuples), n)
            parts = [tuples[i * size : (i + 1) * size] for i in range(n)]
        else:
            parts = [tuples[i::n] for i in range(n)]
        for part in parts:
            names = [name for repeat in part for name in repeat]
            if not names:
                continue
            members = {name: merged.kv_cache_specs[name] for name in names}
            groups.append(KVCacheGroupSpec(names, UniformTypeKVCacheSpecs.from_specs(members)))
    return groups


def packed_groups_mla_first(specs):
    """Puts the full-attention (MLA) bucket first, as the article's planner does, instead of
    keeping the buckets in the order their first layer registered."""
    return _packed_groups(specs, mla_first=True)


def packed_groups_no_lower_bound(specs):
    """Calls approximate_gcd without the lower bound, so the mixed bucket is cut apart."""
    return _packed_groups(specs, lower_bound=False)


def packed_groups_floor_split(specs):
    """Splits a bucket into tuples // d groups instead of cdiv(tuples, d)."""
    return _packed_groups(specs, floor_split=True)


def packed_groups_contiguous(specs):
    """Gives each group a contiguous run of layer tuples instead of every n-th one."""
    return _packed_groups(specs, contiguous=True)


def packed_groups_split_unbalanced(specs):
    """Treats every bucket as balanced, so an unbalanced bucket counts toward the gcd and its
    lower bound."""
    return _packed_groups(specs, split_unbalanced=True)


def packed_groups_for_one_page_size(specs):
    """Plans packed groups even when every page has one size, instead of returning None."""
    return _packed_groups(specs, none_for_one_size=False)


def packed_groups_no_state_split(specs):
    """Never splits sliding-window buckets to fit the widest block when no mixed balanced
    bucket sets the repeats."""
    return _packed_groups(specs, state_split=False)


def _kv_cache_config(
    groups,
    available_memory,
    num_blocks_override=None,
    *,
    stride_is_sum=False,
    no_overlay=False,
    real_pages=False,
    group_order=False,
    ignore_alignment=False,
    ignore_override=False,
    zero_blocks=False,
    empty_is_zero=False,
):
    """vLLM's packed layout with one switch per classic mistake (all off: the reference)."""
    import math

    from refimpl.hybrid.kv_cache_interface import KVCacheConfig, KVCacheTensor, round_up

    groups = list(groups)
    if not groups:
        if empty_is_zero:
            return KVCacheConfig(0, [], [])
        raise ValueError("no groups to lay out")

    def page(group, name):
        spec = group.layer_spec(name)
        return spec.real_page_size_bytes if real_pages else spec.page_size_bytes

    widths = [sum(page(g, n) for n in g.layer_names) for g in groups]
    stride = sum(widths) if stride_is_sum else max(widths)
    if not ignore_alignment:
        alignments = [
            g.layer_spec(n).block_stride_alignment() for g in groups for n in g.layer_names
        ]
        stride = round_up(stride, math.lcm(*alignments))
    if num_blocks_override is not None and not ignore_override:
        num_blocks = num_blocks_override
    else:
        num_blocks = available_memory // stride
        if num_blocks < 1 and not zero_blocks:
            raise ValueError("the budget is smaller than one block")
    tensors, offset = [], 0
    for group in groups:
        runs = {}
        for name in group.layer_names:
            key = name if group_order else group.layer_spec(name)
            runs.setdefault(key, []).append(name)
        if not no_overlay:
            offset = 0
        for names in runs.values():
            size = page(group, names[0])
            tensors.append(
                KVCacheTensor(
                    size=stride * num_blocks,
                    shared_by=tuple(names),
                    offset=offset,
                    block_stride=stride,
                    layer_stride=size,
                )
            )
            offset += len(names) * size
    return KVCacheConfig(num_blocks, tensors, groups)


def packed_layout_stride_is_sum(groups, available_memory, num_blocks_override=None):
    """Adds the group widths for the stride, as if groups did not overlay each other."""
    return _kv_cache_config(groups, available_memory, num_blocks_override, stride_is_sum=True)


def packed_layout_no_overlay(groups, available_memory, num_blocks_override=None):
    """Keeps counting offsets across groups instead of restarting each group at byte 0."""
    return _kv_cache_config(groups, available_memory, num_blocks_override, no_overlay=True)


def packed_layout_real_pages(groups, available_memory, num_blocks_override=None):
    """Packs layers by their unpadded page size, so alignment padding is lost."""
    return _kv_cache_config(groups, available_memory, num_blocks_override, real_pages=True)


def packed_layout_group_order(groups, available_memory, num_blocks_override=None):
    """Lays a group's layers out one by one in group order (one tensor per layer) instead of
    spec by spec."""
    return _kv_cache_config(groups, available_memory, num_blocks_override, group_order=True)


def packed_layout_ignores_alignment(groups, available_memory, num_blocks_override=None):
    """Takes the widest group as the stride without rounding it up to the kernel pages."""
    return _kv_cache_config(
        groups, available_memory, num_blocks_override, ignore_alignment=True
    )


def packed_layout_ignores_override(groups, available_memory, num_blocks_override=None):
    """Always counts the blocks in the budget, ignoring num_blocks_override."""
    return _kv_cache_config(
        groups, available_memory, num_blocks_override, ignore_override=True
    )


def packed_layout_zero_blocks(groups, available_memory, num_blocks_override=None):
    """Plans 0 blocks when the budget is smaller than one block instead of raising."""
    return _kv_cache_config(groups, available_memory, num_blocks_override, zero_blocks=True)


def packed_layout_empty_is_zero(groups, available_memory, num_blocks_override=None):
    """Returns an empty config for no groups instead of raising: a slab with 0-byte blocks."""
    return _kv_cache_config(groups, available_memory, num_blocks_override, empty_is_zero=True)


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
    BrokenVariant(
        "can_append_needs_a_free_block", CanAppendNeedsAFreeBlock, BLOCK_MANAGER_GRADERS
    ),
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
    BrokenVariant(
        "gcd_smaller_wins_ties", approximate_gcd_smaller_wins_ties, ("check_approximate_gcd",)
    ),
    BrokenVariant(
        "gcd_ignores_lower_bound",
        approximate_gcd_ignores_lower_bound,
        ("check_approximate_gcd",),
    ),
    BrokenVariant(
        "gcd_exclusive_max", approximate_gcd_exclusive_max, ("check_approximate_gcd",)
    ),
    BrokenVariant(
        "gcd_accepts_non_ints", approximate_gcd_accepts_non_ints, ("check_approximate_gcd",)
    ),
    BrokenVariant(
        "gcd_dedupes_values", approximate_gcd_dedupes_values, ("check_approximate_gcd",)
    ),
    BrokenVariant(
        "gcd_clamps_to_max", approximate_gcd_clamps_to_max, ("check_approximate_gcd",)
    ),
    BrokenVariant(
        "gcd_trusts_lower_bound",
        approximate_gcd_trusts_lower_bound,
        ("check_approximate_gcd",),
    ),
    BrokenVariant("groups_mla_first", packed_groups_mla_first, ("check_packed_groups",)),
    BrokenVariant(
        "groups_no_lower_bound", packed_groups_no_lower_bound, ("check_packed_groups",)
    ),
    BrokenVariant("groups_floor_split", packed_groups_floor_split, ("check_packed_groups",)),
    BrokenVariant("groups_contiguous", packed_groups_contiguous, ("check_packed_groups",)),
    BrokenVariant(
        "groups_split_unbalanced", packed_groups_split_unbalanced, ("check_packed_groups",)
    ),
    BrokenVariant(
        "groups_for_one_page_size", packed_groups_for_one_page_size, ("check_packed_groups",)
    ),
    BrokenVariant(
        "groups_no_state_split", packed_groups_no_state_split, ("check_packed_groups",)
    ),
    BrokenVariant(
        "layout_stride_is_sum", packed_layout_stride_is_sum, ("check_packed_layout",)
    ),
    BrokenVariant("layout_no_overlay", packed_layout_no_overlay, ("check_packed_layout",)),
    BrokenVariant("layout_real_pages", packed_layout_real_pages, ("check_packed_layout",)),
    BrokenVariant("layout_group_order", packed_layout_group_order, ("check_packed_layout",)),
    BrokenVariant(
        "layout_ignores_alignment", packed_layout_ignores_alignment, ("check_packed_layout",)
    ),
    BrokenVariant(
        "layout_ignores_override", packed_layout_ignores_override, ("check_packed_layout",)
    ),
    BrokenVariant("layout_zero_blocks", packed_layout_zero_blocks, ("check_packed_layout",)),
    BrokenVariant(
        "layout_empty_is_zero", packed_layout_empty_is_zero, ("check_packed_layout",)
    ),
]

BROKEN_VARIANTS: list[BrokenVariant] = PAGED_BROKEN_VARIANTS + HYBRID_BROKEN_VARIANTS


# --- exercise 5 (the hybrid allocator): sliding-window frees and the fixed-point hit

_SKIP = "return max(0, num_computed_tokens - self.sliding_window + 1)"
_SKIP_BLOCKS = (
    "self.get_num_skipped_tokens(total_computed_tokens) // self.block_size, len(table)"
)


class SkipOneTokenTooFew(SlidingWindowManagerCopy):
    """Skips `n - W` tokens, one too few: a block whose last token just left stays."""

    get_num_skipped_tokens = edited(
        SlidingWindowManagerCopy.get_num_skipped_tokens,
        (_SKIP, "return max(0, num_computed_tokens - self.sliding_window)"),
    )


class SkipOneTokenTooMany(SlidingWindowManagerCopy):
    """Skips `n - W + 2` tokens, one too many: frees a block the next token still reads."""

    get_num_skipped_tokens = edited(
        SlidingWindowManagerCopy.get_num_skipped_tokens,
        (_SKIP, "return max(0, num_computed_tokens - self.sliding_window + 2)"),
    )


class SkipWithoutFloor(SlidingWindowManagerCopy):
    """Returns `n - W + 1` even when it is negative (a window longer than the prefix)."""

    get_num_skipped_tokens = edited(
        SlidingWindowManagerCopy.get_num_skipped_tokens,
        (_SKIP, "return num_computed_tokens - self.sliding_window + 1"),
    )


class FreesPartlySkippedBlock(SlidingWindowManagerCopy):
    """Frees a block as soon as one of its tokens left the window (rounds up)."""

    _skipped_blocks = edited(
        SlidingWindowManagerCopy._skipped_blocks,
        (
            _SKIP_BLOCKS,
            "cdiv(self.get_num_skipped_tokens(total_computed_tokens), self.block_size), "
            "len(table)",
        ),
    )


class NoCapAtTable(SlidingWindowManagerCopy):
    """Does not cap the skipped blocks at the table's length (a window past the table)."""

    _skipped_blocks = edited(
        SlidingWindowManagerCopy._skipped_blocks,
        (
            _SKIP_BLOCKS,
            "self.get_num_skipped_tokens(total_computed_tokens) // self.block_size, 1 << 30",
        ),
    )


class FreesTheNullBlock(SlidingWindowManagerCopy):
    """Walks on past the first null block, freeing the null block again and again."""

    _skipped_blocks = edited(SlidingWindowManagerCopy._skipped_blocks, ("break", "pass"))


class FreesFirstToLast(SlidingWindowManagerCopy):
    """Frees the skipped blocks first to last, so the earliest ends up last in the queue."""

    remove_skipped_blocks = edited(
        SlidingWindowManagerCopy.remove_skipped_blocks,
        (
            "for i in self._skipped_blocks(request_id, total_computed_tokens):",
            "for i in reversed(self._skipped_blocks(request_id, total_computed_tokens)):",
        ),
    )


class DropsFreedEntries(SlidingWindowManagerCopy):
    """Deletes the freed entries instead of putting the null block there (the table
    shrinks)."""

    remove_skipped_blocks = edited(
        SlidingWindowManagerCopy.remove_skipped_blocks,
        ("table[i] = self._null_block", "del table[i]"),
    )


class ForgetsToFree(SlidingWindowManagerCopy):
    """Puts the null block in the table but never gives the blocks back to the pool."""

    remove_skipped_blocks = edited(
        SlidingWindowManagerCopy.remove_skipped_blocks,
        ("self.block_pool.free_blocks(removed)", "pass"),
    )


_FIND = HybridKVCacheCoordinatorCopy.find_longest_cache_hit


class LooksUpInGroupOrder(HybridKVCacheCoordinatorCopy):
    """Looks the groups up in group order, so window groups may come before full
    attention."""

    find_longest_cache_hit = edited(
        _FIND,
        (
            "for idx, (spec, group_ids, use_eagle) in enumerate(self.attention_groups):",
            "for idx, (spec, group_ids, use_eagle) in enumerate(sorted(self.attention_groups, "
            "key=lambda group: group.group_ids[0])):",
        ),
    )


class StopsAfterOneRound(HybridKVCacheCoordinatorCopy):
    """Stops the fixed point after one round, even when the last group shortened it."""

    find_longest_cache_hit = edited(_FIND, ("if simple_hybrid:", "if True:"))


class UntrimmedFullAttention(HybridKVCacheCoordinatorCopy):
    """Returns all of full attention's hit blocks, past the agreed length."""

    find_longest_cache_hit = edited(
        _FIND, ("del hits[gid][-(-hit_length // self.specs[gid].block_size) :]", "pass")
    )


class NoUncachedPrefix(HybridKVCacheCoordinatorCopy):
    """Reports no uncached shared prefix (third value 0), so no junction is ever kept."""

    find_longest_cache_hit = edited(_FIND, ("longest_hit_length - hit_length,", "0,"))


class LooksUpWholePrompt(HybridKVCacheCoordinatorCopy):
    """Looks up every hashed token, ignoring max_cache_hit_length (the last token too)."""

    find_longest_cache_hit = edited(
        _FIND,
        (
            "hit_length = max_cache_hit_length",
            "hit_length = len(block_hashes) * self.hash_block_size",
        ),
    )


WINDOW_GRADERS = ("check_window_frees",)
HIT_GRADERS = ("check_fixed_point_hit",)
HYBRID_ALLOCATOR_BROKEN_VARIANTS: list[BrokenVariant] = [
    BrokenVariant("skip_one_token_too_few", SkipOneTokenTooFew, WINDOW_GRADERS),
    BrokenVariant("skip_one_token_too_many", SkipOneTokenTooMany, WINDOW_GRADERS),
    BrokenVariant("skip_without_floor", SkipWithoutFloor, WINDOW_GRADERS),
    BrokenVariant("frees_partly_skipped_block", FreesPartlySkippedBlock, WINDOW_GRADERS),
    BrokenVariant("no_cap_at_table", NoCapAtTable, WINDOW_GRADERS),
    BrokenVariant("frees_the_null_block", FreesTheNullBlock, WINDOW_GRADERS),
    BrokenVariant("frees_first_to_last", FreesFirstToLast, WINDOW_GRADERS),
    BrokenVariant("drops_freed_entries", DropsFreedEntries, WINDOW_GRADERS),
    BrokenVariant("forgets_to_free", ForgetsToFree, WINDOW_GRADERS),
    BrokenVariant("looks_up_in_group_order", LooksUpInGroupOrder, HIT_GRADERS),
    BrokenVariant("stops_after_one_round", StopsAfterOneRound, HIT_GRADERS),
    BrokenVariant("untrimmed_full_attention", UntrimmedFullAttention, HIT_GRADERS),
    BrokenVariant("no_uncached_prefix", NoUncachedPrefix, HIT_GRADERS),
    BrokenVariant("looks_up_whole_prompt", LooksUpWholePrompt, HIT_GRADERS),
]
BROKEN_VARIANTS += HYBRID_ALLOCATOR_BROKEN_VARIANTS


# --- exercise 06: slot addressing (compute_swa_indices_and_lens)
@functools.cache
def _swa_edited(*edits: tuple[str, str]) -> Callable:
    from grader.exercises import reference_copies_v4

    return edited(reference_copies_v4.compute_swa_indices_and_lens, *edits)


_SWA_START = "start = (pos - window_size + 1).clamp(min=0)"


def swa_window_off_by_one(*args, **kwargs):
    """Starts the window at pos - W instead of pos - W + 1, so it holds W + 1 positions."""
    return _swa_edited((_SWA_START, "start = (pos - window_size).clamp(min=0)"))(
        *args, **kwargs
    )


def swa_ignores_padding(*args, **kwargs):
    """Gives padding tokens the window of their (stale) request instead of an empty row."""
    return _swa_edited(
        ("valid = is_valid_token.bool()[tokens]", "valid = torch.ones_like(tokens).bool()")
    )(*args, **kwargs)


def swa_no_length_clamp(*args, **kwargs):
    """Never clamps the window at position 0: a young request gets W slots, some before its
    first token."""
    return _swa_edited((_SWA_START, "start = pos - window_size + 1"))(*args, **kwargs)


ADDRESSING_BROKEN_VARIANTS: list[BrokenVariant] = [
    BrokenVariant("swa_window_off_by_one", swa_window_off_by_one, ("check_swa_indices",)),
    BrokenVariant("swa_ignores_padding", swa_ignores_padding, ("check_swa_indices",)),
    BrokenVariant("swa_no_length_clamp", swa_no_length_clamp, ("check_swa_indices",)),
]
BROKEN_VARIANTS += ADDRESSING_BROKEN_VARIANTS
