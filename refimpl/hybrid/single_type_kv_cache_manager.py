"""Per-group block-table managers (vLLM v1's `single_type_kv_cache_manager.py`).

One manager owns the block tables of one cache group. All managers draw block ids from the same
`BlockPool`. Two kinds are enough for DeepSeek V4:

- `FullAttentionManager` (full attention and MLA, including DeepSeek V4's compressed MLA and
  indexer caches): every block is kept until the request finishes; a prefix hit is the longest
  run of cached blocks from the start.
- `SlidingWindowManager` (sliding-window KV and the compressor state, which vLLM registers as
  a sliding window of `coff * ratio` tokens): blocks that fall out of the window are freed and
  replaced by the null block; a prefix hit only needs the last `window - 1` tokens before the
  hit point, so a hit may have nulls in front.

With eagle/MTP speculative decoding, the managers of the eagle groups give up the last block of
a prefix hit (`drop_eagle_block`), because the drafter needs those tokens recomputed.

Prefix hashes arrive at `hash_block_size` granularity (the gcd of the group block sizes, 4 for
DeepSeek V4); a manager views them at its own block size by taking the hash at the last
sub-boundary of each block, which is valid because the hashes chain over the whole prefix.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from refimpl.hybrid.block_pool import BlockPool
from refimpl.hybrid.kv_cache_interface import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    cdiv,
    unwrap_spec,
)
from refimpl.hybrid.kv_cache_utils import BlockHash, KVCacheBlock
from refimpl.hybrid.request import Request


class BlockHashListWithBlockSize:
    """Read-only view of fine-grained prefix hashes at a coarser block size.

    Block j of size `block_size` ends at hash index `(j + 1) * block_size // hash_block_size -
    1`; that hash already covers the whole prefix, so it identifies the block.
    """

    def __init__(
        self, block_hashes: Sequence[BlockHash], hash_block_size: int, block_size: int
    ) -> None:
        if block_size % hash_block_size != 0:
            raise ValueError(
                f"block_size {block_size} must be a multiple of hash_block_size "
                f"{hash_block_size}"
            )
        self.block_hashes = block_hashes
        self.scale = block_size // hash_block_size

    def __len__(self) -> int:
        return len(self.block_hashes) // self.scale

    def __getitem__(self, j: int) -> BlockHash:
        i = (j + 1) * self.scale - 1  # j < len(self) exactly when i < len(block_hashes)
        if j < 0 or i >= len(self.block_hashes):
            raise IndexError(f"block {j} has no hash yet ({len(self)} full blocks)")
        return self.block_hashes[i]


def resolve_block_hashes(
    block_hashes: Sequence[BlockHash], hash_block_size: int, block_size: int
) -> Sequence[BlockHash]:
    """The hashes viewed at `block_size`: the list itself when the sizes are equal (no view
    to index through), else a `BlockHashListWithBlockSize` (vLLM's `resolve_block_hashes`)."""
    if block_size == hash_block_size:
        return block_hashes
    return BlockHashListWithBlockSize(block_hashes, hash_block_size, block_size)


class SingleTypeKVCacheManager:
    """Block tables of one cache group: allocate, cache, look up, free.

    `alignment_tokens` is the hit granularity shared by all groups (the scheduler block size,
    the least common multiple of the group block sizes). `max_in_flight_tokens`, when given,
    caps how many blocks the full-sequence admission check asks of a sliding-window group.
    """

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        kv_cache_group_id: int,
        *,
        hash_block_size: int | None = None,
        alignment_tokens: int | None = None,
        enable_caching: bool = True,
        max_in_flight_tokens: int | None = None,
    ) -> None:
        self.kv_cache_spec: AttentionSpec = unwrap_spec(kv_cache_spec)
        self.block_size: int = self.kv_cache_spec.block_size  # the spec checked it
        self.block_pool = block_pool
        self.kv_cache_group_id = kv_cache_group_id
        self.hash_block_size = hash_block_size or self.block_size
        self.alignment_tokens = alignment_tokens or self.block_size
        self.enable_caching = enable_caching
        self.max_in_flight_tokens = max_in_flight_tokens
        self.req_to_blocks: defaultdict[str, list[KVCacheBlock]] = defaultdict(list)
        self.num_cached_block: dict[str, int] = {}
        # Copy-on-write: request -> (table index, source block) of a hit that ends inside a
        # block, and the (source, copy) pairs the worker still has to copy.
        self._partial_hit_reqs: dict[str, tuple[int, KVCacheBlock]] = {}
        self.pending_copies: list[tuple[KVCacheBlock, KVCacheBlock]] = []
        self._null_block = block_pool.null_block
        # Eagle/MTP: set by the coordinator for the groups that drop the last hit block.
        self.use_eagle = False

    @property
    def is_fine_grained(self) -> bool:
        """Can a prefix hit end inside one of this group's blocks?"""
        return self.alignment_tokens < self.block_size

    # --- hooks per kind
    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens whose KV no future token reads (0 for full attention)."""
        return 0

    def max_admission_blocks_per_request(self) -> int | None:
        """Most blocks this group can hold for one request at once (None: no cap)."""
        return None

    @classmethod
    def reachable_block_mask(
        cls,
        start_block: int,
        end_block: int,
        alignment_tokens: int,
        kv_cache_spec: AttentionSpec,
        use_eagle: bool,
        retention_interval: int | None = None,
        reachable_boundaries: Sequence[int] = (),
    ) -> list[bool] | None:
        """Which of blocks [start_block, end_block) are worth hashing (None: all of them, as
        for full attention). Sliding windows override it."""
        return None

    def has_slots_for(
        self, request_id: str, num_tokens: int, num_tokens_to_cache: int
    ) -> bool:
        """Whether a step of a running request up to `num_tokens` slots, with
        `num_tokens_to_cache` computed, asks nothing of this group: no block to free, allocate
        or register. refimpl's own shortcut for `KVCacheManager.allocate_slots` (vLLM makes
        the calls, which then do nothing); only full attention answers, other kinds say no."""
        return False

    # --- counting
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
        total_computed_tokens: int = 0,
        apply_admission_cap: bool = False,
    ) -> int:
        """Blocks this group must take from the free queue to hold `num_tokens` tokens.

        Prefix hits that sit in the free queue (ref_cnt 0) count too: touching them takes them
        out of the queue, so they are no longer available to anyone else.
        """
        required = cdiv(num_tokens, self.block_size)
        cap = self.max_admission_blocks_per_request() if apply_admission_cap else None
        if cap is not None:
            required = min(required, cap)
        req_blocks = self.req_to_blocks.get(request_id, [])
        # running: hits only count on the first allocation
        if request_id in self.num_cached_block:
            return max(required - len(req_blocks), 0)
        skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        local_blocks = len(new_computed_blocks) + len(req_blocks)
        num_new = max(required - max(skipped_blocks, local_blocks), 0)
        revived = sum(
            1
            for block in new_computed_blocks[max(0, skipped_blocks - len(req_blocks)) :]
            if block.ref_cnt == 0 and not block.is_null
        )
        copy_on_write = (
            1 if new_computed_blocks and total_computed_tokens % self.block_size else 0
        )
        return num_new + revived + copy_on_write

    # --- allocation
    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
    ) -> None:
        """Start a request's table with its prefix hits (first allocation only).

        Hits already outside the window are replaced by the null block instead of touched. A
        hit that ends inside a block (fine-grained groups only) keeps that block for now; the
        next `allocate_new_blocks` swaps in a private copy (copy-on-write), because this
        request will write the rest of the block.
        """
        if request_id in self.num_cached_block:
            return
        # Not capped at the number of hits: a window that starts past the hit still gets nulls
        # up to its start (vLLM does the same; the rest of the table is allocated fresh).
        skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        kept = list(new_computed_blocks[skipped:])
        self.block_pool.touch(kept)
        table = self.req_to_blocks[request_id]
        table.extend([self._null_block] * skipped)
        table.extend(kept)
        self.num_cached_block[request_id] = len(table)
        if kept and total_computed_tokens % self.block_size:
            idx = total_computed_tokens // self.block_size
            self._partial_hit_reqs[request_id] = (idx, table[idx])
            self.num_cached_block[request_id] = idx

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Append fresh blocks until the table covers `num_tokens` tokens; return the new ones.

        A pending partial hit first gets its copy: a new block replaces the shared source in
        the table, and both stay referenced by `pending_copies` until
        `take_kv_cache_block_copies` runs.
        """
        table = self.req_to_blocks.get(request_id)
        if (
            table is not None
            and cdiv(num_tokens, self.block_size) <= len(table)
            and request_id not in self._partial_hit_reqs
        ):
            return []  # the table covers num_tokens already (vLLM returns [] here too)
        needed = self.num_new_blocks_needed(request_id, num_tokens)
        if needed > self.block_pool.get_num_free_blocks():
            raise ValueError(
                f"request {request_id} needs {needed} new blocks in group "
                f"{self.kv_cache_group_id} "
                f"but only {self.block_pool.get_num_free_blocks()} are free; nothing was "
                "allocated"
            )
        table = self.req_to_blocks[request_id]
        copies: list[KVCacheBlock] = []
        if request_id in self._partial_hit_reqs:
            idx, source = self._partial_hit_reqs.pop(request_id)
            (copy,) = self.block_pool.get_new_blocks(1)
            copy.ref_cnt += 1  # held by the pending copy as well as by the table
            table[idx] = copy
            self.pending_copies.append((source, copy))
            copies.append(copy)
        num_new = cdiv(num_tokens, self.block_size) - len(table)
        new_blocks = self.block_pool.get_new_blocks(num_new) if num_new > 0 else []
        table.extend(new_blocks)
        return copies + new_blocks

    def num_new_blocks_needed(self, request_id: str, num_tokens: int) -> int:
        """Blocks `allocate_new_blocks(request_id, num_tokens)` would take from the pool."""
        table_len = len(self.req_to_blocks.get(request_id, ()))
        copy = 1 if request_id in self._partial_hit_reqs else 0
        return copy + max(cdiv(num_tokens, self.block_size) - table_len, 0)

    def take_kv_cache_block_copies(self) -> list[tuple[int, int]]:
        """The worker copied every pending (source, copy) pair: drop the references they held.

        Returns the pairs as block ids (vLLM's manager drains them the same way and hands the
        worker `KVCacheBlockCopy` records; refimpl has no worker, so the pairs are the record).
        The source loses this request's hit reference (the request now reads its own copy).
        """
        done = [(src.block_id, dst.block_id) for src, dst in self.pending_copies]
        for src, dst in self.pending_copies:
            self.block_pool.free_blocks([dst, src])
        self.pending_copies.clear()
        return done

    def cache_blocks(
        self,
        request: Request,
        num_tokens: int,
        retention_interval: int | None = None,
        *,
        replay_boundaries: Sequence[int] = (),
    ) -> None:
        """Register the request's newly full blocks (up to `num_tokens` tokens) in the prefix
        cache.

        `retention_interval` and `replay_boundaries` (see `KVCacheCoordinator.cache_blocks`)
        only matter to sliding windows, which keep a block only where a later hit could use it;
        the request's `shared_prefix_boundary` (a junction its lookup reported, once the
        scheduler pinned it there) is kept as well.
        """
        request_id = request.request_id
        num_cached = self.num_cached_block.get(request_id, 0)
        num_full = num_tokens // self.block_size
        if num_full <= num_cached:
            return
        boundaries = [*replay_boundaries]
        if request.shared_prefix_boundary:
            boundaries.append(request.shared_prefix_boundary)
        mask = self.reachable_block_mask(
            num_cached,
            num_full,
            self.alignment_tokens,
            self.kv_cache_spec,
            self.use_eagle,
            retention_interval=retention_interval,
            reachable_boundaries=boundaries,
        )
        hashes = resolve_block_hashes(
            request.block_hashes, self.hash_block_size, self.block_size
        )
        self.block_pool.cache_full_blocks(
            hashes,
            self.req_to_blocks[request_id],
            num_cached,
            num_full,
            self.kv_cache_group_id,
            block_mask=mask,
            block_size=self.block_size,
        )
        self.num_cached_block[request_id] = num_full

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

    def num_freeable_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> int:
        """How many blocks `remove_skipped_blocks` would return to the free queue (shared
        blocks only lose a reference)."""
        table = self.req_to_blocks.get(request_id) or []
        return sum(
            1
            for i in self._skipped_blocks(request_id, total_computed_tokens)
            if table[i].ref_cnt == 1
        )

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

    def free(self, request_id: str) -> None:
        """Give back every block of a finished or preempted request, tail first."""
        table = self.req_to_blocks.pop(request_id, [])
        self.block_pool.free_blocks(reversed(table))
        self.num_cached_block.pop(request_id, None)
        self._partial_hit_reqs.pop(request_id, None)

    # --- prefix lookup: each kind defines the classmethod
    # `find_longest_cache_hit(block_hashes, max_length, kv_cache_group_ids, block_pool,
    # kv_cache_spec, hash_block_size, alignment_tokens)` returning one list of hit blocks per
    # group id (vLLM's signature).


