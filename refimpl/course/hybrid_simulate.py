"""DeepSeek V4 requests simulated end to end through `KVCacheManager` (no model, no tensors).

The scheduler side of a step is: prefix lookup (first step only), `allocate_slots` for this
step's tokens, then "the model ran", so `num_computed_tokens` advances. Doing exactly that with
the real Pro layout (five groups, one pool) shows where the blocks go:

- `run_request`: chunked prefill then decode; records every group's live and null blocks per
  step;
- `peak_blocks_chunked_prefill`: the most blocks one request holds at once, and in which step;
- `requests_that_fit`: how many requests of one length complete side by side in a budget;
- `prefix_hit_lengths`: what a second request sharing a prefix gets back (multiples of 256).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from refimpl.course.hybrid_toy import toy_v4_specs
from refimpl.hybrid.deepseek_v4 import kv_cache_specs
from refimpl.hybrid.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    SlidingWindowSpec,
    cdiv,
    unwrap_spec,
)
from refimpl.hybrid.kv_cache_manager import KVCacheBlocks, KVCacheManager
from refimpl.hybrid.kv_cache_planning import GIB, get_kv_cache_groups
from refimpl.hybrid.kv_cache_utils import get_group_id
from refimpl.hybrid.older_planners import PLANNERS
from refimpl.hybrid.request import Request, RequestStatus


def group_labels(kv_cache_groups: Sequence[KVCacheGroupSpec | KVCacheSpec]) -> list[str]:
    """Short names for DeepSeek V4 groups: MLA, SWA-a, SWA-b, C128 state, C4 state."""
    specs = [unwrap_spec(group) for group in kv_cache_groups]
    # compressor states are fp32; the ratio-4 state has the smaller block (4 vs 8 tokens)
    state_sizes = [
        s.block_size
        for s in specs
        if isinstance(s, SlidingWindowSpec) and s.dtype == "float32"
    ]
    labels, swa_seen = [], 0
    for spec in specs:
        if not isinstance(spec, SlidingWindowSpec):
            labels.append("MLA")
        elif spec.dtype == "float32":
            labels.append("C4 state" if spec.block_size == min(state_sizes) else "C128 state")
        else:
            labels.append(f"SWA-{'abcdefgh'[swa_seen]}")
            swa_seen += 1
    return labels


def pro_kv_cache_config(
    available_memory: int = 10 * GIB,
    variant: str = "pro",
    *,
    planner: str = "C",
    **spec_kwargs,
):
    """The planner's `KVCacheConfig` for DeepSeek V4 (five groups, packed slab).

    Planner C by default, what vLLM 0.32/0.33 run (groups SWA-a, SWA-b, MLA, C128 state, C4
    state); `planner="B"` gives the article's order (MLA first). For Pro the two differ only in
    the group order: the members, the stride and the block count are equal.
    """
    get_groups, get_config = PLANNERS[planner]
    return get_config(get_groups(kv_cache_specs(variant, **spec_kwargs)), available_memory)


def pro_kv_cache_manager(
    available_memory: int = 10 * GIB,
    max_model_len: int = 1 << 20,
    max_num_batched_tokens: int = 8192,
    enable_caching: bool = True,
    variant: str = "pro",
    prefix_cache_retention_interval: int | None = 0,
) -> KVCacheManager:
    """A `KVCacheManager` over DeepSeek V4's real groups and the block count of the budget
    (retention as vLLM's default, 0, unless given)."""
    config = pro_kv_cache_config(available_memory, variant)
    return KVCacheManager.from_config(
        config,
        max_model_len,
        enable_caching=enable_caching,
        max_num_batched_tokens=max_num_batched_tokens,
        prefix_cache_retention_interval=prefix_cache_retention_interval,
    )


def toy_kv_cache_manager(
    num_blocks: int = 160,
    max_model_len: int = 4096,
    prefix_cache_retention_interval: int | None = None,
) -> KVCacheManager:
    """A `KVCacheManager` over the running example's five groups (Pro's first five layers,
    planned by vLLM's planner: block sizes 64 / 64 / 256 / 8 / 4, windows 128 / 128 / - / 128
    / 8) and a pool of `num_blocks` blocks, small enough to print every block id.

    Retention defaults to None (a window checkpoint at every hit boundary), so each step's
    prefix-cache entries show; vLLM's default, 0, keeps far fewer.
    """
    return KVCacheManager(
        get_kv_cache_groups(toy_v4_specs()),
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        prefix_cache_retention_interval=prefix_cache_retention_interval,
    )


@dataclass
class StepRecord:
    """The state after one step of one request."""

    step: int
    phase: str  # "prefill" or "decode"
    num_computed_tokens: int
    live_blocks: tuple[int, ...]  # per group: blocks that are not the null block
    null_blocks: tuple[int, ...]  # per group: table entries turned into the null block
    free_blocks: int  # free blocks in the pool after the step

    @property
    def total_live(self) -> int:
        return sum(self.live_blocks)


@dataclass
class RequestRun:
    request: Request
    labels: list[str]
    records: list[StepRecord] = field(default_factory=list)
    hit_tokens: int = 0
    admitted: bool = True

    @property
    def peak(self) -> StepRecord:
        return max(self.records, key=lambda r: r.total_live)


def toy_full_spec(
    block_size: int, head_size: int = 8, dtype: str = "bfloat16"
) -> FullAttentionSpec:
    """A one-head full-attention spec small enough for hand-checked block ids."""
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=head_size, dtype=dtype
    )


