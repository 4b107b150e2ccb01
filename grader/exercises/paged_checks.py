"""Graders for the Part I exercises: the block manager, the prefix cache and the scheduler.

Each grader replays named scenarios (small, hand-built, one rule each) and seeded random
workloads in lockstep against `refimpl.paged`, and returns a `GradeReport` whose table names
the first step where the student's state differs from the reference's.

The rules of the reference each grader checks are listed in `grader.exercises.rules`, each with
the scenario that fails when it is broken and a variant in `grader.exercises.broken` that
breaks it. In short: `check_block_manager` checks the free-queue order (head out, tail in, last
block freed first), the exact-fit and empty-pool edges of `can_allocate`/`can_append`, and the
new-block test at every block size down to 1; `check_prefix_cache` adds the hash chain
(continued from the previous block's own hash), registration of exactly the filled blocks,
matching (last block never looked up, tokens confirm a hit even under a real collision, first
miss stops, the free-block cost of in-use and freed hits), reference counts and the stale-hash
guard; `check_scheduler` checks prefill before decode with a blocking waiting head, chunking
only the first request, the token budget, `max_num_seqs`, the order of `running`, preemption
(newest first, to the front of waiting, itself when alone) and `postprocess` (register before
commit, drop a chunk's token, eos and max_tokens). Every scenario runs under a time limit
(`grader.lockstep.time_limit`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial
from typing import Any

from grader.exercises.paged_drivers import LockstepManagerDriver, LockstepSchedulerDriver
from grader.exercises.reference_code import grading_side
from grader.lockstep.engine import Lockstep, run_check
from grader.lockstep.report import GradeReport, seeded_checks
from grader.lockstep.time_limit import (
    DEFAULT_TIME_LIMIT,
    check_time_limit,
    limit_is_enforceable,
)
from refimpl.paged import SchedulerConfig


def toks(start: int, n: int) -> list[int]:
    """n consecutive token ids from `start`: distinct, readable block contents."""
    return list(range(start, start + n))


Scenario = Callable[[Lockstep], None]


def report_scenarios(
    check_name: str,
    student: Any,
    checks: list[tuple[str, str, Scenario]],
    verbose: bool,
    allow_reference: bool,
    time_limit: float | None,
) -> GradeReport:
    """Run each lockstep scenario on the student's class (here, or behind the grading child's
    StudentSide) and report one row per scenario; shared by every lockstep grader."""
    time_limit = check_time_limit(time_limit)
    if verbose and time_limit is not None and not limit_is_enforceable():
        print(
            f"note: this Python cannot stop a scenario from this thread; the {time_limit:g} s "
            "limit per scenario is not enforced"
        )
    side, guard = grading_side(student, check_name, allow_reference)
    report = GradeReport(
        f"{check_name}({student.__name__})",
        [
            run_check(name, description, scenario, guard, time_limit, side)
            for name, description, scenario in checks
        ],
    )
    if verbose:
        print(report.table())
    return report


# --- block manager (no prefix cache)
def _bm(
    ls: Lockstep, cls: type, num_blocks: int, block_size: int, prefix_cache: bool
) -> LockstepManagerDriver:
    return LockstepManagerDriver(ls, cls, num_blocks, block_size, prefix_cache=prefix_cache)


def scenario_allocate_from_head(cls: type, prefix_cache: bool, ls: Lockstep) -> None:
    d = _bm(ls, cls, 8, 4, prefix_cache)
    for key, n in (("A", 10), ("B", 4), ("C", 5)):  # 3, 1 and 2 blocks: ceil(len / 4)
        d.new(key, toks(100 * (ord(key) - 64), n))
        d.admit(key)


def scenario_free_last_block_first(cls: type, prefix_cache: bool, ls: Lockstep) -> None:
    d = _bm(ls, cls, 8, 4, prefix_cache)
    d.new("A", toks(100, 12))
    d.admit("A")
    d.new("B", toks(200, 7))
    d.admit("B")
    d.deallocate("A")
    d.deallocate("B")
    d.new("C", toks(300, 16))
    d.admit("C")


def scenario_pool_full(cls: type, prefix_cache: bool, ls: Lockstep) -> None:
    d = _bm(ls, cls, 4, 4, prefix_cache)
    d.new("A", toks(100, 9))
    d.admit("A")
    d.new("B", toks(200, 8))  # needs 2 blocks, 1 is free
    d.admit("B")
    d.new("C", toks(300, 4))  # needs exactly the last block
    d.admit("C")
    d.new("D", toks(400, 1))
    d.admit("D")
    d.deallocate("A")
    d.admit("B")


def scenario_append_at_block_boundary(cls: type, prefix_cache: bool, ls: Lockstep) -> None:
    d = _bm(ls, cls, 3, 4, prefix_cache)
    d.new("A", toks(100, 4))
    d.admit("A")
    d.prefill("A", 104)
    for token in range(105, 114):  # lengths 5..13: new blocks at 5 and 9, none left at 13
        if not d.decode("A", token):
            break


def scenario_append_with_empty_pool(cls: type, prefix_cache: bool, ls: Lockstep) -> None:
    d = _bm(ls, cls, 3, 4, prefix_cache)
    d.new("A", toks(100, 6))
    d.admit("A")
    d.prefill("A", 106)  # A: 7 tokens in blocks 0, 1
    d.new("B", toks(200, 3))
    d.admit("B")  # block 2: the pool is now empty
    d.prefill("B", 203)
    d.decode("A", 107)  # len 7: room left in A's second block
    d.decode("A", 108)  # len 8: still room (the block becomes full)
    d.decode("A", 109)  # len 9 starts a new block: refused, nothing changes
    d.decode("B", 204)  # len 4: room left
    d.decode("B", 205)  # len 5 starts a new block: refused
    d.deallocate("B")
    d.decode("A", 109)  # now the freed block is taken


def scenario_block_size_1(cls: type, prefix_cache: bool, ls: Lockstep) -> None:
    """With one token per block every decode starts a new block: `len % 1 == 1` is never
    true."""
    d = _bm(ls, cls, 6, 1, prefix_cache)
    d.new("A", toks(100, 2))
    d.admit("A")
    d.prefill("A", 102)  # A: 3 tokens, 2 computed in blocks 0 and 1
    for token in range(103, 108):  # each decode takes a new block until the pool is empty
        if not d.decode("A", token):
            break
    d.new("B", toks(200, 1))
    d.admit("B")  # refused: no block left
    d.deallocate("A")
    d.admit("B")


def random_manager_workload(cls: type, prefix_cache: bool, seed: int, ls: Lockstep) -> None:
    """Requests arrive, prefill (in chunks), decode, finish or get preempted and come back."""
    rng = random.Random(seed)
    block_size = (4, 3, 2, 1)[seed % 4]
    d = _bm(ls, cls, 14, block_size, prefix_cache)
    # Shared "documents": prompts start with a piece of one of them, so full blocks repeat.
    documents = [toks(1000 * (i + 1), 4 * block_size) for i in range(3)]
    live: list[str] = []
    next_token = 10_000
    for index in range(60):
        next_token += 1
        choice = rng.random()
        if choice < 0.3 or not live:
            key = f"S{index}"
            if prefix_cache and rng.random() < 0.7:
                doc = rng.choice(documents)
                prompt = doc[: rng.randint(1, len(doc))] + toks(
                    next_token * 10, rng.randint(0, block_size + 1)
                )
            else:
                prompt = toks(next_token * 10, rng.randint(1, 3 * block_size + 1))
            d.new(key, prompt)
            if d.admit(key):
                d.prefill(
                    key,
                    next_token,
                    chunk=rng.choice([None, None, max(1, block_size - 1), block_size + 1]),
                )
                live.append(key)
            else:
                d.forget(key)
        elif choice < 0.75:
            key = rng.choice(live)
            if not d.decode(key, next_token):
                d.deallocate(key)
                live.remove(key)
                d.forget(key)
        elif choice < 0.9:
            key = rng.choice(live)
            d.deallocate(key)
            live.remove(key)
            d.forget(key)
        else:  # preempt, then try to bring it straight back (it may hit its own freed blocks)
            key = rng.choice(live)
            d.deallocate(key)
            if d.admit(key):
                d.prefill(key, next_token)
            else:
                live.remove(key)
                d.forget(key)


def block_manager_checks(
    cls: type, prefix_cache: bool = False
) -> list[tuple[str, str, Scenario]]:
    checks = [
        (
            "allocate_from_head",
            "allocate takes ceil(len/block_size) blocks from the head of the free queue",
            partial(scenario_allocate_from_head, cls, prefix_cache),
        ),
        (
            "free_last_block_first",
            "deallocate returns blocks to the tail, last block first",
            partial(scenario_free_last_block_first, cls, prefix_cache),
        ),
        (
            "pool_full",
            "can_allocate returns -1 when the free blocks do not cover the prompt",
            partial(scenario_pool_full, cls, prefix_cache),
        ),
        (
            "append_at_block_boundary",
            "a new block exactly when the newest token starts one (len(seq) % block_size == 1 "
            "for block_size >= 2)",
            partial(scenario_append_at_block_boundary, cls, prefix_cache),
        ),
        (
            "append_with_empty_pool",
            "can_append is False only when a new block is needed and none is free",
            partial(scenario_append_with_empty_pool, cls, prefix_cache),
        ),
        (
            "block_size_1",
            "block_size 1: every decode token starts a new block "
            "((len - 1) % block_size == 0)",
            partial(scenario_block_size_1, cls, prefix_cache),
        ),
    ]
    checks += seeded_checks(  # block sizes 4, 3, 2, 1
        "random_workload",
        "seeded random requests, decodes and frees",
        lambda seed: partial(random_manager_workload, cls, prefix_cache, seed),
        range(4),
    )
    return checks


def check_block_manager(
    student_class: type,
    *,
    verbose: bool = True,
    allow_reference: bool = False,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
) -> GradeReport:
    """Grade a BlockManager without prefix caching: allocate, append and free in nano-vllm's
    order.

    `student_class(num_blocks, block_size)` must build a manager with `blocks`,
    `free_block_ids`, `used_block_ids`, `can_allocate`, `allocate`, `deallocate`, `can_append`
    and `may_append`. A manager that also has a prefix cache passes too: these scenarios never
    register a hash. A step that runs `refimpl.paged.BlockManager`'s own methods fails unless
    `allow_reference` (for grading the reference itself or the variants in
    `grader.exercises.broken`). A scenario still running after `time_limit` seconds (None: no
    limit) is stopped and fails.
    """
    return report_scenarios(
        "check_block_manager",
        student_class,
        block_manager_checks(student_class),
        verbose,
        allow_reference,
        time_limit,
    )


# --- prefix cache
def scenario_prefix_cache_example(cls: type, ls: Lockstep) -> None:
    """The nano-vllm write-up's picture: block_size=4, a 12-token request hits in-use #1 and
    free #3, then takes #6."""
    d = _bm(ls, cls, 10, 4, True)
    a, b, c = toks(10, 4), toks(20, 4), toks(30, 4)
    d.new("F0", toks(900, 4))  # another request holding block 0
    d.admit("F0")
    d.prefill("F0", 999)
    d.new("S1", a + [50])  # holds a in block 1 and keeps running
    d.admit("S1")
    d.prefill("S1", 51)
    d.new("S2", a + b + [60])  # shares block 1, registers b in block 3
    d.admit("S2")
    d.prefill("S2", 61)
    d.new("F1", toks(800, 4))  # takes block 5
    d.admit("F1")
    d.prefill("F1", 899)
    # block 3 is free but still findable; free queue is now [6, 7, 8, 9, 4, 3]
    d.deallocate("S2")
    d.new("Q", a + b + c)
    # L0 -> #1 (ref_count 2), L1 -> #3 (leaves the free queue), L2 -> #6; num_cached_tokens 8
    d.admit("Q")