class FullAttentionManager(SingleTypeKVCacheManager):
    """Full attention: every token's KV stays until the request ends."""

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int
    ) -> list[KVCacheBlock]:
        """Nothing: full attention skips no token (vLLM's base method returns at once when
        `get_num_skipped_tokens` is 0; this says so without walking the table)."""
        return []

    def has_slots_for(
        self, request_id: str, num_tokens: int, num_tokens_to_cache: int
    ) -> bool:
        """The table already covers `num_tokens`, no copy-on-write is pending, no block fills
        up by `num_tokens_to_cache` and no key can end inside a block (one hash per block):
        `allocate_new_blocks` would return [] and `cache_blocks` register nothing."""
        table = self.req_to_blocks.get(request_id)
        return (
            table is not None
            and num_tokens <= len(table) * self.block_size
            and num_tokens_to_cache // self.block_size
            <= self.num_cached_block.get(request_id, 0)
            and self.block_size == self.hash_block_size
            and request_id not in self._partial_hit_reqs
        )

    def cache_blocks(
        self,
        request: Request,
        num_tokens: int,
        retention_interval: int | None = None,
        *,
        replay_boundaries: Sequence[int] = (),
    ) -> None:
        """Cache the full blocks, then the partial entries (see
        `_cache_partial_tail_block`)."""
        super().cache_blocks(
            request, num_tokens, retention_interval, replay_boundaries=replay_boundaries
        )
        if (
            self.is_fine_grained
            and num_tokens % self.block_size
            and num_tokens >= self.hash_block_size
        ):
            # refimpl's fine-grained mode: the block being filled answers the prefix ending in
            # it
            table = self.req_to_blocks[request.request_id]
            idx = num_tokens // self.block_size
            if idx < len(table):
                aligned = num_tokens // self.hash_block_size * self.hash_block_size
                self.block_pool.cache_partial_block(
                    request.block_hashes[aligned // self.hash_block_size - 1],
                    table[idx],
                    self.kv_cache_group_id,
                    aligned,
                )
        if self.block_size != self.hash_block_size:
            self._cache_partial_tail_block(request, num_tokens)

    def _cache_partial_tail_block(self, request: Request, num_tokens: int) -> None:
        """Register the prompt's last hash boundary when it ends inside a block (vLLM 0.32).

        A resend of the same prompt can reuse at most `num_prompt_tokens - 1` tokens (an eagle
        lookup reads the whole prompt before dropping), so only that boundary, rounded down to
        the hash unit, gets a partial entry; boundaries between it and the block start do not.
        """
        hash_block_size = self.hash_block_size
        limit = request.num_prompt_tokens if self.use_eagle else request.num_prompt_tokens - 1
        boundary = limit // hash_block_size * hash_block_size
        if boundary == 0 or boundary > num_tokens or boundary % self.block_size == 0:
            return
        table = self.req_to_blocks[request.request_id]
        idx = boundary // self.block_size
        if idx >= len(table):
            return
        self.block_pool.cache_partial_block(
            request.block_hashes[boundary // hash_block_size - 1],
            table[idx],
            self.kv_cache_group_id,
            boundary,
        )

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[BlockHash],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: AttentionSpec,
        hash_block_size: int | None = None,
        alignment_tokens: int | None = None,
        drop_eagle_block: bool = False,
    ) -> tuple[list[KVCacheBlock], ...]:
        """Cached blocks from the start, stopping at the first miss, trimmed to the alignment.

        `drop_eagle_block`: eagle/MTP drafting needs the hidden states of the tokens just
        before the generation point, so one block (one alignment unit if smaller) of the hit is
        given up and recomputed.
        """
        bs = kv_cache_spec.block_size
        hashes = resolve_block_hashes(block_hashes, hash_block_size or bs, bs)
        alignment = alignment_tokens or bs
        computed: tuple[list[KVCacheBlock], ...] = tuple([] for _ in kv_cache_group_ids)
        for j in range(min(max_length // bs, len(hashes))):
            cached = block_pool.get_cached_block(hashes[j], kv_cache_group_ids)
            if cached is None:
                break
            for table, block in zip(computed, cached):
                table.append(block)
        hit_length = len(computed[0]) * bs
        if drop_eagle_block and hit_length > 0:
            hit_length -= min(alignment, bs)
        hit_length -= hit_length % alignment
        for table in computed:
            del table[cdiv(hit_length, bs) :]
        return computed

    @classmethod
    def find_partial_block_hit(
        cls,
        block_hashes: Sequence[BlockHash],
        num_full_blocks: int,
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: AttentionSpec,
        hash_block_size: int,
        alignment_tokens: int,
    ) -> tuple[tuple[KVCacheBlock, ...], int] | None:
        """Fine-grained phase: after `num_full_blocks` whole-block hits, the longest aligned
        prefix that ends inside the next block and is registered as a partial block.

        Returns (one block per group, tokens used from it) or None.
        """
        bs = kv_cache_spec.block_size
        start = num_full_blocks * bs
        for used in range(bs - alignment_tokens, 0, -alignment_tokens):
            end = start + used
            if end > max_length or end // hash_block_size > len(block_hashes):
                continue
            cached = block_pool.get_cached_block(
                block_hashes[end // hash_block_size - 1], kv_cache_group_ids
            )
            if cached is not None:
                return tuple(cached), used
        return None


class SlidingWindowManager(SingleTypeKVCacheManager):
    """Sliding window of `W` tokens: token p reads positions [p - W + 1, p]."""

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        kv_cache_group_id: int,
        **kwargs,
    ) -> None:
        super().__init__(kv_cache_spec, block_pool, kv_cache_group_id, **kwargs)
        self.sliding_window: int = self.kv_cache_spec.sliding_window  # the spec checked it

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """The next token to compute sits at `num_computed_tokens`; it reads back W - 1
        tokens."""
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def max_admission_blocks_per_request(self) -> int | None:
        """Window plus the tokens in flight, one more because the window may start
        mid-block."""
        if self.max_in_flight_tokens is None:
            return None
        return cdiv(self.sliding_window - 1 + self.max_in_flight_tokens, self.block_size) + 1

    @staticmethod
    def contiguous_blocks_for_hit(
        sliding_window: int, block_size: int, use_eagle: bool
    ) -> int:
        """Cached blocks a hit needs right before its end: the last W - 1 tokens, plus one
        block with eagle (that block is matched and then dropped, see
        `find_longest_cache_hit`)."""
        return cdiv(sliding_window - 1, block_size) + (1 if use_eagle else 0)

    @classmethod
    def reachable_block_mask(
        cls,
        start_block: int,
        end_block: int,
        alignment_tokens: int,
        kv_cache_spec: AttentionSpec,
        use_eagle: bool,
        retention_interval: int | None = None,
        reachable_boundaries: Sequence[int] = (),
    ) -> list[bool] | None:
        """Which of blocks [start_block, end_block) to hash (vLLM's retention rules).

        A hit can end only on an alignment boundary and needs only the `need` blocks just
        before it (`contiguous_blocks_for_hit`), so a block elsewhere can never serve a hit.
        Where the kept tails are:
        - `retention_interval=None` (dense): before every alignment boundary;
        - `0` (vLLM's default): only before the reachable boundaries, the positions a later
          request can actually resume at (the prompt's replay boundary and a shared-prefix
          junction a lookup reported);
        - a positive multiple of the alignment: before every boundary of that interval, plus
          the reachable ones.
        With eagle the run ends one block later (`shift`), on the block the lookup drops. A
        window of one token needs no block before the hit, so nothing is hashed.
        """
        bs = kv_cache_spec.block_size
        if alignment_tokens % bs:
            return None  # the mask is per block; a finer alignment cannot be expressed
        need = cls.contiguous_blocks_for_hit(kv_cache_spec.sliding_window, bs, use_eagle)
        shift = 1 if use_eagle else 0
        mask = [False] * (end_block - start_block)
        segment = alignment_tokens if retention_interval is None else retention_interval
        if segment:
            per_segment = segment // bs
            if need >= per_segment:
                return None  # every block is the tail of some boundary
            for i in range(max(start_block, shift), end_block):
                mask[i - start_block] = (i - shift) % per_segment >= per_segment - need
        if retention_interval is not None:
            for boundary in reachable_boundaries:
                end = boundary // alignment_tokens * alignment_tokens // bs + shift
                for j in range(max(start_block, end - need), min(end_block, end)):
                    mask[j - start_block] = True
        return mask

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[BlockHash],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: AttentionSpec,
        hash_block_size: int | None = None,
        alignment_tokens: int | None = None,
        drop_eagle_block: bool = False,
    ) -> tuple[list[KVCacheBlock], ...]:
        """Scan right to left for `cdiv(W - 1, block_size)` contiguous cached blocks ending on
        an alignment boundary; everything before the run is the null block.

        `drop_eagle_block`: the run needs one more block, which ends on the boundary and is
        then dropped (eagle recomputes it), so the hit still ends on an alignment boundary.
        """
        block_size = kv_cache_spec.block_size
        hashes = BlockHashListWithBlockSize(
            block_hashes, hash_block_size or block_size, block_size
        )
        alignment = alignment_tokens or block_size
        sliding_window_contiguous_blocks = cls.contiguous_blocks_for_hit(
            kv_cache_spec.sliding_window, block_size, drop_eagle_block
        )
        max_num_blocks = min(max_length // block_size, len(hashes))
        computed_blocks = tuple(
            [block_pool.null_block] * max_num_blocks for _ in kv_cache_group_ids
        )
        num_contiguous_blocks = 0
        match_found = False
        for i in range(max_num_blocks - 1, -1, -1):
            cached_blocks = block_pool.get_cached_block(hashes[i], kv_cache_group_ids)
            if cached_blocks is None:
                num_contiguous_blocks = 0
                continue
            if num_contiguous_blocks == 0:
                end_after_drop = i if drop_eagle_block else i + 1
                if (end_after_drop * block_size) % alignment != 0:
                    continue  # a hit may only end on an alignment boundary
            for computed, cached in zip(computed_blocks, cached_blocks):
                computed[i] = cached
            num_contiguous_blocks += 1
            if num_contiguous_blocks >= sliding_window_contiguous_blocks:
                for computed in computed_blocks:
                    del computed[i + num_contiguous_blocks :]
                match_found = True
                break
        if not match_found:
            # Too short a run anywhere: only a run starting at block 0 counts (nothing before
            # it is needed), trimmed down to the alignment.
            for computed in computed_blocks:
                del computed[num_contiguous_blocks:]
            while (
                computed_blocks[0] and (len(computed_blocks[0]) * block_size) % alignment != 0
            ):
                for computed in computed_blocks:
                    computed.pop()
        if drop_eagle_block and computed_blocks[0]:
            for computed in computed_blocks:
                computed.pop()
            while (
                computed_blocks[0] and (len(computed_blocks[0]) * block_size) % alignment != 0
            ):
                for computed in computed_blocks:
                    computed.pop()
        return computed_blocks


def make_manager(
    kv_cache_spec: KVCacheGroupSpec | KVCacheSpec,
    block_pool: BlockPool,
    kv_cache_group_id: int,
    **kwargs,
) -> SingleTypeKVCacheManager:
    """The manager class for a spec: a sliding window gets `SlidingWindowManager`, else full
    attention. Chunked local and Mamba groups are planned (kv_cache_planning) but refimpl has
    no allocator for them (vLLM's ChunkedLocalAttentionManager, MambaManager)."""
    spec = unwrap_spec(kv_cache_spec)
    if isinstance(spec, (ChunkedLocalAttentionSpec, MambaSpec)):
        raise ValueError(
            f"refimpl's allocator has no manager for {type(spec).__name__} groups; they can "
            "be planned (plan_kv_cache) but not allocated"
        )
    cls = (
        SlidingWindowManager
        if isinstance(unwrap_spec(kv_cache_spec), SlidingWindowSpec)
        else FullAttentionManager
    )
    return cls(kv_cache_spec, block_pool, kv_cache_group_id, **kwargs)