def toy_window_spec(
    block_size: int, sliding_window: int, head_size: int = 8, dtype: str = "bfloat16"
) -> SlidingWindowSpec:
    """A one-head sliding-window spec small enough for hand-checked block ids."""
    return SlidingWindowSpec(
        block_size=block_size,
        num_kv_heads=1,
        head_size=head_size,
        dtype=dtype,
        sliding_window=sliding_window,
    )


def schedule_step(
    manager: KVCacheManager, request: Request, num_new_tokens: int, **kwargs
) -> KVCacheBlocks:
    """One scheduler step for one request: `allocate_slots`, then mark the tokens computed (the
    prefix hit passed as `num_new_computed_tokens` too), as the scheduler and worker do.

    Raises ValueError, with nothing changed, when the pool cannot hold the step.
    """
    new_blocks = manager.allocate_slots(request, num_new_tokens, **kwargs)
    if new_blocks is None:
        raise ValueError(
            f"request {request.request_id}: {num_new_tokens} new tokens do not fit in the "
            "free blocks"
        )
    request.num_computed_tokens += num_new_tokens + kwargs.get("num_new_computed_tokens", 0)
    request.status = RequestStatus.RUNNING
    return new_blocks


def prompt_tokens(length: int, seed: int = 0, shared_prefix: Sequence[int] = ()) -> list[int]:
    """Deterministic token ids: `shared_prefix` then a stream that depends on `seed`."""
    rest = [
        (seed * 1_000_003 + 7919 * i) % 50_000 + 100
        for i in range(length - len(shared_prefix))
    ]
    return list(shared_prefix)[:length] + rest


def _snapshot(manager: KVCacheManager, request: Request, step: int, phase: str) -> StepRecord:
    tables = manager.get_blocks(request.request_id).blocks
    null = manager.block_pool.null_block
    # identity comparisons in C: fast on long tables
    nulls = tuple(t.count(null) for t in tables)
    return StepRecord(
        step=step,
        phase=phase,
        num_computed_tokens=request.num_computed_tokens,
        live_blocks=tuple(len(t) - n for t, n in zip(tables, nulls)),
        null_blocks=nulls,
        free_blocks=manager.block_pool.get_num_free_blocks(),
    )


