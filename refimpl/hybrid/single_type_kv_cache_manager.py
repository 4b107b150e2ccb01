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

Mamba hybrids (granite-4.0-h, Jamba, Qwen3-Next, Nemotron-H, Falcon-H1) add `MambaManager`:
a recurrent state instead of per-token KV, one block per request without prefix caching, and
with it ("align") one state per attention block, of which only the running one and the ones
the prefix cache registered are kept.

Prefix hashes arrive at `hash_block_size` granularity (the gcd of the group block sizes, 4 for
DeepSeek V4); a manager views them at its own block size by taking the hash at the last
sub-boundary of each block, which is valid because the hashes chain over the whole prefix.

Llama 4's chunked local layers get `ChunkedLocalAttentionManager`: the blocks of
finished chunks are freed like a window's, and a hit needs only the blocks of its last chunk.
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
from refimpl.hybrid.kv_cache_utils import (
    BlockHash,
    KVCacheBlock,
    make_block_hash_with_group_id,
)
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


def append_cached_run(
    computed: tuple[list[KVCacheBlock], ...],
    hashes: Sequence[BlockHash],
    start: int,
    stop: int,
    kv_cache_group_ids: Sequence[int],
    block_pool: BlockPool,
) -> None:
    """Append each group's cached blocks for hashes[start:stop], stopping at the first miss:
    a hit must be contiguous, since a block's hash covers the whole prefix before it."""
    for j in range(start, stop):
        cached = block_pool.get_cached_block(hashes[j], kv_cache_group_ids)
        if cached is None:
            return
        for table, block in zip(computed, cached):
            table.append(block)


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
        prefill_end: int = 0,
    ) -> int:
        """Blocks this group must take from the free queue to hold `num_tokens` tokens.

        Prefix hits that sit in the free queue (ref_cnt 0) count too: touching them takes them
        out of the queue, so they are no longer available to anyone else. `prefill_end` (where
        the request's prefill ends, 0 under non-zero retention) is read by Mamba only.
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

    def new_step_starts(self) -> None:
        """A scheduler step begins (Mamba forgets the keys registered in the previous one)."""

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
        stop = min(max_length // bs, len(hashes))
        append_cached_run(computed, hashes, 0, stop, kv_cache_group_ids, block_pool)
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


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Chunked local attention of `C` tokens (Llama 4's local layers): token p reads only the
    tokens of its own chunk, positions [p // C * C, p].

    Once a chunk is done, no later token reads its KV, so its blocks are freed and replaced
    by the null block (the base `remove_skipped_blocks`), and a prefix hit needs only the
    blocks of the chunk it ends in: everything before that chunk counts as computed for free.
    Every full block is hashed (vLLM applies no retention to chunked groups: they cache
    densely). As in vLLM 0.32, hits end on this group's block boundaries (the group's block
    must be the scheduler block) and eagle drafting is refused; both are checked at lookup,
    where vLLM checks them, so a cache without prefix caching accepts them.
    """

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        kv_cache_group_id: int,
        **kwargs,
    ) -> None:
        super().__init__(kv_cache_spec, block_pool, kv_cache_group_id, **kwargs)
        self.attention_chunk_size: int = self.kv_cache_spec.attention_chunk_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """The next token sits at `num_computed_tokens` and reads back to the start of its
        chunk: every whole chunk before it is skipped (at a chunk start, all of them)."""
        return num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size

    def max_admission_blocks_per_request(self) -> int | None:
        """One chunk plus the tokens in flight (vLLM's rule: no extra block for a window
        that starts mid-block, unlike a sliding window).

        vLLM also caps the tokens at `max_model_len`; a request never asks for more blocks
        than that, so the cap changes nothing and is left out."""
        if self.max_in_flight_tokens is None:
            return None
        return cdiv(self.attention_chunk_size + self.max_in_flight_tokens, self.block_size)

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
        """Null blocks up to the start of the chunk that `max_length` falls in, then the cached
        blocks of that chunk from its start, stopping at the first miss.

        The blocks before the chunk are never read again, so they are a hit whether cached or
        not: a lookup that stops at a chunk start hits all of it with nulls alone. (The hit
        length is the number of blocks returned times the block size.)
        """
        block_size = kv_cache_spec.block_size
        if drop_eagle_block:
            raise ValueError(
                "eagle/MTP drafting with a chunked local attention group is not supported "
                "(vLLM 0.32 refuses it too)"
            )
        if (alignment_tokens or block_size) != block_size:
            raise ValueError(
                f"chunked local attention hits end on its block size {block_size}, not on "
                f"alignment_tokens {alignment_tokens} (vLLM 0.32 needs equal block sizes)"
            )
        hashes = resolve_block_hashes(block_hashes, hash_block_size or block_size, block_size)
        chunk = kv_cache_spec.attention_chunk_size
        max_num_blocks = min(max_length // block_size, len(hashes))
        chunk_start_block = max_length // chunk * chunk // block_size
        computed_blocks = tuple(
            [block_pool.null_block] * chunk_start_block for _ in kv_cache_group_ids
        )
        append_cached_run(
            computed_blocks,
            hashes,
            chunk_start_block,
            max_num_blocks,
            kv_cache_group_ids,
            block_pool,
        )
        return computed_blocks


def get_mamba_prefill_checkpoint_position(num_tokens: int, block_size: int) -> int:
    """The last block boundary strictly before `num_tokens`: where a prefill of `num_tokens`
    tokens leaves a reusable Mamba state (a resend recomputes at least its last token)."""
    return max((num_tokens - 1) // block_size * block_size, 0)


def is_mamba_prefill_checkpoint_valid(
    query_start: int,
    query_end: int,
    checkpoint_position: int,
    hash_block_size: int,
    mamba_block_size: int,
    checkpoint_alignment: int | None,
) -> bool:
    """Can the Mamba kernel export the state at `checkpoint_position` from inside the chunk
    [query_start, query_end)? Only where the layer keeps a checkpoint block (vLLM's Mamba2
    mixer, alignment 1), the chunk starts on a hash boundary and the checkpoint lands in a
    later column than the chunk's initial state."""
    if checkpoint_alignment is None:
        return False
    initial_state_col = (query_start - 1) // mamba_block_size
    checkpoint_col = cdiv(query_end, mamba_block_size) - 2
    return (
        query_start % hash_block_size == 0
        and checkpoint_col > initial_state_col
        and query_start + hash_block_size <= checkpoint_position
        and query_start < checkpoint_position < query_end
        and (checkpoint_position - query_start) % checkpoint_alignment == 0
    )


def mamba_prefill_checkpoint_alignment(spec: MambaSpec) -> int | None:
    """Token alignment at which the layer can export a state mid-chunk: 1 for a layer that
    keeps a prefill checkpoint block (vLLM's Mamba2 mixer), None (cannot) otherwise."""
    return 1 if spec.num_prefill_checkpoint_blocks > 0 else None


class MambaManager(SingleTypeKVCacheManager):
    """Recurrent state of Mamba / linear-attention layers: one state, not one slot per token.

    Mode "none" (prefix caching off) is the base manager with a block of `max_model_len`
    tokens: one state block per request (plus one per speculative token). Mode "align"
    (prefix caching on) gives the state blocks the attention block size; slot p of the table
    holds the state after (p + 1) * block_size tokens, so the scheduler ends prefill chunks on
    block boundaries (`Scheduler._mamba_block_aligned_split`). Only the running state is kept:
    every older slot becomes the null block, except the blocks the prefix cache registered,
    which the pool keeps until evicted. A layer with a prefill checkpoint block (Mamba2) also
    exports the state at the last block boundary inside the prompt's final chunk, so that
    chunk need not stop there.
    """

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        kv_cache_group_id: int,
        **kwargs,
    ) -> None:
        super().__init__(kv_cache_spec, block_pool, kv_cache_group_id, **kwargs)
        spec: MambaSpec = self.kv_cache_spec  # type: ignore[assignment]
        self.mamba_cache_mode = spec.mamba_cache_mode
        if self.mamba_cache_mode == "align" and self.alignment_tokens != self.block_size:
            raise ValueError(
                f"Mamba 'align' mode needs hits aligned to its block size {self.block_size}, "
                f"got alignment_tokens {self.alignment_tokens} (sub-block hits: not modelled)"
            )
        self.num_speculative_blocks = spec.num_speculative_blocks
        self.checkpoint_alignment = mamba_prefill_checkpoint_alignment(spec)
        self.has_prefill_checkpoint_blocks = (
            self.mamba_cache_mode == "align" and spec.num_prefill_checkpoint_blocks > 0
        )
        # keys registered this step: their states are computed only by this step's forward
        self.cached_blocks_this_step: set = set()
        # align mode: retired slots, requests with blocks, checkpoint slots reserved
        self._num_retired_blocks: dict[str, int] = {}
        self._allocated_block_reqs: set[str] = set()
        self._checkpoints: dict[str, tuple[int, int]] = {}

    # --- lookup
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
        """The last cached state at or before `max_length`, scanning right to left: a state
        alone resumes the recurrence, so everything before it is the null block. (Draft models
        have no Mamba layers: an eagle lookup drops nothing here.)"""
        bs = kv_cache_spec.block_size
        hashes = BlockHashListWithBlockSize(block_hashes, hash_block_size or bs, bs)
        alignment = alignment_tokens or bs
        computed: tuple[list[KVCacheBlock], ...] = tuple([] for _ in kv_cache_group_ids)
        for i in range(min(max_length // bs, len(hashes)) - 1, -1, -1):
            cached = block_pool.get_cached_block(hashes[i], kv_cache_group_ids)
            if cached is None or (i + 1) * bs % alignment:
                continue
            for table, block in zip(computed, cached):
                table.extend([block_pool.null_block] * i)
                table.append(block)
            break
        return computed

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
        """Which states of blocks [start_block, end_block) to register: all (None, dense);
        with retention 0 only the state ending on each reachable boundary (the prompt's replay
        point, a junction); with k also the last state of every k-token segment."""
        if retention_interval is None or alignment_tokens is None:
            return None
        bs = kv_cache_spec.block_size
        mask = [False] * (end_block - start_block)
        if retention_interval:
            per_segment = retention_interval // bs
            if per_segment <= 1:
                return None
            first = (start_block + per_segment) // per_segment * per_segment - 1
            for i in range(first - start_block, len(mask), per_segment):
                mask[i] = True
        for boundary in reachable_boundaries:
            block = boundary // alignment_tokens * alignment_tokens // bs - 1
            if start_block <= block < end_block:
                mask[block - start_block] = True
        return mask

    # --- counting and allocation
    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Only the state after the last computed token is read."""
        return num_computed_tokens - 1

    def _needs_internal_checkpoint(
        self,
        request_id: str,
        query_start: int,
        query_end: int,
        checkpoint_position: int,
        prefill_end: int,
    ) -> bool:
        """Does the chunk [query_start, query_end) reserve a block for the state the kernel
        exports at `checkpoint_position` (the prompt's final chunk, or every chunk under
        dense retention, where `prefill_end` is 0)?"""
        checkpoint_idx = cdiv(query_end, self.block_size) - 2
        blocks = self.req_to_blocks[request_id]
        return (
            self.has_prefill_checkpoint_blocks
            and query_end >= prefill_end
            and is_mamba_prefill_checkpoint_valid(
                query_start,
                query_end,
                checkpoint_position,
                self.hash_block_size,
                self.block_size,
                self.checkpoint_alignment,
            )
            and checkpoint_idx >= 0
            and (
                checkpoint_idx >= len(blocks)
                or blocks[checkpoint_idx].is_null
                or (
                    request_id in self._allocated_block_reqs
                    and checkpoint_idx >= len(blocks) - self.num_speculative_blocks
                )
            )
        )

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
        total_computed_tokens: int = 0,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """Blocks this step takes. A hit on a state registered in this same step is refused
        (more blocks than the pool has): its state exists only after this step's forward.
        In "align" mode a step needs at most the new running state, a checkpoint block and
        the speculative blocks (lookahead tokens do not count: draft models have no Mamba
        layers); the count may be negative when the table is ahead, as in vLLM."""
        if new_computed_blocks and new_computed_blocks[-1].block_hash in (
            self.cached_blocks_this_step
        ):
            return self.block_pool.num_gpu_blocks + 1
        if self.mamba_cache_mode != "align":
            return super().get_num_blocks_to_allocate(
                request_id,
                num_tokens + self.block_size * self.num_speculative_blocks,
                new_computed_blocks,
                total_computed_tokens,
                apply_admission_cap,
            )
        table = self.req_to_blocks[request_id]
        num_new = (
            cdiv(num_tokens, self.block_size)
            + self.num_speculative_blocks
            - len(new_computed_blocks)
            - len(table)
        )
        position = get_mamba_prefill_checkpoint_position(num_tokens, self.alignment_tokens)
        if not self._needs_internal_checkpoint(
            request_id, total_computed_tokens, num_tokens, position, prefill_end
        ):
            position = 0
        if not apply_admission_cap:
            if position > 0:
                self._checkpoints[request_id] = (
                    position,
                    cdiv(num_tokens, self.block_size) - 2,
                )
            else:
                self._checkpoints.pop(request_id, None)
        if num_new > 0:
            cap = 1 + int(position > 0)
            if request_id not in self._allocated_block_reqs:
                cap += self.num_speculative_blocks
            num_new = min(num_new, cap)
        revived = sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and not b.is_null)
        return num_new + revived

    def _plan_align_allocation(
        self, request_id: str, num_tokens: int
    ) -> tuple[int, int, list]:
        """Align mode: (nulls to append, blocks to take from the pool, speculative slots to
        move to the table's end) for `allocate_new_blocks(request_id, num_tokens)`."""
        table = self.req_to_blocks.get(request_id, [])
        prev_len = len(table)
        required = cdiv(num_tokens, self.block_size) + self.num_speculative_blocks
        checkpoint_block = int(request_id in self._checkpoints)
        if required <= prev_len and not checkpoint_block:
            return 0, 0, []
        num_skipped = required - self.num_speculative_blocks - 1
        num_nulls = max(num_skipped - checkpoint_block - prev_len, 0)
        moved = []
        if request_id in self._allocated_block_reqs:
            # speculative slots the new running state leaves behind (owned by this request
            # alone) move to the end; the checkpoint slot stays where the kernel writes it
            for idx in range(prev_len - self.num_speculative_blocks, prev_len):
                if idx >= num_skipped - checkpoint_block:
                    break
                moved.append(idx)
        num_new = max(required - (prev_len + num_nulls + len(moved)), 0)
        return num_nulls, num_new, moved

    def num_new_blocks_needed(self, request_id: str, num_tokens: int) -> int:
        """Blocks `allocate_new_blocks` takes from the pool (align: the new running state,
        a checkpoint slot, speculative slots)."""
        if self.mamba_cache_mode != "align":
            return super().num_new_blocks_needed(
                request_id, num_tokens + self.block_size * self.num_speculative_blocks
            )
        return self._plan_align_allocation(request_id, num_tokens)[1]

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Mode "none": the base rule. Mode "align": the table grows to the slot of the new
        running state; the slots in between become null blocks (except a reserved checkpoint
        slot) and speculative slots left behind move to the end. Returns the table's new
        entries, null blocks included (vLLM sends them too)."""
        if self.mamba_cache_mode != "align":
            # one state block (plus the speculative ones), never a prefix hit to copy
            needed = self.num_new_blocks_needed(request_id, num_tokens)
            if needed > self.block_pool.get_num_free_blocks():
                raise ValueError(
                    f"request {request_id} needs {needed} Mamba state blocks in group "
                    f"{self.kv_cache_group_id} but only "
                    f"{self.block_pool.get_num_free_blocks()} are free; nothing was allocated"
                )
            new_blocks = self.block_pool.get_new_blocks(needed)
            self.req_to_blocks[request_id].extend(new_blocks)
            return new_blocks
        num_nulls, num_new, moved = self._plan_align_allocation(request_id, num_tokens)
        if num_new > self.block_pool.get_num_free_blocks():
            raise ValueError(
                f"request {request_id} needs {num_new} Mamba state blocks in group "
                f"{self.kv_cache_group_id} but only {self.block_pool.get_num_free_blocks()} "
                "are free; nothing was allocated"
            )
        table = self.req_to_blocks[request_id]
        required = cdiv(num_tokens, self.block_size) + self.num_speculative_blocks
        if required <= len(table) and request_id not in self._checkpoints:
            self._allocated_block_reqs.add(request_id)
            return []
        prev_len = len(table)
        table.extend([self._null_block] * num_nulls)
        for idx in moved:
            table.append(table[idx])
            table[idx] = self._null_block
        new_blocks = self.block_pool.get_new_blocks(num_new)
        returned = table[prev_len:] + new_blocks
        table.extend(new_blocks)
        self._allocated_block_reqs.add(request_id)
        return returned

    # --- caching
    def cache_blocks(
        self,
        request: Request,
        num_tokens: int,
        retention_interval: int | None = None,
        *,
        replay_boundaries: Sequence[int] = (),
    ) -> None:
        """Register the states, then (align) the prompt's last boundary; every key registered
        now is remembered as this step's (see `get_num_blocks_to_allocate`)."""
        rid = request.request_id
        before = self.num_cached_block.get(rid, 0)
        super().cache_blocks(
            request, num_tokens, retention_interval, replay_boundaries=replay_boundaries
        )
        after = self.num_cached_block.get(rid, 0)
        if self.mamba_cache_mode == "align":
            key = self._cache_partial_tail_block(request, num_tokens)
            if key is not None:
                self.cached_blocks_this_step.add(key)
        table = self.req_to_blocks[rid]
        for block in table[before:after]:
            if not block.is_null and block.block_hash is not None:
                self.cached_blocks_this_step.add(block.block_hash)

    def _cache_partial_tail_block(self, request: Request, num_tokens: int):
        """Register the state at the prompt's last boundary, `(num_prompt_tokens - 1)` rounded
        down (where a resend resumes), when `num_tokens` reaches it; returns its key (also when
        an earlier step registered it: a same-step hit on it is then refused), or None.

        A step with a checkpoint slot registers nothing here. vLLM re-keys that slot at the
        checkpoint, or drops its keys when retention keeps no state there; with block-sized
        hashes (refimpl refuses finer ones) the slot is block `position / block_size - 1`,
        which the full-block pass has just registered under that very key whenever retention
        keeps it, and which came fresh from the pool, without keys, otherwise.
        """
        if request.request_id in self._checkpoints:
            return None
        if num_tokens <= 0 or num_tokens % self.hash_block_size:
            return None
        if num_tokens != get_mamba_prefill_checkpoint_position(
            request.num_prompt_tokens, self.hash_block_size
        ):
            return None
        table = self.req_to_blocks[request.request_id]
        idx = cdiv(num_tokens, self.block_size) - 1
        if idx >= len(table) or table[idx].is_null:
            return None
        key_hash = request.block_hashes[num_tokens // self.hash_block_size - 1]
        self.block_pool.cache_partial_block(
            key_hash, table[idx], self.kv_cache_group_id, num_tokens
        )
        return make_block_hash_with_group_id(key_hash, self.kv_cache_group_id)

    def new_step_starts(self) -> None:
        self.cached_blocks_this_step.clear()

    # --- freeing
    def _removable_blocks(self, request_id: str, total_computed_tokens: int) -> list[int]:
        """Align mode: the slots `remove_skipped_blocks` frees, last first: every non-null
        slot before the one the next token reads, from the retired mark on."""
        table = self.req_to_blocks.get(request_id) or []
        first = self._num_retired_blocks.get(request_id, 0)
        skipped = self.get_num_skipped_tokens(total_computed_tokens)
        last = min(skipped // self.block_size, len(table))
        return [i for i in range(last - 1, first - 1, -1) if not table[i].is_null]

    def num_freeable_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> int:
        if self.mamba_cache_mode != "align":
            return super().num_freeable_skipped_blocks(request_id, total_computed_tokens)
        table = self.req_to_blocks.get(request_id) or []
        indices = self._removable_blocks(request_id, total_computed_tokens)
        return sum(1 for i in indices if table[i].ref_cnt == 1)

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int
    ) -> list[KVCacheBlock]:
        """Align mode: free every state before the one the next token reads, skipping the null
        gaps prefill leaves (a retired mark remembers how far it got). Returns the freed
        blocks.

        vLLM also frees the slot of the previous running state (`last_state_block_idx`) once
        `processed_tokens` passes it; that slot lies below `cdiv(processed, block_size) - 1 ==
        (processed - 1) // block_size`, the bound of this retirement, so it is always freed
        here already.
        """
        if self.mamba_cache_mode != "align":
            return super().remove_skipped_blocks(request_id, total_computed_tokens)
        table = self.req_to_blocks.get(request_id) or []
        skipped = self.get_num_skipped_tokens(total_computed_tokens)
        last = min(skipped // self.block_size, len(table))
        if last <= self._num_retired_blocks.get(request_id, 0):
            return []
        indices = self._removable_blocks(request_id, total_computed_tokens)
        removed = [table[i] for i in indices]
        for i in indices:
            table[i] = self._null_block
        self.block_pool.free_blocks(removed)
        self._num_retired_blocks[request_id] = last
        return removed

    def free(self, request_id: str) -> None:
        """Give back every block and forget the request's align-mode bookkeeping."""
        self._allocated_block_reqs.discard(request_id)
        self._num_retired_blocks.pop(request_id, None)
        self._checkpoints.pop(request_id, None)
        super().free(request_id)


def make_manager(
    kv_cache_spec: KVCacheGroupSpec | KVCacheSpec,
    block_pool: BlockPool,
    kv_cache_group_id: int,
    **kwargs,
) -> SingleTypeKVCacheManager:
    """The manager class for a spec, as vLLM's registry maps them: a sliding window gets
    `SlidingWindowManager`, chunked local attention `ChunkedLocalAttentionManager`, a Mamba
    state `MambaManager` (modes "none" and "align", the two vLLM 0.32 runs), everything else
    full attention."""
    spec = unwrap_spec(kv_cache_spec)
    cls: type[SingleTypeKVCacheManager] = FullAttentionManager
    if isinstance(spec, SlidingWindowSpec):
        cls = SlidingWindowManager
    elif isinstance(spec, ChunkedLocalAttentionSpec):
        cls = ChunkedLocalAttentionManager
    elif isinstance(spec, MambaSpec):
        cls = MambaManager
    return cls(kv_cache_spec, block_pool, kv_cache_group_id, **kwargs)