def scenario_hash_chain_in_chunks(cls: type, ls: Lockstep) -> None:
    d = _bm(ls, cls, 8, 4, True)
    d.new("A", toks(10, 10))
    d.admit("A")
    d.prefill("A", 20, chunk=3)  # blocks fill at tokens 4 and 8, in the middle of chunks
    d.decode("A", 21)
    d.decode("A", 22)  # the 12th token fills block 2: registered by this decode step
    d.new("B", toks(10, 12) + [7])
    d.admit("B")


def scenario_last_block_never_looked_up(cls: type, ls: Lockstep) -> None:
    d = _bm(ls, cls, 6, 4, True)
    d.new("A", toks(10, 8))
    d.admit("A")
    d.prefill("A", 30)
    d.deallocate("A")
    d.new("B", toks(10, 8))  # every block is cached, the last one is still recomputed
    d.admit("B")


def scenario_in_use_hits_are_free(cls: type, ls: Lockstep) -> None:
    d = _bm(ls, cls, 4, 4, True)
    d.new("A", toks(10, 9))
    d.admit("A")
    d.prefill("A", 40)
    d.new("B", toks(10, 8) + [50])  # 3 blocks, 2 in use by A: needs 1 free block, 1 is free
    d.admit("B")


def scenario_free_hits_still_cost(cls: type, ls: Lockstep) -> None:
    d = _bm(ls, cls, 4, 4, True)
    d.new("A", toks(10, 9))
    d.admit("A")
    d.prefill("A", 40)
    d.deallocate("A")
    d.new("F", toks(500, 4))
    d.admit("F")
    # 4 blocks: 2 free-queue hits still use 2 of the 3 free blocks
    d.new("C", toks(10, 8) + toks(60, 5))
    d.admit("C")
    d.deallocate("F")
    d.admit("C")