def run_request(
    manager: KVCacheManager,
    request: Request,
    chunk_size: int = 8192,
    decode_tokens: int = 0,
    free_at_end: bool = True,
    use_prefix_cache: bool = True,
) -> RequestRun:
    """Chunked prefill of the whole prompt, then `decode_tokens` single-token steps.

    Stops early (with `admitted=False` if nothing ran) when `allocate_slots` returns None.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    labels = group_labels([m.kv_cache_spec for m in manager.coordinator.single_type_managers])
    run = RequestRun(request, labels)
    hits, num_hit = None, 0
    if use_prefix_cache:  # as vLLM's scheduler: pin the junction the lookup reports
        hits, num_hit, request.shared_prefix_boundary = manager.get_computed_blocks(request)
    run.hit_tokens = num_hit
    done = request.num_computed_tokens + num_hit  # the hit never covers the last prompt token
    step = 0
    while done < request.num_prompt_tokens:
        n = min(chunk_size, request.num_prompt_tokens - done)
        first = step == 0  # the hit is handed over with the first allocation only
        out = manager.allocate_slots(
            request,
            n,
            num_new_computed_tokens=num_hit if first else 0,
            new_computed_blocks=hits if first else None,
        )
        if out is None:
            run.admitted = not first
            return run
        done += n
        request.num_computed_tokens = done
        request.status = RequestStatus.RUNNING
        run.records.append(_snapshot(manager, request, step, "prefill"))
        step += 1
    for i in range(decode_tokens):
        request.append_output_token_ids([(request.num_tokens * 31 + i) % 50_000 + 100])
        if manager.allocate_slots(request, 1) is None:
            return run
        request.num_computed_tokens += 1
        run.records.append(_snapshot(manager, request, step, "decode"))
        step += 1
    if free_at_end:
        manager.free(request)
        request.status = RequestStatus.FINISHED
    return run


def transient_blocks_one_chunk(chunk: int, block_size: int = 256) -> dict[str, int]:
    """Blocks one request needs for its first `chunk` tokens before the windows free anything
    (DeepSeek V4 Pro in planner C's group order: two SWA groups bs 64, MLA bs 256, C128 state
    bs 8, C4 state bs 4)."""
    return {
        "SWA-a": cdiv(chunk, 64),
        "SWA-b": cdiv(chunk, 64),
        "MLA": cdiv(chunk, block_size),
        "C128 state": cdiv(chunk, 8),
        "C4 state": cdiv(chunk, 4),
    }


def peak_blocks_chunked_prefill(
    prompt_len: int,
    chunk_size: int = 8192,
    available_memory: int = 10 * GIB,
    decode_tokens: int = 0,
) -> tuple[StepRecord, RequestRun]:
    """Run one prompt of `prompt_len` tokens (then `decode_tokens` decode steps) through the
    Pro layout; return its peak step and the whole run."""
    manager = pro_kv_cache_manager(
        available_memory, max_model_len=max(prompt_len + decode_tokens + 1, 1 << 20)
    )
    run = run_request(
        manager,
        manager.make_request("peak", prompt_tokens(prompt_len)),
        chunk_size,
        decode_tokens,
    )
    return run.peak, run


def requests_that_fit(
    prompt_len: int,
    chunk_size: int = 8192,
    available_memory: int = 10 * GIB,
    max_requests: int = 1000,
) -> tuple[int, KVCacheManager]:
    """How many requests of `prompt_len` tokens finish their prefill and stay resident
    together.

    Requests are prefilled one after another (one chunk in flight at a time, as with a
    single prefill slot), then decode one token, which frees what their last chunk left outside
    the windows, and keep their blocks; the first one that cannot get its next chunk or its
    first decode token stops the count. Prompts share no prefix.
    """
    manager = pro_kv_cache_manager(
        available_memory, max_model_len=max(prompt_len + 2, 1 << 20)
    )
    for i in range(max_requests):
        request = manager.make_request(f"r{i}", prompt_tokens(prompt_len, seed=i + 1))
        run = run_request(
            manager,
            request,
            chunk_size,
            decode_tokens=1,
            free_at_end=False,
            use_prefix_cache=False,
        )
        if not run.records or run.records[-1].num_computed_tokens < prompt_len + 1:
            manager.free(request)  # the one that did not fit gives its partial blocks back
            return i, manager
    return max_requests, manager


def prefix_hit_lengths(
    shared_prefix_lens: Sequence[int],
    prompt_len: int = 12_000,
    chunk_size: int = 8192,
    available_memory: int = 10 * GIB,
    prefix_cache_retention_interval: int | None = 0,
) -> dict[int, int]:
    """{shared prefix length: hit length} for a second request after a first one finished.

    Each pair runs on a fresh pool: request A (prompt_len tokens) runs and is freed, then B,
    whose first `shared` tokens equal A's, asks for its prefix hit. With vLLM's default
    retention (0) A's windows keep blocks only at A's own replay boundary, so B hits only
    when the shared prefix reaches it; with None (dense) B hits every 256-token boundary.
    """
    out = {}
    for shared in shared_prefix_lens:
        manager = pro_kv_cache_manager(
            available_memory,
            max_model_len=1 << 20,
            prefix_cache_retention_interval=prefix_cache_retention_interval,
        )
        a = manager.make_request("A", prompt_tokens(prompt_len, seed=1))
        run_request(manager, a, chunk_size)
        b = manager.make_request(
            "B", prompt_tokens(prompt_len, seed=2, shared_prefix=a.prompt_token_ids[:shared])
        )
        _, hit, _ = manager.get_computed_blocks(b)
        out[shared] = hit
    return out


MINI_V4_LABELS = ["SWA-a", "SWA-b", "MLA", "C128 state", "C4 state"]


def mini_v4_groups() -> list:
    """The running example's five groups shrunk for unit tests and exercise 5's small worlds
    (chapter 12 itself runs the real sizes, `toy_kv_cache_manager`).

    The five groups in planner C's order, one stand-in layer each, every block size and window
    divided by 16: block sizes 4 / 4 / 16 / 2 / 1 (the running example's are 64 / 64 / 256 /
    8 / 4) and windows 8 / 8 / - / 8 / 2 (128 / 128 / - / 128 / 8). The allocator only reads
    block sizes, windows and the group order, so a request of a few dozen tokens exercises
    every rule that one of a few hundred does.
    """
    specs = [
        toy_window_spec(4, 8, dtype="uint8"),
        toy_window_spec(4, 8, dtype="uint8"),
        toy_full_spec(16, dtype="uint8"),
        toy_window_spec(2, 8, dtype="float32"),
        toy_window_spec(1, 2, dtype="float32"),
    ]
    return [
        KVCacheGroupSpec((f"{label}.layer",), spec)
        for label, spec in zip(MINI_V4_LABELS, specs)
    ]


# --- retention: which sliding-window checkpoints survive


@dataclass
class RetentionRun:
    """Three requests sharing a prefix, run one after another at one retention setting.

    `blocks[rid]` is, per block of the request's sliding-window table, one letter: "." the null
    block (before the hit, never held), "h" reused from the prefix cache, "k" computed and kept
    as a checkpoint (still hashed after the request finished), "-" computed and dropped.
    `hits[rid]` and `junctions[rid]` are what its lookup found before it ran.
    """

    retention: int | None
    block_size: int
    alignment: int
    blocks: dict[str, str]
    hits: dict[str, int]
    junctions: dict[str, int]


RETENTION_TOY = ("full", 16), ("swa", 4, 8)
"""The retention figure's groups: full attention in 16-token blocks (the hit alignment) and a
window of 8 tokens in 4-token blocks, so a hit needs the window's 2 blocks before its end."""


