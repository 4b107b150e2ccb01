"""Graders for exercise 5, the hybrid allocator: a sliding window's frees and the
coordinator's fixed-point prefix hit.

`check_window_frees(SlidingWindowManager)` grades `get_num_skipped_tokens` and
`remove_skipped_blocks` (vLLM's names) in a `KVCacheManager` whose window groups use the
student's class; `check_fixed_point_hit(HybridKVCacheCoordinator)` grades the coordinator's
`find_longest_cache_hit`. Both replay hand-made scenarios and seeded random workloads in
lockstep against refimpl (`grader.exercises.hybrid_allocator_worlds`) and compare, after every
step, the return value, the free queue, every block table, every block's reference count and
which blocks carry a prefix hash (and each request's computed tokens or recorded junction).

The rules checked (each with its scenario and a broken variant in `grader.exercises.rules`): a
window of W tokens skips `max(0, n - W + 1)` tokens once n are computed; only whole skipped
blocks are freed, at most the table's length, walking back from the last one and stopping at
the first null block, last block first, each replaced by the null block and handed to the pool.
The hit is found full attention first, each group looked up with the length agreed so far,
round after round until it stops changing, never past `max_cache_hit_length`; full attention's
blocks are trimmed to the agreed length, and the third value is how much longer the longest
single lookup was (the uncached shared prefix, which pins a junction).
"""

from __future__ import annotations

import random
from functools import partial
from typing import Any

from grader.exercises.paged_checks import report_scenarios
from grader.lockstep.calls import Call, WorldSpec
from grader.lockstep.engine import Lockstep
from grader.lockstep.report import GradeReport, seeded_checks
from grader.lockstep.time_limit import DEFAULT_TIME_LIMIT

# Chapter 12's running example shrunk so every block id fits on screen (its five groups, block
# sizes and windows divided by 16; `refimpl.course.hybrid_simulate.mini_v4_groups`, which a
# grading child cannot import).
MINI_V4 = (
    ("SWA-a", 4, 8),
    ("SWA-b", 4, 8),
    ("MLA", 16, None),
    ("C128 state", 2, 8),
    ("C4 state", 1, 2),
)


def tokens(seed: int, n: int, prefix: list[int] | None = None) -> list[int]:
    """`prefix` then n - len(prefix) token ids that depend on `seed`."""
    prefix = list(prefix or [])[:n]
    rng = random.Random(seed)
    return prefix + [rng.randrange(100, 50_000) for _ in range(n - len(prefix))]


class _Driver:
    """Builds one world on both sides and names every step for the table."""

    def __init__(self, ls: Lockstep, student: Any, kind: str, *args: Any) -> None:
        self.ls = ls
        rows = args[0]
        shown = ", ".join(
            f"{name} bs {bs}" + (f" W {w}" if w is not None else "") for name, bs, w in rows
        )
        ls.start(f"{kind} world: {shown}", WorldSpec(kind, args), student)

    def new(self, key: str, token_ids: list[int]) -> None:
        self.ls.both(Call("new", (key, token_ids)))

    def call(self, label: str, name: str, *args: Any) -> Any:
        return self.ls.step(label, Call(name, args))


# --- exercise 5a: the window's frees
class WindowDriver(_Driver):
    def __init__(self, ls: Lockstep, student: Any, rows: tuple, num_blocks: int = 64) -> None:
        super().__init__(ls, student, "hybrid_window", rows, num_blocks)

    def request(self, key: str, token_ids: list[int]) -> None:
        self.new(key, token_ids)

    def step(self, key: str, n: int) -> Any:
        return self.call(f"allocate_slots({key}, {n} new tokens)", "step", key, n)

    def sample(self, key: str, token_id: int) -> None:
        self.ls.both(Call("sample", (key, token_id)))

    def decode(self, key: str, token_id: int) -> Any:
        self.sample(key, token_id)
        return self.call(f"allocate_slots({key}, 1 decode token)", "step", key, 1)

    def remove(self, key: str, computed: int) -> Any:
        return self.call(
            f"remove_skipped_blocks({key}, total_computed_tokens={computed})",
            "remove_skipped_blocks",
            key,
            computed,
        )

    def skipped(self, gid: int, n: int) -> Any:
        return self.call(f"group {gid}: get_num_skipped_tokens({n})", "skipped_tokens", gid, n)

    def free(self, key: str) -> Any:
        return self.call(f"free({key})", "free", key)