def scenario_stale_hash_guard(cls: type, ls: Lockstep) -> None:
    d = _bm(ls, cls, 8, 4, True)
    prompt = toks(10, 9)
    for key in ("A", "B"):  # both miss: they prefill together before either is registered
        d.new(key, prompt)
        d.admit(key)
    for key in ("A", "B"):
        d.schedule_tokens(key, 9)
        d.hash_blocks(key)  # B's registration overwrites A's entries
        d.commit(key, 40)
    d.deallocate("A")
    d.new("F", toks(500, 16))  # reuses A's old blocks: their entries now point at B's blocks
    d.admit("F")
    d.new("C", prompt)
    d.admit("C")


def scenario_token_double_check(cls: type, ls: Lockstep) -> None:
    """A real collision: another block's tokens hash to the value of a cached block."""
    victim, other = toks(10, 4), toks(70, 4)
    with ls.context("colliding_hashes", [(other, victim)]):
        d = _bm(ls, cls, 8, 4, True)
        d.new("A", victim + toks(14, 5))
        d.admit("A")
        d.prefill("A", 40)
        d.deallocate("A")  # A's blocks stay cached: block 0 holds `victim` under hash h
        d.new("C", other + toks(80, 5))
        # `other` also hashes to h: the table points at block 0, whose tokens differ
        d.admit("C")
        d.prefill("C", 90)  # C registers its own first block under h: the entry moves to it
        d.new("D", victim + toks(60, 5))
        d.admit("D")  # now h points at C's block (in use), whose tokens differ from `victim`