def retention_run(
    retention: int | None, prompt_len: int = 64, shared: int = 40, seed: int = 3
) -> RetentionRun:
    """Request A runs its `prompt_len`-token prompt and finishes; B shares A's first `shared`
    tokens, runs and finishes; C shares the same prefix and looks it up (the window blocks each
    request kept, every lookup's hit and junction)."""
    groups = [toy_full_spec(RETENTION_TOY[0][1]), toy_window_spec(*RETENTION_TOY[1][1:])]
    manager = KVCacheManager(
        groups, 200, 4 * prompt_len, prefix_cache_retention_interval=retention
    )
    base = prompt_tokens(prompt_len, seed=seed)
    states, hits, junctions = {}, {}, {}
    for rid, prompt in (
        ("A", base),
        ("B", prompt_tokens(prompt_len, seed=seed + 1, shared_prefix=base[:shared])),
        ("C", prompt_tokens(prompt_len, seed=seed + 2, shared_prefix=base[:shared])),
    ):
        request = manager.make_request(rid, prompt)
        blocks, hit, request.shared_prefix_boundary = manager.get_computed_blocks(request)
        hits[rid], junctions[rid] = hit, request.shared_prefix_boundary
        if rid == "C":
            break
        reused = {i for i, b in enumerate(blocks.blocks[1]) if not b.is_null}
        schedule_step(
            manager,
            request,
            request.num_tokens - hit,
            num_new_computed_tokens=hit,
            new_computed_blocks=blocks,
        )
        table = list(manager.coordinator.single_type_managers[1].req_to_blocks[rid])
        manager.free(request)  # the blocks still hashed afterwards are the kept checkpoints
        states[rid] = "".join(
            "h"
            if i in reused
            else "."
            if i * groups[1].block_size < hit
            else "k"
            if b.block_hash is not None
            else "-"
            for i, b in enumerate(table)
        )
    return RetentionRun(
        retention, groups[1].block_size, manager.scheduler_block_size, states, hits, junctions
    )


def cached_blocks_per_group(
    retention: int | None,
    prompt_len: int = 12_000,
    chunk_size: int = 8192,
    available_memory: int = 10 * GIB,
) -> dict[str, int]:
    """{group label: blocks still in the prefix cache} after one Pro request of `prompt_len`
    tokens ran and finished at this retention setting (every full MLA block stays cached; the
    window groups keep only their checkpoints)."""
    manager = pro_kv_cache_manager(available_memory, prefix_cache_retention_interval=retention)
    run_request(
        manager, manager.make_request("A", prompt_tokens(prompt_len, seed=1)), chunk_size
    )
    counts = [0] * len(manager.coordinator.single_type_managers)
    for block in manager.block_pool.blocks:
        if block.block_hash is not None:
            counts[get_group_id(block.block_hash)] += 1
    labels = group_labels([m.kv_cache_spec for m in manager.coordinator.single_type_managers])
    return dict(zip(labels, counts))