def scenario_skipped_tokens(cls: Any, ls: Lockstep) -> None:
    """W = 8 (block 4), W = 5 (block 2), W = 2 (block 1) around their edges."""
    d = WindowDriver(ls, cls, (("full", 4, None), ("W8", 4, 8), ("W5", 2, 5), ("W2", 1, 2)))
    for gid, window in ((1, 8), (2, 5), (3, 2)):
        for n in (0, 1, window - 2, window - 1, window, window + 1, 3 * window + 2):
            d.skipped(gid, n)


def scenario_toy_request_life(cls: Any, ls: Lockstep) -> None:
    """Request A on the shrunk running example: chunks of 16, 16, 8, two decode steps."""
    d = WindowDriver(ls, cls, MINI_V4)
    d.request("A", tokens(1, 40))
    for n in (16, 16, 8):
        d.step("A", n)
    d.decode("A", 5)
    d.decode("A", 6)
    d.free("A")


def scenario_last_block_first(cls: Any, ls: Lockstep) -> None:
    """12 tokens in 2-token blocks, W = 4: 4 whole blocks leave at once, freed last first."""
    d = WindowDriver(ls, cls, (("full", 2, None), ("W4", 2, 4)), num_blocks=24)
    d.request("A", tokens(2, 14))
    d.step("A", 12)
    d.remove("A", 12)
    d.step("A", 2)


def scenario_whole_blocks_only(cls: Any, ls: Lockstep) -> None:
    """W = 5 in 4-token blocks: a block goes only when all its tokens left the window."""
    d = WindowDriver(ls, cls, (("full", 4, None), ("W5", 4, 5)), num_blocks=24)
    d.request("A", tokens(3, 21))
    for n in (6, 2, 1, 3, 4, 5):
        d.step("A", n)
        d.remove("A", d.ls.reference.requests["A"].num_computed_tokens)


def scenario_stop_at_first_null(cls: Any, ls: Lockstep) -> None:
    """Freeing again after the window moved frees only the newly skipped blocks."""
    d = WindowDriver(ls, cls, (("full", 2, None), ("W3", 2, 3)), num_blocks=24)
    d.request("A", tokens(4, 20))
    d.step("A", 8)
    d.remove("A", 8)
    d.step("A", 6)
    d.remove("A", 14)
    d.remove("A", 14)


def scenario_window_past_the_table(cls: Any, ls: Lockstep) -> None:
    """Asked about more computed tokens than the table holds (external computed tokens): the
    skipped blocks stop at the table's end."""
    d = WindowDriver(ls, cls, (("full", 2, None), ("W4", 2, 4)), num_blocks=24)
    d.request("A", tokens(5, 30))
    d.step("A", 8)
    d.remove("A", 29)


def random_window_workload(seed: int, cls: Any, ls: Lockstep) -> None:
    """Random group mixes; requests prefill in random chunks, decode, free, interleaved."""
    rng = random.Random(seed)
    rows = [("full", rng.choice([4, 8]), None)]
    for i in range(rng.randint(1, 3)):
        bs = rng.choice([1, 2, 4])
        rows.append((f"W{i}", bs, rng.randint(2, 12)))
    d = WindowDriver(ls, cls, tuple(rows), num_blocks=rng.randint(40, 90))
    live: dict[str, int] = {}  # key -> tokens left to prefill
    decode = 0
    for n in range(12):
        key = f"R{n}"
        d.request(key, tokens(seed * 100 + n, rng.randint(3, 40)))
        live[key] = len(d.ls.reference.requests[key].prompt_token_ids)
        for _ in range(rng.randint(1, 4)):
            if not live:
                break
            k = rng.choice(sorted(live))
            if live[k] > 0:
                chunk = min(live[k], rng.randint(1, 12))
                if d.step(k, chunk) is not None:
                    live[k] -= chunk
            elif rng.random() < 0.7:
                decode += 1
                d.decode(k, 100 + decode)
            else:
                d.free(k)
                del live[k]
            if live.get(k, 1) == 0 and rng.random() < 0.3:
                d.remove(k, d.ls.reference.requests[k].num_computed_tokens)


