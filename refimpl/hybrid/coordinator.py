"""Many cache groups, one pool (vLLM v1's `HybridKVCacheCoordinator`).

The coordinator owns one manager per cache group and answers questions for all of them at once:
how many blocks a step needs in total (they all come from the same free queue), and how long a
prefix hit is *for every group together*. A hit of L tokens is usable only if every group can
serve it: full attention needs all blocks of [0, L), a sliding window only the last W - 1 tokens
before L. The coordinator shrinks L until all groups agree (a fixed point).

Hit lengths are multiples of the scheduler block size, the least common multiple of the group
block sizes (256 for DeepSeek V4: lcm(256, 64, 64, 8, 4)).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

from refimpl.hybrid.block_pool import BlockHash, BlockPool, KVCacheBlock
from refimpl.hybrid.managers import FullAttentionManager, SingleTypeKVCacheManager, make_manager
from refimpl.hybrid.specs import AttentionSpec, KVCacheGroupSpec, KVCacheSpec, SlidingWindowSpec, unwrap_spec


class SpecGroup(NamedTuple):
    """Cache groups whose specs are equal, looked up together in one pass (vLLM's `SpecGroup`)."""

    kv_cache_spec: AttentionSpec
    group_ids: list[int]


class KVCacheCoordinator:
    """One manager per group, one shared `BlockPool`.

    `kv_cache_groups`: `KVCacheGroupSpec`s (or bare specs) in group order; group i gets id i.
    `hash_block_size`: granularity of the request's prefix hashes; defaults to the gcd of the
    group block sizes, so every group block is a whole number of hash blocks.
    `alignment_tokens`: where hits may end; defaults to the lcm of the block sizes. A smaller
    value (a multiple of `hash_block_size`) lets full-attention hits end inside a block, which
    then costs a copy-on-write block.
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
    ) -> None:
        if not kv_cache_groups:
            raise ValueError("need at least one KV-cache group")
        specs = [unwrap_spec(g) for g in kv_cache_groups]
        sizes = [s.block_size for s in specs]
        self.scheduler_block_size = math.lcm(*sizes)
        self.hash_block_size = hash_block_size or math.gcd(*sizes)
        bad = [b for b in sizes if b % self.hash_block_size]
        if bad:
            raise ValueError(f"hash_block_size {self.hash_block_size} must divide every group block size, not {bad}")
        if alignment_tokens is not None:
            if alignment_tokens < 1 or alignment_tokens % self.hash_block_size:
                raise ValueError(
                    f"alignment_tokens must be a positive multiple of hash_block_size {self.hash_block_size}, got {alignment_tokens}"
                )
            self.scheduler_block_size = alignment_tokens
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
        # Groups with equal specs are looked up together; full attention first (its hit is an
        # upper bound for everybody and is cheap to trim).
        # (Specs are compared with ==, so a list is used rather than a dict: specs may be unhashable.)
        spec_groups: list[SpecGroup] = []
        for gid, spec in enumerate(specs):
            for seen in spec_groups:
                if seen.kv_cache_spec == spec:
                    seen.group_ids.append(gid)
                    break
            else:
                spec_groups.append(SpecGroup(spec, [gid]))
        self.attention_groups: list[SpecGroup] = sorted(
            spec_groups, key=lambda group: isinstance(group.kv_cache_spec, SlidingWindowSpec)
        )

    # --- lookup
    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """Blocks per group and the hit length in tokens that every group can serve."""
        num_groups = len(self.specs)
        hit_length = (max_cache_hit_length // self.scheduler_block_size) * self.scheduler_block_size
        while True:
            candidate = hit_length
            hits: list[list[KVCacheBlock]] = [[] for _ in range(num_groups)]
            for spec, group_ids in self.attention_groups:
                manager = self.single_type_managers[group_ids[0]]
                manager_cls = type(manager)
                found = manager_cls.find_longest_cache_hit(
                    block_hashes,
                    candidate,
                    group_ids,
                    self.block_pool,
                    spec,
                    hash_block_size=self.hash_block_size,
                    alignment_tokens=self.scheduler_block_size,
                )
                found_tokens = len(found[0]) * spec.block_size
                if manager.is_fine_grained and isinstance(manager, FullAttentionManager) and found_tokens < candidate:
                    partial = manager_cls.find_partial_block_hit(
                        block_hashes, len(found[0]), candidate, group_ids, self.block_pool, spec,
                        self.hash_block_size, self.scheduler_block_size,
                    )
                    if partial is not None:
                        for blocks, block in zip(found, partial[0]):
                            blocks.append(block)
                        found_tokens += partial[1]
                for gid, blocks in zip(group_ids, found):
                    hits[gid] = blocks
                candidate = min(candidate, found_tokens)
            if candidate >= hit_length:
                break
            hit_length = candidate
        # Every group's hit must cover exactly hit_length tokens (full attention may be longer);
        # a hit ending inside a block keeps that block (the manager copies it on write).
        for gid, spec in enumerate(self.specs):
            del hits[gid][-(-hit_length // spec.block_size) :]
        return tuple(hits), hit_length

    # --- allocation (sums over groups)
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Sequence[KVCacheBlock]] | None,
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
    ) -> int:
        total = 0
        for gid, manager in enumerate(self.single_type_managers):
            hits = new_computed_blocks[gid] if new_computed_blocks else ()
            total += manager.get_num_blocks_to_allocate(
                request_id, num_tokens, hits, total_computed_tokens, apply_admission_cap
            )
        return total

    def add_local_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence[Sequence[KVCacheBlock]], total_computed_tokens: int
    ) -> None:
        for manager, hits in zip(self.single_type_managers, new_computed_blocks):
            manager.add_local_computed_blocks(request_id, hits, total_computed_tokens)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> tuple[list[KVCacheBlock], ...]:
        """New blocks for every group, or a ValueError (and nothing allocated) if they do not fit."""
        needed = sum(m.num_new_blocks_needed(request_id, num_tokens) for m in self.single_type_managers)
        if needed > self.block_pool.get_num_free_blocks():
            raise ValueError(
                f"request {request_id} needs {needed} new blocks over all groups but only "
                f"{self.block_pool.get_num_free_blocks()} are free; nothing was allocated"
            )
        return tuple(m.allocate_new_blocks(request_id, num_tokens) for m in self.single_type_managers)

    def cache_blocks(self, request_id: str, block_hashes: Sequence[BlockHash], num_computed_tokens: int) -> None:
        """Cache full blocks, but only up to an alignment boundary: a hit can never end elsewhere."""
        aligned = (num_computed_tokens // self.scheduler_block_size) * self.scheduler_block_size
        for manager in self.single_type_managers:
            manager.cache_blocks(request_id, block_hashes, aligned)

    def num_freeable_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> int:
        return sum(m.num_freeable_skipped_blocks(request_id, total_computed_tokens) for m in self.single_type_managers)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> list[list[KVCacheBlock]]:
        return [m.remove_skipped_blocks(request_id, total_computed_tokens) for m in self.single_type_managers]

    def free(self, request_id: str) -> None:
        for manager in self.single_type_managers:
            manager.free(request_id)

    def complete_copies(self) -> list[tuple[int, int, int]]:
        """Release the copy-on-write pairs of every group: (group id, source id, copy id)."""
        return [(gid, src, dst) for gid, m in enumerate(self.single_type_managers) for src, dst in m.complete_copies()]

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return tuple(list(m.req_to_blocks.get(request_id, [])) for m in self.single_type_managers)