def scenario_entry_taken_over_mid_prefill(cls: type, ls: Lockstep) -> None:
    """Another sequence takes over a block's hash entry before the first one fills its next
    block."""
    d = _bm(ls, cls, 8, 4, True)
    prompt = toks(10, 9)
    for key in ("A", "B"):  # both miss: nothing is registered yet
        d.new(key, prompt)
        d.admit(key)
    d.schedule_tokens("A", 4)
    # A's first chunk fills its block 0: the entry for it points at A's block
    d.hash_blocks("A")
    d.commit("A", None)
    d.prefill("B", 50)  # B registers the same content: the entries now point at B's blocks
    d.schedule_tokens("A", 5)
    # the chain continues from the hash stored on A's block 0, not from the table
    d.hash_blocks("A")
    d.commit("A", 40)
    d.new("Q", prompt)
    d.admit("Q")


def scenario_block_size_1_prefix(cls: type, ls: Lockstep) -> None:
    """One token per block: each token is a cached block; decodes register a block every
    step."""
    d = _bm(ls, cls, 8, 1, True)
    d.new("A", [5, 6, 7])
    d.admit("A")
    d.prefill("A", 8)
    d.deallocate("A")
    d.new("B", [5, 6, 9])
    d.admit("B")  # blocks [5] and [5, 6] hit (freed); the last block is never looked up
    d.prefill("B", 10)
    d.decode("B", 11)  # the token computed now fills (and registers) a block of its own
    d.new("C", [5, 6, 9, 10, 12])
    d.admit("C")  # four hits on B's blocks, in use