def window_checks(cls: Any) -> list[tuple[str, str, Any]]:
    checks = [
        (
            "skipped_tokens",
            "get_num_skipped_tokens(n) = max(0, n - W + 1) around each window's edges",
            partial(scenario_skipped_tokens, cls),
        ),
        (
            "toy_request_life",
            "request A on the shrunk running example: 3 chunks, 2 decode steps, free",
            partial(scenario_toy_request_life, cls),
        ),
        (
            "last_block_first",
            "4 blocks leave the window at once: freed last first, null blocks in their place",
            partial(scenario_last_block_first, cls),
        ),
        (
            "whole_blocks_only",
            "a block is freed only when all its tokens left the window",
            partial(scenario_whole_blocks_only, cls),
        ),
        (
            "stop_at_first_null",
            "freeing again frees only the newly skipped blocks, never the null block",
            partial(scenario_stop_at_first_null, cls),
        ),
        (
            "window_past_the_table",
            "skipped tokens past the table's end free the table's blocks, no more",
            partial(scenario_window_past_the_table, cls),
        ),
    ]
    checks += seeded_checks(
        "random_workload",
        "seeded random groups and requests, chunks, decodes, frees",
        lambda seed: partial(random_window_workload, seed, cls),
        range(3),
    )
    return checks


# --- exercise 5b: the fixed-point hit
class HitDriver(_Driver):
    def __init__(
        self,
        ls: Lockstep,
        student: Any,
        rows: tuple,
        num_blocks: int = 160,
        retention: int | None = None,
    ) -> None:
        super().__init__(ls, student, "hybrid_hit", rows, num_blocks, retention)

    def run(self, key: str, token_ids: list[int]) -> None:
        """A request runs its whole prompt in one step and finishes."""
        self.new(key, token_ids)
        self.call(f"{key}: {len(token_ids)} tokens in one step", "run", key)
        self.call(f"free({key})", "free", key)

    def occupy(self, n: int) -> Any:
        return self.call(f"another request takes {n} blocks", "occupy", n)

    def lookup(self, key: str, max_length: int) -> Any:
        return self.call(
            f"find_longest_cache_hit({key}'s hashes, max_cache_hit_length={max_length})",
            "lookup",
            key,
            max_length,
        )

    def computed(self, key: str) -> Any:
        return self.call(f"get_computed_blocks({key})", "get_computed_blocks", key)


def scenario_toy_shared_prefix(cls: Any, ls: Lockstep) -> None:
    """A (40 tokens) ran on the shrunk running example; B shares 35 tokens."""
    d = HitDriver(ls, cls, MINI_V4)
    a = tokens(1, 40)
    d.run("A", a)
    for key, shared in (("B", 35), ("C", 15), ("D", 40), ("E", 0)):
        d.new(key, tokens(ord(key), 45, a[:shared]))
        d.computed(key)
        d.lookup(key, 45)


def scenario_junction(cls: Any, ls: Lockstep) -> None:
    """Retention 0 (vLLM's default): B shares 20 of A's 40 tokens; full attention offers 16,
    the windows nothing. B pins the junction, runs, and C then hits 16."""
    d = HitDriver(ls, cls, MINI_V4, retention=0)
    a = tokens(1, 40)
    d.run("A", a)
    d.new("B", tokens(2, 45, a[:20]))
    d.lookup("B", 44)
    d.computed("B")
    d.call("B: 45 tokens in one step", "run", "B")
    d.call("free(B)", "free", "B")
    d.new("C", tokens(3, 45, a[:20]))
    d.computed("C")


def scenario_never_the_last_token(cls: Any, ls: Lockstep) -> None:
    """A twin of a 32-token prompt may reuse 31 tokens at most: 16 at alignment 16."""
    d = HitDriver(ls, cls, MINI_V4)
    a = tokens(1, 32)
    d.run("A", a)
    d.new("B", list(a))
    d.computed("B")
    d.lookup("B", 31)
    d.lookup("B", 17)


