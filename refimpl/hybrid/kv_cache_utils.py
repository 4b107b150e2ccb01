"""Small pieces every part of the hybrid cache shares (vLLM v1's `kv_cache_utils.py`).

- `BlockHash`, `hash_block_tokens`: the chained content hash of a block of tokens.
- `make_block_hash_with_group_id` / `get_group_id`: the prefix-cache key, block hash + group
  id.
- `KVCacheBlock`: bookkeeping of one block (ref count, prefix-cache key, free-queue links).
- `FreeKVCacheBlockQueue`: a doubly linked list threaded through the blocks themselves, with
  fake
  head and tail sentinels, so popleft / remove / append / prepend are all O(1).

- Capacity, where vLLM 0.32 has it: what one request reserves per group
  (`get_num_blocks_per_request`), the memory check (`check_enough_kv_cache_memory`), the
  startup figures (`get_kv_cache_capacity`: tokens and maximum concurrency), and
  `plan_kv_cache`, the one call that plans a model and says why.

vLLM 0.32 keeps the planner (grouping, layout) here too; refimpl has it in
`kv_cache_planning.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import xxhash

from refimpl.errors import InvariantError
from refimpl.hybrid.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    cdiv,
)
from refimpl.hybrid.kv_cache_layout import KVCacheLayout
from refimpl.hybrid.kv_cache_planning import (
    add_kv_sharing_layers_to_kv_cache_groups,
    get_kv_cache_bytes_per_block,
    get_kv_cache_config,
    get_kv_cache_groups,
    get_num_padding_layers,
    resolve_kv_cache_layout,
)
from refimpl.validation import check_bool, check_int_at_least, check_positive_int

BlockHash = bytes
"""A chained content hash of a prefix (see `hash_block_tokens`)."""

BlockHashWithGroupId = bytes
"""A prefix-cache key: the block hash followed by the group id as 4 big-endian bytes."""


def make_block_hash_with_group_id(
    block_hash: BlockHash, group_id: int
) -> BlockHashWithGroupId:
    """Key of a block in the prefix cache: the same prefix cached by two groups gives two
    keys."""
    return block_hash + group_id.to_bytes(4, "big")


def get_group_id(key: BlockHashWithGroupId) -> int:
    """The group id stored in the last 4 bytes of a prefix-cache key."""
    return int.from_bytes(key[-4:], "big")


class KVCacheBlock:
    """Metadata of one block of the pool; the bytes themselves live in the cache tensors.

    `ref_cnt` counts the block tables holding this block. A block with `ref_cnt == 0` sits in
    the free queue but may still carry a hash ("lazily freed"): a prefix hit can revive it
    until `get_new_blocks` hands it to someone else and its hash is dropped.

    `block_hash_num_tokens` is the prefix length the key stands for: the end of the block for a
    full block, a point inside it for a partial entry (vLLM's `_cache_partial_tail_block`).

    `block_hash` is read as an attribute but changed only by `set_block_hash` (which refuses a
    block that has one) and `reset_hash`. vLLM wraps it in a property; here it is a plain slot,
    because the pool reads it for every block it hands out, frees or registers, millions of
    times on a long trace, and a property read is a call.
    """

    __slots__ = (
        "block_id",
        "ref_cnt",
        "block_hash",
        "block_hash_num_tokens",
        "prev_free_block",
        "next_free_block",
        "is_null",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHashWithGroupId | None = None
        self.block_hash_num_tokens: int | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False

    def set_block_hash(self, key: BlockHashWithGroupId, num_tokens: int | None = None) -> None:
        """Give the block its prefix-cache key; a block is hashed once until `reset_hash`."""
        if self.block_hash is not None:
            raise InvariantError(
                f"block {self.block_id} already has a hash; reset it before re-hashing"
            )
        self.block_hash = key
        self.block_hash_num_tokens = num_tokens

    def reset_hash(self) -> None:
        """Forget the prefix-cache key (the block is about to hold other tokens)."""
        self.block_hash = None
        self.block_hash_num_tokens = None

    def __repr__(self) -> str:
        tag = ", null" if self.is_null else ""
        hashed = ", hashed" if self.block_hash is not None else ""
        return f"KVCacheBlock({self.block_id}, ref_cnt={self.ref_cnt}{hashed}{tag})"


class FreeKVCacheBlockQueue:
    """Free blocks in eviction order, head first, as a doubly linked list with sentinels.

    The links live on the blocks (`prev_free_block` / `next_free_block`), so removing a block
    found by a prefix hit needs no search. The sentinels mean no operation special-cases an
    empty list or an end of the list.
    """

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        chain = [self.fake_free_list_head, *blocks, self.fake_free_list_tail]
        for left, right in zip(chain, chain[1:]):
            left.next_free_block = right
            right.prev_free_block = left

    def popleft(self) -> KVCacheBlock:
        """Take the head block (the next to be reused)."""
        first = self.fake_free_list_head.next_free_block
        if first is self.fake_free_list_tail or first is None:
            raise ValueError("no free blocks left: popleft from an empty free queue")
        self._unlink(first)
        return first

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Take the first `n` blocks, in queue order (one walk, then one relink, as vLLM)."""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks: only {self.num_free_blocks} are free")
        if n <= 0:
            return []
        head = self.fake_free_list_head
        out = []
        block = head.next_free_block
        for _ in range(n):  # (n <= num_free_blocks: the walk never reaches the tail)
            out.append(block)
            after = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = after
        assert block is not None
        head.next_free_block = block
        block.prev_free_block = head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        """Take a block out from anywhere in the queue in O(1) (a prefix hit revives it)."""
        if block.prev_free_block is None or block.next_free_block is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        self._unlink(block)

    def append(self, block: KVCacheBlock) -> None:
        """Put a block at the tail: it will be reused last (LRU for cached blocks)."""
        self._link_before(self.fake_free_list_tail, block)

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Put blocks at the tail, keeping their order: the last one is reused last."""
        self._link_n_before(self.fake_free_list_tail, blocks)

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put blocks at the head, keeping their order: blocks[0] becomes the new head."""
        anchor = self.fake_free_list_head.next_free_block
        assert anchor is not None
        self._link_n_before(anchor, blocks)

    def _link_n_before(self, anchor: KVCacheBlock, blocks: Iterable[KVCacheBlock]) -> None:
        """`_link_before(anchor, block)` for each block in order, as one chain: the blocks
        are linked to each other, then the chain's ends to the list (as vLLM's append_n)."""
        before = anchor.prev_free_block
        assert before is not None
        count = 0
        for block in blocks:
            if block.prev_free_block is not None or block.next_free_block is not None:
                # keep the list whole: close the chain linked so far, then refuse
                before.next_free_block = anchor
                anchor.prev_free_block = before
                self.num_free_blocks += count
                raise ValueError(f"block {block.block_id} is already in the free queue")
            before.next_free_block = block
            block.prev_free_block = before
            before = block
            count += 1
        before.next_free_block = anchor
        anchor.prev_free_block = before
        self.num_free_blocks += count

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The free blocks in queue order (head first); O(n), for tests and pictures."""
        return list(self)

    def __iter__(self) -> Iterator[KVCacheBlock]:
        node = self.fake_free_list_head.next_free_block
        while node is not None and node is not self.fake_free_list_tail:
            yield node
            node = node.next_free_block

    def __len__(self) -> int:
        return self.num_free_blocks

    def _link_before(self, anchor: KVCacheBlock, block: KVCacheBlock) -> None:
        if block.prev_free_block is not None or block.next_free_block is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        before = anchor.prev_free_block
        assert before is not None
        before.next_free_block = block
        block.prev_free_block = before
        block.next_free_block = anchor
        anchor.prev_free_block = block
        self.num_free_blocks += 1

    def _unlink(self, block: KVCacheBlock) -> None:
        before, after = block.prev_free_block, block.next_free_block
        assert before is not None and after is not None
        before.next_free_block = after
        after.prev_free_block = before
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1


NONE_HASH: BlockHash = xxhash.xxh3_128(b"refimpl NONE_HASH").digest()
"""Parent hash of the first block. Fixed (vLLM draws it at random unless PYTHONHASHSEED is set)
so that notebook output is reproducible."""


def hash_block_tokens(
    parent_block_hash: BlockHash | None, token_ids: Sequence[int]
) -> BlockHash:
    """Hash of a prefix: 128-bit xxh3 over the parent's hash and this block's tokens
    (int64)."""
    h = xxhash.xxh3_128()
    h.update(parent_block_hash if parent_block_hash is not None else NONE_HASH)
    h.update(np.asarray(token_ids, dtype="<i8").tobytes())
    return h.digest()


# --- capacity: how many tokens and requests a plan holds (vLLM 0.32's kv_cache_utils)

GIB = 1 << 30


def get_max_in_flight_tokens(
    max_num_batched_tokens: int, *, async_scheduling: bool, pipeline_parallel_size: int = 1
) -> int:
    """Tokens scheduled but not yet finished (vLLM's `VllmConfig.max_in_flight_tokens`).

    Every batch in flight may hold `max_num_batched_tokens`; async scheduling keeps two
    batches in flight (one stage), pipeline parallelism one per stage. A sliding-window or
    chunked layer frees blocks only for finished tokens, so it reserves for these too.
    """
    check_positive_int("max_num_batched_tokens", max_num_batched_tokens)
    check_positive_int("pipeline_parallel_size", pipeline_parallel_size)
    batches = pipeline_parallel_size
    if async_scheduling:
        batches = pipeline_parallel_size + 1 if pipeline_parallel_size > 1 else 2
    return batches * max_num_batched_tokens


def max_memory_usage_bytes(
    specs: Iterable[KVCacheSpec], *, max_model_len: int, max_in_flight_tokens: int
) -> int:
    """Bytes one request at `max_model_len` needs, layer by layer (no grouping, no padding)."""
    return sum(
        s.max_memory_usage_bytes(
            max_model_len=max_model_len, max_in_flight_tokens=max_in_flight_tokens
        )
        for s in specs
    )


def get_num_blocks_per_request(
    group: KVCacheGroupSpec, *, max_model_len: int, max_in_flight_tokens: int
) -> int:
    """Block ids one request at `max_model_len` takes from the pool in this group.

    Full attention: cdiv(max_model_len, block_size). Sliding window: the window - 1 plus the
    tokens in flight, capped at max_model_len, plus one block. Chunked local: a chunk plus the
    tokens in flight. Mamba: one state (two and the checkpoints with prefix caching). A
    uniform-type group takes the most any member needs.
    """
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return spec.max_memory_usage_pages(
            max_model_len=max_model_len, max_in_flight_tokens=max_in_flight_tokens
        )
    need = spec.max_memory_usage_bytes(
        max_model_len=max_model_len, max_in_flight_tokens=max_in_flight_tokens
    )
    return cdiv(need, spec.page_size_bytes)


def max_memory_usage_bytes_from_groups(
    groups: Sequence[KVCacheGroupSpec],
    *,
    max_model_len: int,
    max_in_flight_tokens: int,
    kv_cache_layout: str | KVCacheLayout | None = None,
) -> int:
    """Bytes one request at `max_model_len` takes from the pool (vLLM's
    `_max_memory_usage_bytes_from_groups`): every group draws whole blocks of the pool's
    block size, so padding layers and the widest group's block count too."""
    per_block = get_kv_cache_bytes_per_block(groups, kv_cache_layout)
    blocks = sum(
        get_num_blocks_per_request(
            g, max_model_len=max_model_len, max_in_flight_tokens=max_in_flight_tokens
        )
        for g in groups
    )
    return per_block * blocks


def estimate_max_model_len_from_groups(
    groups: Sequence[KVCacheGroupSpec],
    available_memory: int,
    *,
    max_model_len: int,
    max_in_flight_tokens: int,
    kv_cache_layout: str | KVCacheLayout | None = None,
) -> int:
    """The longest request (<= max_model_len) whose blocks fit in `available_memory`, by
    binary search; 0 when not even one token fits."""

    def fits(length: int) -> bool:
        need = max_memory_usage_bytes_from_groups(
            groups,
            max_model_len=length,
            max_in_flight_tokens=max_in_flight_tokens,
            kv_cache_layout=kv_cache_layout,
        )
        return need <= available_memory

    if not fits(1):
        return 0
    lo, hi, best = 1, max_model_len, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def auto_fit_max_model_len(
    groups: Sequence[KVCacheGroupSpec],
    check_memory: int,
    *,
    max_model_len: int,
    max_in_flight_tokens: int,
    kv_cache_layout: str | KVCacheLayout | None = None,
) -> int:
    """`--max-model-len -1` (or auto): the longest length, up to the config's
    `max_model_len`, at which one request fits in `check_memory` (the budget less the null
    block), as vLLM's `_auto_fit_max_model_len` picks it; a model with no cache groups keeps
    `max_model_len`. Not even one token fitting is a ValueError, as vLLM refuses to start."""
    if not groups:
        return max_model_len
    fitted = estimate_max_model_len_from_groups(
        groups,
        check_memory,
        max_model_len=max_model_len,
        max_in_flight_tokens=max_in_flight_tokens,
        kv_cache_layout=kv_cache_layout,
    )
    if fitted <= 0:
        raise NotEnoughKVCacheMemoryError(
            "cannot auto-fit max_model_len: the KV cache budget does not hold even one token "
            "of one request; raise gpu_memory_utilization or the KV cache budget"
        )
    return min(fitted, max_model_len)


class NotEnoughKVCacheMemoryError(ValueError):
    """The budget cannot hold one request at max_model_len (vLLM refuses to start).

    The figures of the message are kept as attributes (None when the check did not get that
    far): `available_bytes` (after the null block), `needed_bytes` (one request at
    `max_model_len`) and `estimated_max_model_len` (the longest that fits, 0 for none)."""

    def __init__(
        self,
        message: str,
        *,
        available_bytes: int | None = None,
        needed_bytes: int | None = None,
        max_model_len: int | None = None,
        estimated_max_model_len: int | None = None,
    ) -> None:
        super().__init__(message)
        self.available_bytes = available_bytes
        self.needed_bytes = needed_bytes
        self.max_model_len = max_model_len
        self.estimated_max_model_len = estimated_max_model_len


def format_gib(num_bytes: int) -> str:
    """Bytes as GiB with two decimals, as vLLM's messages print them."""
    return f"{round(num_bytes / GIB, 2)}"


def check_enough_kv_cache_memory(
    groups: Sequence[KVCacheGroupSpec],
    available_memory: int,
    *,
    max_model_len: int,
    max_in_flight_tokens: int,
    kv_cache_layout: str | KVCacheLayout | None = None,
) -> None:
    """Raise `NotEnoughKVCacheMemoryError` unless one request at `max_model_len` fits (the
    check vLLM 0.32's `get_kv_cache_configs` runs before it plans).

    vLLM first holds back one block for the block pool's null block, then compares the
    request's blocks (`max_memory_usage_bytes_from_groups`) with what is left; the message
    gives both in GiB and the longest length that would fit.
    """
    check_memory = available_memory - get_kv_cache_bytes_per_block(groups, kv_cache_layout)
    if check_memory <= 0:
        raise NotEnoughKVCacheMemoryError(
            f"no memory is left for KV cache blocks ({available_memory} B available, one "
            "block is held back for the null block); raise gpu_memory_utilization or the KV "
            "cache budget",
            available_bytes=check_memory,
        )
    needed = max_memory_usage_bytes_from_groups(
        groups,
        max_model_len=max_model_len,
        max_in_flight_tokens=max_in_flight_tokens,
        kv_cache_layout=kv_cache_layout,
    )
    if needed > check_memory:
        longest = estimate_max_model_len_from_groups(
            groups,
            check_memory,
            max_model_len=max_model_len,
            max_in_flight_tokens=max_in_flight_tokens,
            kv_cache_layout=kv_cache_layout,
        )
        hint = f" The longest max_model_len that fits is {longest}." if longest else ""
        raise NotEnoughKVCacheMemoryError(
            f"one request at max_model_len {max_model_len} needs {format_gib(needed)} GiB of "
            f"KV cache, more than the {format_gib(check_memory)} GiB available.{hint} Raise "
            "gpu_memory_utilization or lower max_model_len.",
            available_bytes=check_memory,
            needed_bytes=needed,
            max_model_len=max_model_len,
            estimated_max_model_len=longest,
        )


def get_max_concurrency_for_kv_cache_config(
    config: KVCacheConfig, *, max_model_len: int, max_in_flight_tokens: int
) -> float:
    """Requests at `max_model_len` the pool holds at once: num_blocks / the blocks one such
    request takes summed over groups (vLLM counts all `num_blocks`, null block included)."""
    per_request = sum(
        get_num_blocks_per_request(
            g, max_model_len=max_model_len, max_in_flight_tokens=max_in_flight_tokens
        )
        for g in config.kv_cache_groups
    )
    return config.num_blocks / per_request


def get_kv_cache_capacity(
    config: KVCacheConfig, *, max_model_len: int, max_in_flight_tokens: int
) -> tuple[int, float]:
    """vLLM's startup line: ("KV cache size: N tokens", "Maximum concurrency for
    max_model_len tokens per request: X"). N is int(X * max_model_len): tokens of requests at
    max_model_len, not num_blocks x block_size."""
    concurrency = get_max_concurrency_for_kv_cache_config(
        config, max_model_len=max_model_len, max_in_flight_tokens=max_in_flight_tokens
    )
    return int(concurrency * max_model_len), concurrency


def estimate_available_kv_cache_memory(
    gpu_memory_bytes: int,
    gpu_memory_utilization: float,
    weights_bytes: int,
    non_kv_cache_bytes: int = 0,
) -> int:
    """An *estimate* of vLLM's KV cache budget: gpu_memory x utilization, less the weights
    and any other memory you know of (`non_kv_cache_bytes`). vLLM measures the rest at startup
    (activation peak of a profiling run, CUDA graphs, the non-torch allocations), so the real
    budget is smaller; give `kv_cache_memory_bytes` for an exact plan."""
    check_positive_int("gpu_memory_bytes", gpu_memory_bytes)
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(
            f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}"
        )
    check_int_at_least("weights_bytes", weights_bytes, 0)
    check_int_at_least("non_kv_cache_bytes", non_kv_cache_bytes, 0)
    budget = (
        int(gpu_memory_bytes * gpu_memory_utilization) - weights_bytes - non_kv_cache_bytes
    )
    if budget <= 0:
        raise NotEnoughKVCacheMemoryError(
            f"no memory left for the KV cache: {format_gib(gpu_memory_bytes)} GiB x "
            f"{gpu_memory_utilization} minus {format_gib(weights_bytes)} GiB of weights"
        )
    return budget


# --- the engineer's one call


@dataclass(frozen=True)
class PlanNote:
    """One reason behind a plan's numbers: `kind` (a stable key) and `text` (for people)."""

    kind: str
    text: str


@dataclass(frozen=True)
class KVCachePlan:
    """What vLLM 0.32 would plan, and print at startup, for one model on one budget.

    `num_tokens` and `max_concurrency` are vLLM's "KV cache size: N tokens" and "Maximum
    concurrency for `max_model_len` tokens per request: X" (X printed with two decimals).
    Per group (in `kv_cache_config.kv_cache_groups` order): `block_sizes`, `page_sizes` (bytes
    one block id costs in the group), `blocks_per_request` (at max_model_len) and
    `layer_names` (with layers that share another layer's cache added). `notes` say why.
    """

    kv_cache_config: KVCacheConfig
    kv_cache_layout: str
    available_memory: int
    memory_is_estimate: bool
    max_model_len: int
    max_in_flight_tokens: int
    bytes_per_block: int
    block_sizes: tuple[int, ...]
    page_sizes: tuple[int, ...]
    blocks_per_request: tuple[int, ...]
    layer_names: tuple[tuple[str, ...], ...]
    num_tokens: int
    max_concurrency: float
    num_padding_layers: int
    notes: tuple[PlanNote, ...]

    @property
    def groups(self) -> tuple[KVCacheGroupSpec, ...]:
        return self.kv_cache_config.kv_cache_groups

    @property
    def num_blocks(self) -> int:
        return self.kv_cache_config.num_blocks

    def log_line(self, device: str = "GPU") -> str:
        """vLLM's startup line, as it formats it."""
        return (
            f"{device} KV cache size: {self.num_tokens:,} tokens, Maximum concurrency for "
            f"{self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x"
        )


def plan_kv_cache(
    specs: Mapping[str, KVCacheSpec],
    *,
    max_model_len: int,
    max_num_batched_tokens: int,
    kv_cache_memory_bytes: int | None = None,
    gpu_memory_bytes: int | None = None,
    gpu_memory_utilization: float = 0.9,
    weights_bytes: int | None = None,
    non_kv_cache_bytes: int = 0,
    async_scheduling: bool = True,
    kv_cache_layout: str | KVCacheLayout | None = None,
    use_eagle: bool = False,
    disable_hybrid_kv_cache_manager: bool = False,
    num_gpu_blocks_override: int | None = None,
    shared_kv_cache_layers: Mapping[str, str] | None = None,
    auto_fit: bool = False,
    pipeline_stages: Sequence[Sequence[str]] | None = None,
    num_prefill_lookahead_tokens: int = 0,
) -> KVCachePlan:
    """Plan a model's KV cache as vLLM 0.32's engine core does, and report its capacity.

    `specs`: {layer name: KVCacheSpec} in registration order, one entry per layer that owns a
    cache, already sized for one tensor-parallel rank (heads split, kernel block sizes and
    Mamba padding applied: see `kv_cache_planning.align_hybrid_block_size`). Layers that reuse
    another layer's cache go in `shared_kv_cache_layers` ({layer: target layer}) instead.
    Budget: `kv_cache_memory_bytes` (exact: what vLLM's `--kv-cache-memory-bytes` or its
    profiler gives the cache), or `gpu_memory_bytes` x `gpu_memory_utilization` -
    `weights_bytes` - `non_kv_cache_bytes` (an estimate, flagged `memory_is_estimate`).
    `max_num_batched_tokens` and `async_scheduling` give the tokens in flight that windows
    reserve for. `kv_cache_layout` as in `kv_cache_planning.get_kv_cache_groups`.
    `auto_fit` (vLLM's `--max-model-len -1`): `max_model_len` is the config's, and the plan
    uses the longest length up to it that fits (`auto_fit_max_model_len`).
    `pipeline_stages`: the layer names each pipeline stage (worker) holds, for
    `--pipeline-parallel-size` above 1. Every worker gets the whole budget; the groups are
    formed over all layers and each worker plans its own share of them (vLLM's
    `_project_kv_cache_groups_to_worker`); the auto-fit and the memory check run per worker,
    every worker then keeps the smallest block count, and the figures are the first stage's
    (vLLM's scheduler config). A group left with no layers on some stage is refused: refimpl
    does not plan empty groups. `num_prefill_lookahead_tokens` (vLLM's, from
    `--speculative-config`): a multi-module MTP chain re-prefills that many tokens less one,
    which every sliding window then keeps below itself (`extra_retained_tokens`).

    Steps, in vLLM's order: groups (`get_kv_cache_groups`), the budget (an override of the
    block count replaces it), the memory check (`check_enough_kv_cache_memory`, which raises
    `NotEnoughKVCacheMemoryError`, a ValueError, as vLLM refuses to start), the tensors
    (`get_kv_cache_config`), then tokens and concurrency (`get_kv_cache_capacity`).
    """
    check_positive_int("max_model_len", max_model_len)
    check_positive_int("max_num_batched_tokens", max_num_batched_tokens)
    for name, flag in (
        ("async_scheduling", async_scheduling),
        ("use_eagle", use_eagle),
        ("disable_hybrid_kv_cache_manager", disable_hybrid_kv_cache_manager),
        ("auto_fit", auto_fit),
    ):
        check_bool(name, flag)
    if num_gpu_blocks_override is not None:
        check_positive_int("num_gpu_blocks_override", num_gpu_blocks_override)
    if (kv_cache_memory_bytes is None) == (gpu_memory_bytes is None):
        raise ValueError("give either kv_cache_memory_bytes or gpu_memory_bytes, not both")
    notes: list[PlanNote] = []
    if kv_cache_memory_bytes is not None:
        available = check_int_at_least("kv_cache_memory_bytes", kv_cache_memory_bytes, 1)
    else:
        if weights_bytes is None:
            raise ValueError("gpu_memory_bytes needs weights_bytes (the model's weights)")
        available = estimate_available_kv_cache_memory(
            gpu_memory_bytes, gpu_memory_utilization, weights_bytes, non_kv_cache_bytes
        )
        notes.append(
            PlanNote(
                "memory_estimate",
                f"budget estimated as {format_gib(gpu_memory_bytes)} GiB x "
                f"{gpu_memory_utilization} - {format_gib(weights_bytes)} GiB weights"
                + (
                    f" - {format_gib(non_kv_cache_bytes)} GiB other"
                    if non_kv_cache_bytes
                    else ""
                )
                + "; vLLM also subtracts the activation peak it profiles, so expect less",
            )
        )
    in_flight = get_max_in_flight_tokens(
        max_num_batched_tokens, async_scheduling=async_scheduling
    )
    extra = max(
        0,
        check_int_at_least("num_prefill_lookahead_tokens", num_prefill_lookahead_tokens, 0)
        - 1,
    )
    if extra:
        specs = {
            name: replace(spec, extra_retained_tokens=extra)
            if isinstance(spec, SlidingWindowSpec)
            else spec
            for name, spec in specs.items()
        }
    layout = resolve_kv_cache_layout(specs, kv_cache_layout)
    all_groups = get_kv_cache_groups(
        specs,
        use_eagle=use_eagle,
        kv_cache_layout=layout,
        disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager,
    )
    stages = [
        project_kv_cache_groups_to_worker(all_groups, names, stage)
        for stage, names in enumerate(pipeline_stages or [list(specs)])
    ]
    groups = stages[0]
    per_block_of = [get_kv_cache_bytes_per_block(g, layout) for g in stages]
    per_block = per_block_of[0]
    memory_of = [available] * len(stages)
    if num_gpu_blocks_override is not None:
        check_positive_int("num_gpu_blocks_override", num_gpu_blocks_override)
        memory_of = [num_gpu_blocks_override * b for b in per_block_of]
        notes.append(PlanNote("override", f"block count fixed at {num_gpu_blocks_override}"))
    if auto_fit:
        fitted = min(
            auto_fit_max_model_len(
                g,
                m - b,
                max_model_len=max_model_len,
                max_in_flight_tokens=in_flight,
                kv_cache_layout=layout,
            )
            for g, m, b in zip(stages, memory_of, per_block_of, strict=True)
        )
        notes.append(
            PlanNote(
                "auto_fit",
                f"auto-fit max_model_len: the config's {max_model_len:,} tokens fit"
                if fitted >= max_model_len
                else f"auto-fit max_model_len: reduced from {max_model_len:,} to {fitted:,} "
                "tokens, the longest one request at which fits the budget",
            )
        )
        max_model_len = fitted
    for g, m in zip(stages, memory_of, strict=True):
        check_enough_kv_cache_memory(
            g,
            m,
            max_model_len=max_model_len,
            max_in_flight_tokens=in_flight,
            kv_cache_layout=layout,
        )
    # every worker keeps the smallest block count (vLLM re-plans the others with it)
    num_blocks = min(m // b for m, b in zip(memory_of, per_block_of, strict=True))
    if memory_of[0] // per_block != num_blocks:  # another stage has fewer blocks
        available = num_blocks * per_block
    else:
        available = memory_of[0]
    if len(stages) > 1:
        each = ", ".join(f"{m // b:,}" for m, b in zip(memory_of, per_block_of, strict=True))
        notes.append(
            PlanNote(
                "pipeline",
                f"{len(stages)} pipeline stages, each with the whole budget and its own "
                f"layers; every stage keeps the smallest block count, {num_blocks:,} (blocks "
                f"per stage: {each})",
            )
        )
    config = get_kv_cache_config(groups, available, kv_cache_layout=layout)
    tokens, concurrency = get_kv_cache_capacity(
        config, max_model_len=max_model_len, max_in_flight_tokens=in_flight
    )
    per_request = tuple(
        get_num_blocks_per_request(
            g, max_model_len=max_model_len, max_in_flight_tokens=in_flight
        )
        for g in groups
    )
    layer_names = tuple(
        add_kv_sharing_layers_to_kv_cache_groups(shared_kv_cache_layers or {}, groups)
    )
    num_padding = get_num_padding_layers(groups)
    notes.extend(
        _plan_notes(specs, groups, layout, per_block, per_request, max_model_len, in_flight)
    )
    if shared_kv_cache_layers:
        notes.append(
            PlanNote(
                "kv_sharing",
                f"{len(shared_kv_cache_layers)} layers read another layer's cache and cost no "
                "memory",
            )
        )
    return KVCachePlan(
        kv_cache_config=config,
        kv_cache_layout=layout.name,
        available_memory=available,
        memory_is_estimate=kv_cache_memory_bytes is None,
        max_model_len=max_model_len,
        max_in_flight_tokens=in_flight,
        bytes_per_block=per_block,
        block_sizes=tuple(g.block_size for g in groups),
        page_sizes=tuple(g.width_bytes for g in groups),
        blocks_per_request=per_request,
        layer_names=layer_names,
        num_tokens=tokens,
        max_concurrency=concurrency,
        num_padding_layers=num_padding,
        notes=tuple(notes),
    )


def project_kv_cache_groups_to_worker(
    groups: Sequence[KVCacheGroupSpec], layer_names: Sequence[str], stage: int = 0
) -> list[KVCacheGroupSpec]:
    """The groups as one pipeline stage holds them: each group with only that stage's layers
    (vLLM's `_project_kv_cache_groups_to_worker`), same spec and block size."""
    held = set(layer_names)
    projected = []
    for i, group in enumerate(groups):
        names = [n for n in group.layer_names if n in held]
        if len(names) == len(group.layer_names):
            projected.append(group)
            continue
        if not names:
            raise ValueError(
                f"pipeline stage {stage} holds no layer of KV cache group {i}; refimpl does "
                "not plan a stage with an empty group (use fewer pipeline stages)"
            )
        spec = group.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            spec = UniformTypeKVCacheSpecs(
                block_size=spec.block_size,
                kv_cache_specs={n: spec.kv_cache_specs[n] for n in names},
            )
        projected.append(KVCacheGroupSpec(tuple(names), spec, group.is_eagle_group))
    return projected


def _plan_notes(
    specs: Mapping[str, KVCacheSpec],
    groups: Sequence[KVCacheGroupSpec],
    layout: KVCacheLayout,
    per_block: int,
    per_request: Sequence[int],
    max_model_len: int,
    in_flight: int,
) -> list[PlanNote]:
    """The reasons behind the numbers, as data (`PlanNote(kind, text)`)."""
    notes = []
    layer_specs = {n: g.layer_spec(n) for g in groups for n in g.layer_names}
    grown = sorted(
        {
            (specs[n].block_size, s.block_size)
            for n, s in layer_specs.items()
            if n in specs and s.block_size != specs[n].block_size
        }
    )
    for old, new in grown:
        notes.append(
            PlanNote(
                "block_size_scaled",
                f"{old}-token blocks grown to {new} so every layer's page is equal "
                f"({layout.name} cannot mix page sizes)",
            )
        )
    padded = [
        n
        for n, s in layer_specs.items()
        if n in specs
        and s.page_size_bytes != specs[n].page_size_bytes
        and s.block_size == specs[n].block_size
    ]
    if padded:
        notes.append(
            PlanNote(
                "page_padding",
                f"{len(padded)} layers' pages padded to the largest page "
                f"({max(s.page_size_bytes for s in layer_specs.values()):,} B)",
            )
        )
    if layout.is_block_outermost and len({s.page_size_bytes for s in specs.values()}) > 1:
        notes.append(
            PlanNote("packed", f"pages of several sizes packed side by side ({layout.name})")
        )
    padding = get_num_padding_layers(groups)
    if padding and len(groups) > 1:
        notes.append(
            PlanNote(
                "padding_layers",
                f"{padding} padding layer slots: every group's block is as wide as the "
                f"widest group ({max(len(g.layer_names) for g in groups)} layers)",
            )
        )
    for i, (group, blocks) in enumerate(zip(groups, per_request)):
        spec = group.kv_cache_spec
        first = spec.first_spec if isinstance(spec, UniformTypeKVCacheSpecs) else spec
        full = cdiv(max_model_len, group.block_size)
        if isinstance(first, SlidingWindowSpec):
            notes.append(
                PlanNote(
                    "window_reservation",
                    f"group {i}: window {first.sliding_window} reserves "
                    f"min({first.sliding_window} - 1 + {in_flight} in flight, "
                    f"{max_model_len}) tokens + 1 block = {blocks} blocks "
                    f"(full attention: {full})",
                )
            )
        elif isinstance(first, ChunkedLocalAttentionSpec):
            notes.append(
                PlanNote(
                    "chunk_reservation",
                    f"group {i}: chunk {first.attention_chunk_size} + {in_flight} in flight "
                    f"= {blocks} blocks (full attention: {full})",
                )
            )
        elif isinstance(first, MambaSpec):
            notes.append(
                PlanNote(
                    "mamba_state",
                    f"group {i}: {blocks} state block(s) per request, whatever its length",
                )
            )
    notes.append(
        PlanNote(
            "null_block",
            f"one block ({per_block:,} B) is held back as the null block before the check",
        )
    )
    return notes