def scenario_first_miss_stops_matching(cls: type, ls: Lockstep) -> None:
    d = _bm(ls, cls, 12, 4, True)
    b0, b1, b2 = toks(10, 4), toks(20, 4), toks(30, 4)
    d.new("S", b0 + b1 + b2 + [40])
    d.admit("S")
    d.new("U", b0 + [50])  # misses too: S is not registered yet
    d.admit("U")
    d.prefill("S", 41)  # registers b0, b1, b2 in S's blocks
    d.prefill("U", 51)  # takes over the entry for b0
    d.deallocate("U")
    # takes every free block, U's last: the only entry for b0 disappears
    d.new("F", toks(500, 32))
    d.admit("F")
    d.deallocate("F")
    # b1 and b2 are still cached, but after a miss they are useless
    d.new("Q", b0 + b1 + b2 + [60])
    d.admit("Q")


def scenario_preempted_rehits_own_blocks(cls: type, ls: Lockstep) -> None:
    d = _bm(ls, cls, 8, 4, True)
    d.new("A", toks(10, 10))
    d.admit("A")
    d.prefill("A", 20)
    d.new("B", toks(100, 6))
    d.admit("B")
    d.prefill("B", 106)
    for token in (21, 22, 23):
        d.decode("A", token)
    d.deallocate("A")  # preempted: its full blocks stay cached in the free queue
    d.admit("A")
    d.prefill("A", 24)