def random_hit_workload(seed: int, cls: Any, ls: Lockstep) -> None:
    """Random group mixes and retention; requests sharing prefixes of earlier ones run,
    finish and evict one another's cached blocks; later ones look up."""
    rng = random.Random(seed)
    bs_full = rng.choice([2, 4])
    rows = [("full", bs_full, None)]
    for i in range(rng.randint(2, 3)):
        rows.append((f"W{i}", rng.choice([1, 2]), rng.randint(2, 13)))
    rng.shuffle(rows)
    retention = rng.choice([None, 0])
    d = HitDriver(ls, cls, tuple(rows), num_blocks=rng.randint(80, 160), retention=retention)
    prompts: list[list[int]] = []
    for n in range(10):
        key = f"R{n}"
        length = rng.randint(4, 30)
        prefix = rng.choice(prompts)[: rng.randint(0, length)] if prompts else []
        prompt = tokens(seed * 100 + n, length, prefix)
        d.new(key, prompt)
        d.computed(key)
        d.lookup(key, rng.randint(0, length))
        need = sum(-(-length // bs) for _, bs, _ in rows)
        if d.ls.reference.manager.block_pool.get_num_free_blocks() >= need:
            d.call(f"{key}: {length} tokens in one step", "run", key)
            d.call(f"free({key})", "free", key)
            prompts.append(prompt)
        if rng.random() < 0.4:
            free = d.ls.reference.manager.block_pool.get_num_free_blocks()
            d.occupy(rng.randint(0, max(0, min(free - 60, 12))))


def hit_checks(cls: Any) -> list[tuple[str, str, Any]]:
    checks = [
        (
            "toy_shared_prefix",
            "the shrunk example: B shares 35 of A's 40 tokens (hit 32), and 15, 40, 0",
            partial(scenario_toy_shared_prefix, cls),
        ),
        (
            "junction",
            "retention 0: full attention offers 16, the windows 0; the junction pins 16",
            partial(scenario_junction, cls),
        ),
        (
            "never_the_last_token",
            "a twin of a 32-token prompt hits 16 (31 tokens at most, aligned to 16)",
            partial(scenario_never_the_last_token, cls),
        ),
    ]
    checks.append(
        (
            "rounds_until_stable",
            "three groups, evictions: a window looked up early must be looked up again after "
            "a later one cut the hit (workload seed 6)",
            partial(random_hit_workload, 6, cls),
        )
    )
    checks += seeded_checks(
        "random_workload",
        "seeded random groups, shared prefixes and evictions",
        lambda seed: partial(random_hit_workload, seed, cls),
        range(4),
    )
    return checks


# --- the graders


def check_window_frees(
    student_class: type,
    *,
    verbose: bool = True,
    allow_reference: bool = False,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
) -> GradeReport:
    """Grade a `SlidingWindowManager` subclass's `get_num_skipped_tokens` and
    `remove_skipped_blocks`.

    `student_class(spec, block_pool, group_id, hash_block_size=..., alignment_tokens=...)` is
    built for every window group of a `KVCacheManager`. A step that runs refimpl's own versions
    fails unless `allow_reference`; a scenario still running after `time_limit` seconds (None:
    no limit) is stopped and fails.
    """
    return report_scenarios(
        "check_window_frees",
        student_class,
        window_checks(student_class),
        verbose,
        allow_reference,
        time_limit,
    )


def check_fixed_point_hit(
    student_class: type,
    *,
    verbose: bool = True,
    allow_reference: bool = False,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
) -> GradeReport:
    """Grade a `HybridKVCacheCoordinator` subclass's `find_longest_cache_hit`.

    `student_class(groups, num_blocks, prefix_cache_retention_interval=...)` replaces the
    coordinator of a `KVCacheManager`. A step that runs refimpl's own version fails unless
    `allow_reference`; a scenario still running after `time_limit` seconds (None: no limit) is
    stopped and fails.
    """
    return report_scenarios(
        "check_fixed_point_hit",
        student_class,
        hit_checks(student_class),
        verbose,
        allow_reference,
        time_limit,
    )
