"""Random request streams for the allocator crosscheck, and the harness that plays one stream
through an allocator.

A stream is a list of concrete operations (plain tuples, JSON-friendly), so the same stream can
drive vLLM's `KVCacheManager` and refimpl's, be shrunk by deleting operations, and be stored in
`tests/data/`. The harness keeps a small scheduler model (tokens, computed tokens, status per
request) and skips operations that make no sense in the current state (for example decoding a
request that was freed), identically for both allocators; that keeps every sub-stream valid.

Operations:
- ("new", rid, tokens)                     a request arrives (waiting)
- ("schedule", rid, chunk, lookahead, must_fit, has_scheduled, reserved, delay[, pin])
      a waiting/preempted request: look up its prefix hit (and the shared-prefix junction it
      reports), then allocate `chunk` new tokens (capped at what is left), keeping `reserved`
      blocks free and, with `delay`, without caching this step's blocks (P/D-style delayed
      caching); a running request with uncomputed tokens: the next chunk. `pin` (True when
      left out) stores the reported junction on the request, as vLLM's scheduler does with
      `get_computed_blocks`' third value; False is a caller that drives the `KVCacheManager`
      directly and ignores it, so the manager itself must not pin anything
- ("decode", rid, k, lookahead)           a running request, fully computed: k new tokens
- ("preempt", rid)                         free its blocks, it waits again from token 0
- ("finish", rid)                          free its blocks, it leaves
- ("reset",)                               reset_prefix_cache (refused while blocks are held)
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class GroupSet:
    """Cache groups for the allocator: ("full", block_size), ("swa", block_size, window) or
    ("chunked", block_size, attention_chunk_size), with an optional eagle flag per group.

    `unit` scales prompt lengths and chunk sizes (DeepSeek V4's real block sizes need prompts
    of hundreds of tokens before a hit can end on a 256-token boundary). `max_in_flight_tokens`
    caps the blocks the full-sequence admission check asks of a sliding-window group."""

    name: str
    groups: tuple[tuple, ...]
    num_blocks: int
    max_model_len: int = 96
    eagle_groups: tuple[int, ...] = ()
    use_eagle: bool = False
    watermark: float = 0.0
    enable_caching: bool = True
    unit: int = 1
    max_in_flight_tokens: int | None = None

    @property
    def scheduler_block_size(self) -> int:
        return math.lcm(*(g[1] for g in self.groups))

    @property
    def has_sliding_window(self) -> bool:
        return any(g[0] == "swa" for g in self.groups)


# DeepSeek V4 Pro's five groups at their real block sizes: MLA (256), two SWA groups (64, W
# 128), the ratio-128 compressor state (8, W 128) and the ratio-4 compressor state (4, W 8).
DSV4 = (("full", 256), ("swa", 64, 128), ("swa", 64, 128), ("swa", 8, 128), ("swa", 4, 8))

GROUP_SETS: dict[str, GroupSet] = {
    gs.name: gs
    for gs in [
        GroupSet("full", (("full", 4),), 24),
        GroupSet("full+swa8", (("full", 4), ("swa", 4, 8)), 30),
        # window not a multiple of the block
        GroupSet("full+swa7", (("full", 4), ("swa", 4, 7)), 30),
        GroupSet("swa-only", (("swa", 4, 6), ("swa", 2, 5)), 24),
        GroupSet("mixed-sizes", (("full", 8), ("swa", 4, 5), ("swa", 2, 3)), 40),
        # DeepSeek V4 shape, scaled down: MLA (full, 16), two equal SWA groups (4, W 8),
        # a ratio-128-like state (2, W 8) and a ratio-4-like state (1, W 2)
        GroupSet(
            "dsv4-like",
            (("full", 16), ("swa", 4, 8), ("swa", 4, 8), ("swa", 2, 8), ("swa", 1, 2)),
            60,
        ),
        GroupSet("window-1", (("full", 4), ("swa", 4, 1)), 30),
        GroupSet("watermark", (("full", 4), ("swa", 4, 8)), 30, watermark=0.2),
        GroupSet("no-prefix-cache", (("full", 4), ("swa", 4, 7)), 30, enable_caching=False),
        GroupSet(
            "eagle-swa",
            (("full", 4), ("swa", 4, 8), ("swa", 4, 8)),
            40,
            eagle_groups=(2,),
            use_eagle=True,
        ),
        GroupSet("eagle-all", (("full", 4), ("swa", 4, 6)), 30, use_eagle=True),
        GroupSet(
            "eagle-dsv4-like",
            (("full", 16), ("swa", 4, 8), ("swa", 4, 8), ("swa", 2, 8)),
            60,
            eagle_groups=(2,),
            use_eagle=True,
        ),
        # one group: vLLM's unitary coordinator (one lookup, no look-one-block-further margin)
        GroupSet("full-eagle", (("full", 4),), 24, use_eagle=True),
        GroupSet("swa-single", (("swa", 4, 6),), 24),
        GroupSet("swa-single-eagle", (("swa", 4, 9),), 24, use_eagle=True),
        # a flagged full group whose block is larger than the hash unit: the partial tail block
        GroupSet(
            "full8-flagged+swa4",
            (("full", 8), ("swa", 4, 21)),
            40,
            eagle_groups=(0,),
            use_eagle=True,
        ),
        GroupSet("full8+swa4", (("full", 8), ("swa", 4, 5)), 40),
        # Llama 4: chunked local layers (chunks of 8 and 12 tokens over 4-token blocks, so
        # prompts cross several chunks) beside full attention, and one alone (unitary)
        GroupSet("full+chunk8", (("full", 4), ("chunked", 4, 8), ("chunked", 4, 8)), 36),
        GroupSet(
            "chunk12+full-cap",
            (("chunked", 4, 12), ("full", 4)),
            30,
            max_in_flight_tokens=8,
        ),
        GroupSet("chunk-single", (("chunked", 4, 8),), 24),
        # all three kinds: the hybrid lookup's fixed point runs past one iteration
        GroupSet("full+swa7+chunk8", (("full", 4), ("swa", 4, 7), ("chunked", 4, 8)), 40),
        # the in-flight token cap of the full-sequence admission check
        GroupSet(
            "in-flight-cap",
            (("full", 4), ("swa", 4, 8), ("swa", 2, 4)),
            36,
            max_in_flight_tokens=8,
        ),
        # scheduler block 16 over 4-token hashes, windows that end mid-block (the shapes of
        # the retention-0 cases of issue 30: a junction reported to a caller that ignores it)
        GroupSet("swa9+full16", (("swa", 4, 9), ("full", 16)), 90, watermark=0.05),
        GroupSet("full16+2swa12", (("full", 16), ("swa", 4, 12), ("swa", 4, 12)), 80),
        GroupSet("eagle-full16+swa9", (("full", 16), ("swa", 4, 9)), 80, use_eagle=True),
        # DeepSeek V4's real block sizes (256/64/8/4)
        GroupSet(
            "dsv4-real", DSV4, 900, max_model_len=2048, unit=32, max_in_flight_tokens=512
        ),
        GroupSet(
            "dsv4-real-mtp",
            DSV4 + (("swa", 64, 128),),
            1000,
            max_model_len=2048,
            unit=32,
            eagle_groups=(5,),
            use_eagle=True,
        ),
    ]
}

RETENTION_SETTINGS = ("none", "0", "2x")
"""Retention settings the crosscheck runs at: dense (None), vLLM's default (0), and a positive
interval of twice the scheduler block size."""


def retention_interval(setting: str, gs: GroupSet) -> int | None:
    """The `prefix_cache_retention_interval` a setting means for one group set."""
    if setting == "none":
        return None
    if setting.endswith("x"):
        return int(setting[:-1]) * gs.scheduler_block_size
    return int(setting)


def random_stream(rng: random.Random, group_set: GroupSet, length: int = 40) -> list[tuple]:
    """Operations over a few prompts that share prefixes (3 symbols, so hits are common)."""
    ops: list[tuple] = []
    u = group_set.unit
    bases = [[rng.randrange(3) for _ in range(rng.randrange(4, 40) * u)] for _ in range(3)]
    next_id = 0
    live: list[str] = []
    for _ in range(length):
        kind = rng.choices(
            ["new", "schedule", "decode", "preempt", "finish", "reset"], [3, 5, 5, 1, 2, 0.3]
        )[0]
        if kind == "reset":
            ops.append(("reset",))
            continue
        if kind == "new" or not live:
            base = rng.choice(bases)
            tokens = base[: rng.randrange(1, len(base) + 1)] + [
                rng.randrange(3) for _ in range(rng.randrange(0, 12) * u)
            ]
            tokens = tokens[: group_set.max_model_len - 20 * u] or [0]
            rid = f"r{next_id}"
            next_id += 1
            live.append(rid)
            ops.append(("new", rid, tokens))
            continue
        rid = rng.choice(live)
        if kind == "schedule":
            ops.append(
                (
                    "schedule",
                    rid,
                    rng.choice([1, 3, 4, 8, 16, 19, 23, 64]) * u,
                    rng.choice([0, 0, 0, 1, 2]),
                    rng.random() < 0.2,
                    rng.random() < 0.7,
                    rng.choice([0, 0, 0, 0, 1, 3]),
                    rng.random() < 0.1,
                    rng.random() < 0.5,
                )
            )
        elif kind == "decode":
            ops.append(("decode", rid, rng.choice([1, 1, 2, 3]), rng.choice([0, 0, 1, 3])))
        elif kind == "preempt":
            ops.append(("preempt", rid))
        else:
            ops.append(("finish", rid))
            live.remove(rid)
    return ops


class Allocator(Protocol):
    """What the harness needs from either side (see `tools/crosscheck/vllm_side.py` and
    `refimpl_side.py`)."""

    def new_request(self, rid: str, tokens: list[int]) -> Any: ...
    def append_tokens(self, req: Any, tokens: list[int]) -> None: ...
    def set_state(
        self, req: Any, num_computed: int, running: bool, preempted: bool
    ) -> None: ...
    def get_computed_blocks(self, req: Any) -> tuple[Any, list[list[int]], int, int]: ...
    def pin_junction(self, req: Any, junction: int) -> None: ...
    def allocate_slots(
        self,
        req: Any,
        n: int,
        n_computed: int,
        hits: Any,
        lookahead: int,
        must_fit: bool,
        has_scheduled: bool,
        reserved: int = 0,
        delay: bool = False,
    ) -> list[list[int]] | None: ...
    def free(self, req: Any) -> None: ...
    def reset_prefix_cache(self) -> bool: ...
    def tables(self, rid: str) -> list[list[int]]: ...
    def pool_state(self) -> dict: ...


@dataclass
class _Req:
    handle: Any
    tokens: list[int]
    num_computed: int = 0
    status: str = "waiting"  # waiting | running | preempted
    started: bool = False  # has a first allocation (tables exist)


@dataclass
class Harness:
    """Plays operations on one allocator and returns one observation per operation."""

    alloc: Allocator
    max_model_len: int
    reqs: dict[str, _Req] = field(default_factory=dict)
    next_token: int = 100

    def play(self, op: tuple) -> Any:
        if op[0] == "reset":
            return ("reset", self.alloc.reset_prefix_cache())
        kind, rid = op[0], op[1]
        if kind == "new":
            if rid in self.reqs:
                return "skip"
            self.reqs[rid] = _Req(self.alloc.new_request(rid, list(op[2])), list(op[2]))
            return "ok"
        req = self.reqs.get(rid)
        if req is None:
            return "skip"
        if kind in ("preempt", "finish"):
            if req.started:
                self.alloc.free(req.handle)
            if kind == "finish":
                del self.reqs[rid]
            else:
                req.num_computed, req.status, req.started = 0, "preempted", False
                self.alloc.set_state(req.handle, 0, running=False, preempted=True)
            return "ok"
        if kind == "schedule":
            _, _, chunk, lookahead, must_fit, has_scheduled, reserved, delay = op[:8]
            pin = op[8] if len(op) > 8 else True
            if req.status == "running":
                left = len(req.tokens) - req.num_computed
                if left <= 0:
                    return "skip"
                n = min(chunk, left)
                if req.num_computed + n + lookahead > self.max_model_len:
                    return "skip"
                out = self.alloc.allocate_slots(
                    req.handle, n, 0, None, lookahead, False, has_scheduled, reserved, delay
                )
                if out is not None:
                    req.num_computed += n
                    self.alloc.set_state(
                        req.handle, req.num_computed, running=True, preempted=False
                    )
                return ("alloc", out)
            hits, hit_ids, hit_len, junction = self.alloc.get_computed_blocks(req.handle)
            if pin:
                self.alloc.pin_junction(req.handle, junction)
            n = min(chunk, len(req.tokens) - hit_len)
            if hit_len + n + lookahead > self.max_model_len:
                return "skip"
            out = self.alloc.allocate_slots(
                req.handle,
                n,
                hit_len,
                hits,
                lookahead,
                must_fit,
                has_scheduled,
                reserved,
                delay,
            )
            if out is not None:
                req.num_computed = hit_len + n
                req.status, req.started = "running", True
                self.alloc.set_state(
                    req.handle, req.num_computed, running=True, preempted=False
                )
            return ("hit", hit_ids, hit_len, "junction", junction, "alloc", out)
        if kind == "decode":
            _, _, k, lookahead = op
            if req.status != "running" or req.num_computed != len(req.tokens):
                return "skip"
            if len(req.tokens) + k + lookahead > self.max_model_len:
                return "skip"
            new = list(range(self.next_token, self.next_token + k))
            self.next_token += k
            req.tokens += new
            self.alloc.append_tokens(req.handle, new)
            out = self.alloc.allocate_slots(req.handle, k, 0, None, lookahead, False, True)
            # on None the new tokens stay uncomputed; a later "schedule" retries
            if out is not None:
                req.num_computed += k
                self.alloc.set_state(
                    req.handle, req.num_computed, running=True, preempted=False
                )
            return ("alloc", out)
        raise ValueError(f"unknown operation {op!r}")

    def observe(self) -> dict:
        """Tables of every started request and the pool state, after an operation."""
        return {
            "tables": {
                rid: self.alloc.tables(rid)
                for rid, r in sorted(self.reqs.items())
                if r.started
            },
            **self.alloc.pool_state(),
        }