def prefix_cache_checks(cls: type) -> list[tuple[str, str, Scenario]]:
    checks = [
        (
            "example_12_tokens",
            "block_size=4, 12 tokens: L0 hits in-use #1, L1 hits free #3, L2 takes #6",
            partial(scenario_prefix_cache_example, cls),
        ),
        (
            "hash_chain_in_chunks",
            "hash_blocks registers exactly the blocks filled this step, chained",
            partial(scenario_hash_chain_in_chunks, cls),
        ),
        (
            "last_block_never_looked_up",
            "a fully cached prompt still recomputes its last block",
            partial(scenario_last_block_never_looked_up, cls),
        ),
        (
            "in_use_hits_need_no_free_block",
            "a hit on a block in use costs no free block",
            partial(scenario_in_use_hits_are_free, cls),
        ),
        (
            "free_hits_still_cost",
            "a hit on a freed block still needs a free slot",
            partial(scenario_free_hits_still_cost, cls),
        ),
        (
            "stale_hash_guard",
            "reusing a block drops its hash entry only if the entry points to it",
            partial(scenario_stale_hash_guard, cls),
        ),
        (
            "token_double_check",
            "a real hash collision (compute_hash patched in both worlds) is a miss: tokens "
            "decide",
            partial(scenario_token_double_check, cls),
        ),
        (
            "entry_taken_over_mid_prefill",
            "the chain continues from the previous block's own hash after another sequence "
            "takes its entry",
            partial(scenario_entry_taken_over_mid_prefill, cls),
        ),
        (
            "block_size_1",
            "block_size 1: one-token blocks are matched, registered and appended like any "
            "other",
            partial(scenario_block_size_1_prefix, cls),
        ),
        (
            "first_miss_stops_matching",
            "matching stops at the first miss, even if later blocks are cached",
            partial(scenario_first_miss_stops_matching, cls),
        ),
        (
            "preempted_rehits_own_blocks",
            "a preempted request finds its freed blocks again",
            partial(scenario_preempted_rehits_own_blocks, cls),
        ),
    ]
    checks += seeded_checks(  # block sizes 4, 3, 2, 1
        "random_shared_prefixes",
        "seeded random requests sharing prefixes",
        lambda seed: partial(random_manager_workload, cls, True, seed),
        range(4),
    )
    return checks


def check_prefix_cache(
    student_class: type,
    *,
    verbose: bool = True,
    allow_reference: bool = False,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
) -> GradeReport:
    """Grade a BlockManager with nano-vllm's prefix cache (hash chain, matching, registration).

    Besides what `check_block_manager` needs, `student_class(num_blocks, block_size)` must keep
    `hash_to_block_id` and implement `hash_blocks`; block hashes must be `compute_hash` chains.
    It may inherit allocate/append/free from `refimpl.paged.BlockManager` (exercise 2 does),
    but a step that runs the reference's matching, allocation or registration fails unless
    `allow_reference`. A scenario still running after `time_limit` seconds (None: no limit) is
    stopped and fails.
    """
    return report_scenarios(
        "check_prefix_cache",
        student_class,
        prefix_cache_checks(student_class),
        verbose,
        allow_reference,
        time_limit,
    )


# --- scheduler
def _sched(ls: Lockstep, cls: type, **config) -> LockstepSchedulerDriver:
    return LockstepSchedulerDriver(ls, cls, SchedulerConfig(**config))


def scenario_prefill_then_decode(cls: type, ls: Lockstep) -> None:
    d = _sched(ls, cls, num_kvcache_blocks=16, kvcache_block_size=4)
    d.add("A", toks(10, 5), max_tokens=4)
    d.add("B", toks(20, 3), max_tokens=2)
    d.run()


def scenario_chunked_prefill(cls: type, ls: Lockstep) -> None:
    d = _sched(ls, cls, num_kvcache_blocks=16, kvcache_block_size=4, max_num_batched_tokens=8)
    d.add("A", toks(10, 6), max_tokens=2)
    # does not fit beside A, is chunked 8 + 3 when it is first
    d.add("B", toks(20, 11), max_tokens=2)
    d.add("C", toks(40, 3), max_tokens=2)
    d.run()


def scenario_preempt_last_running(cls: type, ls: Lockstep) -> None:
    d = _sched(ls, cls, num_kvcache_blocks=6, kvcache_block_size=2)
    for key, start in (("A", 10), ("B", 20), ("C", 30)):
        d.add(key, toks(start, 3), max_tokens=6)
    d.run()
    if d.ref.sched.num_preemptions == 0:
        raise RuntimeError("scenario preempt_last_running no longer preempts; fix the grader")


