"""Many cache groups, one pool (vLLM v1's `kv_cache_coordinator.py`).

The coordinator owns one manager per cache group and answers questions for all of them at once:
how many blocks a step needs in total (they all come from the same free queue), how long a
prefix hit is *for every group together*, and which blocks to register in the prefix cache.
vLLM picks one of three, and so does `get_kv_cache_coordinator`:

- `KVCacheCoordinatorNoPrefixCache` when prefix caching is off: no lookup at all;
- `UnitaryKVCacheCoordinator` for a model with one cache group: one lookup in that group;
- `HybridKVCacheCoordinator` otherwise: a hit of L tokens is usable only if every group can
  serve it (full attention needs all blocks of [0, L), a sliding window only the last W - 1
  tokens before L, a chunked local group only the blocks of the chunk L is in), so L shrinks
  until all groups agree (a fixed point). Hit lengths are
  multiples of the scheduler block size, the least common multiple of the group block sizes
  (256 for DeepSeek V4: lcm(256, 64, 64, 8, 4)).

Retention (`prefix_cache_retention_interval`, vLLM's `CacheConfig` field, default 0) decides
which sliding-window blocks are registered: see `SlidingWindowManager.reachable_block_mask`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from refimpl.hybrid.block_pool import BlockPool
from refimpl.hybrid.kv_cache_interface import (
    AttentionSpec,
    FullAttentionSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    unwrap_spec,
)
from refimpl.hybrid.kv_cache_utils import BlockHash, KVCacheBlock
from refimpl.hybrid.request import Request
from refimpl.hybrid.single_type_kv_cache_manager import (
    FullAttentionManager,
    SingleTypeKVCacheManager,
    make_manager,
)
from refimpl.validation import is_integer


def check_retention_interval(
    retention_interval: int | None, scheduler_block_size: int, specs: Sequence[KVCacheSpec]
) -> None:
    """vLLM's rules for `prefix_cache_retention_interval`: None (dense), 0, or a positive
    multiple of the scheduler block size, and a positive value only for a model with a sliding
    window."""
    if retention_interval is None:
        return
    if not is_integer(retention_interval):
        raise TypeError(
            "prefix_cache_retention_interval must be None or an int, got "
            f"{retention_interval!r}"
        )
    if retention_interval < 0 or retention_interval % scheduler_block_size:
        raise ValueError(
            "prefix_cache_retention_interval must be None, 0 or a positive multiple of the "
            "scheduler "
            f"block size {scheduler_block_size}, got {retention_interval}"
        )
    if retention_interval and not any(
        isinstance(s, (SlidingWindowSpec, MambaSpec)) for s in specs
    ):
        raise ValueError(
            "prefix_cache_retention_interval is set but no cache group has a sliding window "
            "or Mamba state, so it would have no effect; use 0 (it applies only to those)"
        )


def replay_boundaries(
    num_prompt_tokens: int, scheduler_block_size: int, use_eagle: bool
) -> tuple[int, ...]:
    """Positions a later request replaying this prompt can resume at (vLLM's rule).

    A resend of the same prompt is looked up to `num_prompt_tokens - 1` (its last token runs
    again for logits). With eagle the hit drops one scheduler block, and a longer request that
    extends the prompt matches its last whole block: both positions, one block earlier.
    """
    if not use_eagle:
        return (num_prompt_tokens - 1,)
    block = scheduler_block_size
    resend = (num_prompt_tokens - 1) // block * block
    extension = num_prompt_tokens // block * block
    return tuple(sorted({max(resend - block, 0), max(extension - block, 0)}))


class SpecGroup(NamedTuple):
    """Cache groups whose specs are equal, looked up together in one pass (vLLM's `SpecGroup`).

    `use_eagle`: one of the groups holds the eagle/MTP draft layer, so the lookup drops the
    last hit block for all of them."""

    kv_cache_spec: AttentionSpec
    group_ids: list[int]
    use_eagle: bool = False


class KVCacheCoordinator:
    """One manager per group, one shared `BlockPool`; the subclasses differ in the lookup
    (build one with `get_kv_cache_coordinator`, or a subclass directly).

    `kv_cache_groups`: `KVCacheGroupSpec`s (or bare specs) in group order; group i gets id i.
    `hash_block_size`: granularity of the request's prefix hashes; defaults to the gcd of the
    group block sizes, so every group block is a whole number of hash blocks.
    `alignment_tokens`: where hits may end; defaults to the lcm of the block sizes. A smaller
    value (a multiple of `hash_block_size`) lets full-attention hits end inside a block, which
    then costs a copy-on-write block (refimpl's own mode: vLLM enables such hits only with
    Mamba layers).
    `use_eagle`: speculative decoding with an eagle/MTP drafter. The groups flagged
    `is_eagle_group` (or every group, when none is flagged) drop the last block of a prefix
    hit, because the drafter needs the hidden states of those tokens recomputed.
    `prefix_cache_retention_interval`: which sliding-window blocks are registered (None: at
    every hit boundary; 0, vLLM's default: only where a later request can resume; a positive
    multiple of the scheduler block size: also once per that many tokens).
    """

    def __init__(
        self,
        kv_cache_groups: Sequence[KVCacheGroupSpec | KVCacheSpec],
        num_blocks: int,
        *,
        enable_caching: bool = True,
        hash_block_size: int | None = None,
        alignment_tokens: int | None = None,
        max_in_flight_tokens: int | None = None,
        use_eagle: bool = False,
        prefix_cache_retention_interval: int | None = 0,
    ) -> None:
        if not kv_cache_groups:
            raise ValueError("kv_cache_groups: need at least one KV-cache group")
        specs = [unwrap_spec(g) for g in kv_cache_groups]
        sizes = [s.block_size for s in specs]
        self.scheduler_block_size = math.lcm(*sizes)
        if hash_block_size is not None:
            if not is_integer(hash_block_size) or hash_block_size < 1:
                raise ValueError(
                    f"hash_block_size must be a positive int, got {hash_block_size!r}"
                )
        # vLLM hashes at the scheduler block size when nothing is looked up at a finer one
        # (caching off, or a Mamba group that keeps one state per request)
        coarse = not enable_caching or any(
            isinstance(s, MambaSpec) and s.mamba_cache_mode != "align" for s in specs
        )
        self.hash_block_size = hash_block_size or (
            self.scheduler_block_size if coarse else math.gcd(*sizes)
        )
        bad = [b for b in sizes if b % self.hash_block_size and not coarse]
        if bad:
            raise ValueError(
                f"hash_block_size {self.hash_block_size} must divide every group block size, "
                f"not {bad}"
            )
        if alignment_tokens is not None:
            if (
                not is_integer(alignment_tokens)
                or alignment_tokens < 1
                or alignment_tokens % self.hash_block_size
            ):
                raise ValueError(
                    "alignment_tokens must be a positive multiple of hash_block_size "
                    f"{self.hash_block_size}, got {alignment_tokens}"
                )
            self.scheduler_block_size = alignment_tokens
        check_retention_interval(
            prefix_cache_retention_interval, self.scheduler_block_size, specs
        )
        self.retention_interval = prefix_cache_retention_interval
        self.block_pool = BlockPool(num_blocks, enable_caching=enable_caching)
        self.enable_caching = enable_caching
        self.specs = specs
        self.single_type_managers: list[SingleTypeKVCacheManager] = [
            make_manager(
                spec,
                self.block_pool,
                gid,
                hash_block_size=self.hash_block_size,
                alignment_tokens=self.scheduler_block_size,
                enable_caching=enable_caching,
                max_in_flight_tokens=max_in_flight_tokens,
            )
            for gid, spec in enumerate(specs)
        ]
        self.eagle_group_ids: set[int] = {
            gid for gid, g in enumerate(kv_cache_groups) if getattr(g, "is_eagle_group", False)
        }
        if use_eagle and not self.eagle_group_ids:  # nobody flagged: be safe, drop everywhere
            self.eagle_group_ids = set(range(len(specs)))

    # --- lookup
    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int, int]:
        """(blocks per group, hit length in tokens, uncached shared prefix in tokens).

        The third value is how much further than the agreed hit some group could have served:
        a prefix other requests share that a sliding window has not kept (0 unless hybrid)."""
        raise NotImplementedError

    def get_num_cacheable_tokens(
        self, num_computed_tokens: int, kv_cache_group_id: int
    ) -> int:
        """How many of the computed tokens this group registers (all of them by default)."""
        return num_computed_tokens

    # --- allocation (sums over groups)
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Sequence[KVCacheBlock]] | None,
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """Sum over groups. `prefill_end` (Mamba's prefill checkpoint, on the chunk reaching
        it) counts only under retention 0: otherwise every chunk publishes a state."""
        if self.retention_interval != 0:
            prefill_end = 0
        total = 0
        for gid, manager in enumerate(self.single_type_managers):
            hits = new_computed_blocks[gid] if new_computed_blocks else ()
            total += manager.get_num_blocks_to_allocate(
                request_id,
                num_tokens,
                hits,
                total_computed_tokens,
                apply_admission_cap,
                prefill_end,
            )
        return total

    def has_slots_for(
        self, request_id: str, num_tokens: int, num_tokens_to_cache: int
    ) -> bool:
        """Whether no group has anything to free, allocate or register for this step (see
        `SingleTypeKVCacheManager.has_slots_for`; a group registers at most
        `num_tokens_to_cache` tokens, so asking with that many is enough)."""
        for manager in self.single_type_managers:
            if not manager.has_slots_for(request_id, num_tokens, num_tokens_to_cache):
                return False
        return True

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[Sequence[KVCacheBlock]],
        total_computed_tokens: int,
    ) -> None:
        for manager, hits in zip(self.single_type_managers, new_computed_blocks):
            manager.allocate_new_computed_blocks(request_id, hits, total_computed_tokens)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int
    ) -> tuple[list[KVCacheBlock], ...]:
        """New blocks for every group, or a ValueError (and nothing allocated) if they do not
        fit."""
        needed = sum(
            m.num_new_blocks_needed(request_id, num_tokens) for m in self.single_type_managers
        )
        if needed > self.block_pool.get_num_free_blocks():
            raise ValueError(
                f"request {request_id} needs {needed} new blocks over all groups but only "
                f"{self.block_pool.get_num_free_blocks()} are free; nothing was allocated"
            )
        if not needed:  # most decode steps: every manager would return [] (as vLLM's do)
            return tuple([] for _ in self.single_type_managers)
        return tuple(
            m.allocate_new_blocks(request_id, num_tokens) for m in self.single_type_managers
        )

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the request's blocks in every group's prefix cache, each group up to
        `get_num_cacheable_tokens`; sliding windows keep only the blocks the retention interval
        and the reachable boundaries (`replay_boundaries`, the request's junction) call for."""
        boundaries = replay_boundaries(
            request.num_prompt_tokens,
            self.scheduler_block_size,
            use_eagle=bool(self.eagle_group_ids),
        )
        for gid, manager in enumerate(self.single_type_managers):
            manager.cache_blocks(
                request,
                self.get_num_cacheable_tokens(num_computed_tokens, gid),
                retention_interval=self.retention_interval,
                replay_boundaries=boundaries,
            )

    def num_freeable_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> int:
        return sum(
            m.num_freeable_skipped_blocks(request_id, total_computed_tokens)
            for m in self.single_type_managers
        )

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int
    ) -> list[list[KVCacheBlock]]:
        return [
            m.remove_skipped_blocks(request_id, total_computed_tokens)
            for m in self.single_type_managers
        ]

    def free(self, request_id: str) -> None:
        for manager in self.single_type_managers:
            manager.free(request_id)

    def new_step_starts(self) -> None:
        for manager in self.single_type_managers:
            manager.new_step_starts()

    def take_kv_cache_block_copies(self) -> list[tuple[int, int, int]]:
        """Release the copy-on-write pairs of every group: (group id, source id, copy id)."""
        return [
            (gid, src, dst)
            for gid, m in enumerate(self.single_type_managers)
            for src, dst in m.take_kv_cache_block_copies()
        ]

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return tuple(
            list(m.req_to_blocks.get(request_id, [])) for m in self.single_type_managers
        )


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """Prefix caching off (vLLM's `KVCacheCoordinatorNoPrefixCache`): no hit, ever."""

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int, int]:
        return tuple([] for _ in self.single_type_managers), 0, 0


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """One cache group (vLLM's `UnitaryKVCacheCoordinator`): one lookup in that group.

    No fixed point and no look-one-block-further margin for eagle: an eagle lookup stops at
    `max_cache_hit_length` and then drops a block, so a single eagle group hits one block less
    than the hybrid loop would. Every computed token is registered (no alignment to round to).
    """

    def __init__(
        self,
        kv_cache_groups: Sequence[KVCacheGroupSpec | KVCacheSpec],
        num_blocks: int,
        **kwargs,
    ) -> None:
        super().__init__(kv_cache_groups, num_blocks, **kwargs)
        if len(self.specs) != 1:
            raise ValueError(
                "kv_cache_groups: the unitary coordinator takes one group, got "
                f"{len(self.specs)}"
            )
        if (
            self.hash_block_size != self.specs[0].block_size
            or self.scheduler_block_size != self.specs[0].block_size
        ):
            raise ValueError(
                "one cache group hashes and aligns hits at its own block size "
                f"{self.specs[0].block_size} (hash_block_size and alignment_tokens must equal "
                "it)"
            )
        self.single_type_managers[0].use_eagle = 0 in self.eagle_group_ids

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int, int]:
        manager = self.single_type_managers[0]
        spec = self.specs[0]
        hits = type(manager).find_longest_cache_hit(
            block_hashes,
            max_cache_hit_length,
            [0],
            self.block_pool,
            spec,
            hash_block_size=self.hash_block_size,
            alignment_tokens=spec.block_size,
            drop_eagle_block=0 in self.eagle_group_ids,
        )
        return hits, len(hits[0]) * spec.block_size, 0

    def has_slots_for(
        self, request_id: str, num_tokens: int, num_tokens_to_cache: int
    ) -> bool:
        """The one group's answer (no loop: asked for every request in every step)."""
        return self.single_type_managers[0].has_slots_for(
            request_id, num_tokens, num_tokens_to_cache
        )


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Several cache groups (vLLM's `HybridKVCacheCoordinator`): the fixed-point lookup."""

    def __init__(
        self,
        kv_cache_groups: Sequence[KVCacheGroupSpec | KVCacheSpec],
        num_blocks: int,
        **kwargs,
    ) -> None:
        super().__init__(kv_cache_groups, num_blocks, **kwargs)
        # Groups with equal specs are looked up together; full attention first (its hit is an
        # upper bound for everybody and is cheap to trim), every other kind (sliding window,
        # chunked local) after it in group order, as vLLM sorts them.
        # (Specs are compared with ==, so a list is used rather than a dict: specs may be
        # unhashable.)
        spec_groups: list[SpecGroup] = []
        for gid, spec in enumerate(self.specs):
            eagle = gid in self.eagle_group_ids
            for idx, seen in enumerate(spec_groups):
                if seen.kv_cache_spec == spec:
                    seen.group_ids.append(gid)
                    if eagle and not seen.use_eagle:
                        spec_groups[idx] = seen._replace(use_eagle=True)
                    break
            else:
                spec_groups.append(SpecGroup(spec, [gid], eagle))
        self.attention_groups: list[SpecGroup] = sorted(
            spec_groups,
            key=lambda group: not isinstance(group.kv_cache_spec, FullAttentionSpec),
        )
        for group in self.attention_groups:  # the whole spec group drops, as in vLLM
            for gid in group.group_ids:
                self.single_type_managers[gid].use_eagle = group.use_eagle

    def get_num_cacheable_tokens(
        self, num_computed_tokens: int, kv_cache_group_id: int
    ) -> int:
        """Only up to an alignment boundary: a hit can never end elsewhere (an eagle group one
        block further, the block its lookup matches and drops)."""
        aligned = num_computed_tokens // self.scheduler_block_size * self.scheduler_block_size
        manager = self.single_type_managers[kv_cache_group_id]
        if manager.use_eagle and aligned > 0:
            return min(num_computed_tokens, aligned + manager.block_size)
        return aligned

    # --- lookup
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
        simple_hybrid = len(self.attention_groups) == 2 and isinstance(
            self.attention_groups[0].kv_cache_spec, FullAttentionSpec
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


def get_kv_cache_coordinator(
    kv_cache_groups: Sequence[KVCacheGroupSpec | KVCacheSpec],
    num_blocks: int,
    *,
    enable_caching: bool = True,
    **kwargs,
) -> KVCacheCoordinator:
    """The coordinator vLLM would pick: none for the prefix cache when caching is off, the
    unitary one for one group, the hybrid one otherwise.

    One group hashed or aligned more finely than its block (`hash_block_size` or
    `alignment_tokens` below the block size: refimpl's fine-grained hits, which vLLM only
    enables next to Mamba layers) goes to the hybrid coordinator, which handles that mode."""
    if not enable_caching:
        return KVCacheCoordinatorNoPrefixCache(
            kv_cache_groups, num_blocks, enable_caching=False, **kwargs
        )
    if len(kv_cache_groups) == 1:
        block_size = unwrap_spec(kv_cache_groups[0]).block_size
        if kwargs.get("hash_block_size") in (None, block_size) and kwargs.get(
            "alignment_tokens"
        ) in (None, block_size):
            return UnitaryKVCacheCoordinator(kv_cache_groups, num_blocks, **kwargs)
    return HybridKVCacheCoordinator(kv_cache_groups, num_blocks, **kwargs)