def scenario_preempt_self(cls: type, ls: Lockstep) -> None:
    d = _sched(ls, cls, num_kvcache_blocks=5, kvcache_block_size=2)
    d.add("A", toks(10, 3), max_tokens=4)
    d.add("B", toks(20, 3), max_tokens=4)
    d.step()  # prefill A and B: 2 blocks each, 1 block left
    d.step()  # decode at length 4: both still have room
    # length 5: both need a block; A takes the last one, B is alone and preempts itself
    keys, _ = d.step()
    if keys != ["A"] or [d.ref.key_of(s) for s in d.ref.sched.waiting] != ["B"]:
        raise RuntimeError(
            "scenario preempt_self no longer preempts B by itself; fix the grader"
        )
    d.run()


def scenario_waiting_head_does_not_fit(cls: type, ls: Lockstep) -> None:
    d = _sched(ls, cls, num_kvcache_blocks=6, kvcache_block_size=2)
    d.add("A", toks(10, 5), max_tokens=4)  # 3 blocks now, 4 at its longest
    d.step()  # prefill A
    d.add("B", toks(20, 7), max_tokens=2)  # needs 4 blocks: does not fit while A runs
    d.add("C", toks(40, 2), max_tokens=2)  # needs 1 block: would fit, but waits behind B
    keys, is_prefill = d.step()
    if (keys, is_prefill) != (["A"], False) or [
        d.ref.key_of(s) for s in d.ref.sched.waiting
    ] != ["B", "C"]:
        raise RuntimeError(
            "scenario waiting_head_does_not_fit no longer blocks B; fix the grader"
        )
    d.run()


def scenario_max_num_seqs(cls: type, ls: Lockstep) -> None:
    d = _sched(ls, cls, num_kvcache_blocks=16, kvcache_block_size=4, max_num_seqs=2)
    for key, start in (("A", 10), ("B", 20), ("C", 30)):
        d.add(key, toks(start, 2), max_tokens=3)
    d.run()


def scenario_eos_and_max_tokens(cls: type, ls: Lockstep) -> None:
    d = LockstepSchedulerDriver(
        ls,
        cls,
        SchedulerConfig(num_kvcache_blocks=16, kvcache_block_size=4, eos=5),
        token_seed=3,
    )
    d.vocab = 8
    d.add("A", toks(10, 3), max_tokens=12, ignore_eos=False)  # stops at the first sampled 5
    # samples 5 too, but runs to max_tokens
    d.add("B", toks(20, 3), max_tokens=6, ignore_eos=True)
    d.run()
    if (
        d.ref.seqs["A"].num_completion_tokens == 12
        or 5 not in d.ref.seqs["B"].completion_token_ids
    ):
        raise RuntimeError("scenario eos_and_max_tokens no longer samples eos; fix the grader")


def scenario_prefix_hit_shortens_prefill(cls: type, ls: Lockstep) -> None:
    d = _sched(ls, cls, num_kvcache_blocks=16, kvcache_block_size=4, max_num_batched_tokens=10)
    d.add("A", toks(10, 9), max_tokens=3)
    d.step()  # A's prefill registers its two full blocks
    d.add("C", toks(50, 4), max_tokens=2)
    # 2 cached blocks: only 2 tokens to prefill
    d.add("B", toks(10, 8) + [99, 98], max_tokens=2)
    keys, _ = d.step()  # C takes 4 of the 10-token budget; B's 2 uncached tokens fit beside it
    if keys != ["C", "B"]:
        raise RuntimeError(
            "scenario prefix_hit_shortens_prefill no longer batches B with C; fix the grader"
        )
    d.run()


def random_scheduler_workload(cls: type, seed: int, ls: Lockstep) -> None:
    rng = random.Random(1000 + seed)
    block_size = (4, 2, 3)[seed % 3]
    num_blocks = 12
    d = LockstepSchedulerDriver(
        ls,
        cls,
        SchedulerConfig(
            num_kvcache_blocks=num_blocks,
            kvcache_block_size=block_size,
            max_num_seqs=rng.choice([2, 3, 4]),
            max_num_batched_tokens=rng.choice([6, 10, 16]),
            eos=0,
        ),
        token_seed=seed,
    )
    documents = [toks(100 * (i + 1), 3 * block_size) for i in range(2)]
    arrivals: dict[int, list[tuple[str, list[int], int, bool]]] = {}
    for i in range(8):
        if rng.random() < 0.6:
            doc = rng.choice(documents)
            prompt = doc[: rng.randint(1, len(doc))] + toks(1000 + 20 * i, rng.randint(0, 3))
        else:
            prompt = toks(1000 + 20 * i, rng.randint(1, 10))
        max_tokens = rng.randint(1, 8)
        while (len(prompt) + max_tokens - 1 + block_size - 1) // block_size > num_blocks:
            max_tokens -= 1
        arrivals.setdefault(rng.randint(0, 10), []).append(
            (f"S{i}", prompt, max_tokens, rng.random() < 0.5)
        )
    for step in range(400):
        for key, prompt, max_tokens, ignore_eos in arrivals.pop(step, []):
            d.add(key, prompt, max_tokens, ignore_eos=ignore_eos)
        if not arrivals and d.ref.sched.is_finished():
            return
        if not d.ref.sched.is_finished():
            d.step()
    raise RuntimeError("random scheduler workload did not finish; this is a bug in the grader")


def scheduler_checks(cls: type) -> list[tuple[str, str, Scenario]]:
    checks = [
        (
            "prefill_then_decode",
            "waiting requests prefill together, then decode one token each",
            partial(scenario_prefill_then_decode, cls),
        ),
        (
            "chunked_prefill_first_only",
            "only the first waiting request may be cut to the token budget",
            partial(scenario_chunked_prefill, cls),
        ),
        (
            "preempt_last_running",
            "no free block for a decode: preempt the newest running request",
            partial(scenario_preempt_last_running, cls),
        ),
        (
            "preempt_self_when_alone",
            "no block and no other running request: the request preempts itself",
            partial(scenario_preempt_self, cls),
        ),
        (
            "waiting_head_does_not_fit",
            "a waiting head that does not fit blocks the queue: no later request jumps it",
            partial(scenario_waiting_head_does_not_fit, cls),
        ),
        (
            "max_num_seqs",
            "at most max_num_seqs requests per step; the batch goes back to the front of "
            "running",
            partial(scenario_max_num_seqs, cls),
        ),
        (
            "eos_and_max_tokens",
            "a request finishes on eos (unless ignore_eos) or at max_tokens",
            partial(scenario_eos_and_max_tokens, cls),
        ),
        (
            "prefix_hit_shortens_prefill",
            "cached blocks are neither scheduled again nor counted in the token budget",
            partial(scenario_prefix_hit_shortens_prefill, cls),
        ),
    ]
    checks += seeded_checks(
        "random_workload",
        "seeded random arrivals on a tight pool",
        lambda seed: partial(random_scheduler_workload, cls, seed),
        range(3),
    )
    return checks


def check_scheduler(
    student_class: type,
    *,
    verbose: bool = True,
    allow_reference: bool = False,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
) -> GradeReport:
    """Grade a Scheduler: batches, chunked prefill, preemption, postprocess, in nano-vllm's
    order.

    `student_class(config)` gets a `SchedulerConfig` and must keep `waiting`, `running` and
    `block_manager` and implement `add`, `schedule`, `postprocess`, `preempt` and
    `is_finished`. Its block manager may be the reference's; a step that runs
    `refimpl.paged.Scheduler`'s own `schedule`, `preempt` or `postprocess` fails unless
    `allow_reference`. A scenario still running after `time_limit` seconds (None: no limit) is
    stopped and fails, so an endless loop (in self-preemption, say) cannot hang a notebook.
    """
    return report_scenarios(
        "check_scheduler",
        student_class,
        scheduler_checks(student_class),
        verbose,
        allow_reference,
        time_limit,
    )
