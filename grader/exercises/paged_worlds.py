"""The worlds a grader drives, the fields it compares after every step, and how a
world is built from its spec (the scenario vocabulary is `grader.exercises.paged_drivers`).

A world holds one block manager (or scheduler) plus its own copies of the sequences, keyed by a
short name ("A", "S3") so that the reference's and the student's sequences can be matched.
Everything a scenario does to a world is one of the world's methods, called through a `Call`
(a method name and plain arguments): the same call can then be applied to the reference here
and to the student's world in another process (`grader.sandbox.remote`), and each world reports
its own `state()`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import numpy as np
import xxhash

from grader.exercises.addressing_world import swa_world
from grader.lockstep.calls import CONTEXTS, WORLD_KINDS, StateFields, plain
from refimpl.paged import BlockManager, SamplingParams, Scheduler, Sequence, hashing


class ManagerWorld:
    """A block manager and the sequences it serves; the methods are the steps a scenario
    takes."""

    def __init__(self, manager: Any, block_size: int, prefix_cache: bool = False) -> None:
        self.bm = manager
        self.block_size = block_size
        self.prefix_cache = prefix_cache
        self.seqs: dict[str, Sequence] = {}

    @classmethod
    def build(
        cls, implementation: type | None, num_blocks: int, block_size: int, prefix_cache: bool
    ) -> ManagerWorld:
        """The reference's manager (implementation None) or `implementation(num_blocks,
        block_size)`."""
        if implementation is None:
            manager = BlockManager(num_blocks, block_size, enable_prefix_caching=prefix_cache)
        else:
            manager = implementation(num_blocks, block_size)
        return cls(manager, block_size, prefix_cache)

    def state(self) -> StateFields:
        return manager_state(self, prefix_cache=self.prefix_cache)

    # --- driver-side changes (what the scheduler and the model do)
    def new(self, key: str, token_ids: list[int]) -> None:
        self.seqs[key] = Sequence(token_ids, block_size=self.block_size)

    def forget(self, key: str) -> None:
        del self.seqs[key]

    def schedule_tokens(self, key: str, n: int) -> None:
        self.seqs[key].num_scheduled_tokens = n

    def commit(self, key: str, next_token: int | None) -> None:
        """What postprocess does after hash_blocks: count the computed tokens, append the
        sampled one."""
        seq = self.seqs[key]
        seq.num_cached_tokens += seq.num_scheduled_tokens
        seq.num_scheduled_tokens = 0
        if next_token is not None:
            seq.append_token(next_token)

    # --- the manager's own methods, on a sequence named by its key
    def can_allocate(self, key: str) -> int:
        return self.bm.can_allocate(self.seqs[key])

    def allocate(self, key: str, num_cached_blocks: int) -> None:
        return self.bm.allocate(self.seqs[key], num_cached_blocks)

    def deallocate(self, key: str) -> None:
        return self.bm.deallocate(self.seqs[key])

    def can_append(self, key: str) -> bool:
        return self.bm.can_append(self.seqs[key])

    def may_append(self, key: str) -> None:
        return self.bm.may_append(self.seqs[key])

    def hash_blocks(self, key: str) -> None:
        return self.bm.hash_blocks(self.seqs[key])


def manager_state(world: ManagerWorld, *, prefix_cache: bool) -> StateFields:
    """Everything observable about a block manager, in the order a learner should look at
    it."""
    bm = world.bm
    fields: StateFields = [
        ("free_block_ids (head first)", list(bm.free_block_ids)),
        ("used_block_ids", sorted(bm.used_block_ids)),
    ]
    for key, seq in world.seqs.items():
        fields.append((f"{key}.block_table", list(seq.block_table)))
        fields.append((f"{key}.num_cached_tokens", seq.num_cached_tokens))
    fields.extend(
        (f"blocks[{i}].ref_count", block.ref_count) for i, block in enumerate(bm.blocks)
    )
    if prefix_cache:
        fields.append(("hash_to_block_id", dict(bm.hash_to_block_id)))
        for i, block in enumerate(bm.blocks):
            fields.append((f"blocks[{i}].hash", block.hash))
            fields.append((f"blocks[{i}].token_ids", list(block.token_ids)))
    return fields


class SchedulerWorld:
    """A scheduler, the sequences added to it, and its latest batch."""

    def __init__(self, scheduler: Any) -> None:
        self.sched = scheduler
        self.seqs: dict[str, Sequence] = {}
        self.batch: list[Sequence] = []
        self.is_prefill = False

    @classmethod
    def build(cls, implementation: type | None, config: Any) -> SchedulerWorld:
        """The reference's scheduler (implementation None) or `implementation(config)`."""
        return cls(Scheduler(config) if implementation is None else implementation(config))

    def state(self) -> StateFields:
        return scheduler_state(self)

    def key_of(self, seq: Any) -> str:
        for key, own in self.seqs.items():
            if own is seq:
                return key
        return f"<unknown object {type(seq).__name__}>"

    def new(
        self,
        key: str,
        token_ids: list[int],
        max_tokens: int,
        ignore_eos: bool,
        block_size: int,
    ) -> None:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
        self.seqs[key] = Sequence(token_ids, params, block_size=block_size)

    def add(self, key: str) -> None:
        return self.sched.add(self.seqs[key])

    def schedule(self) -> tuple[list[str], bool]:
        """schedule(), keeping the batch for postprocess; the batch is named by the sequences'
        keys."""
        batch, is_prefill = self.sched.schedule()
        self.batch, self.is_prefill = list(batch), bool(is_prefill)
        return [self.key_of(s) for s in self.batch], self.is_prefill

    def postprocess(self, token_ids: list[int]) -> None:
        return self.sched.postprocess(self.batch, token_ids, self.is_prefill)


def scheduler_state(world: SchedulerWorld) -> StateFields:
    sched = world.sched
    bm = sched.block_manager
    fields: StateFields = [
        ("waiting", [world.key_of(s) for s in sched.waiting]),
        ("running", [world.key_of(s) for s in sched.running]),
    ]
    for key, seq in world.seqs.items():
        fields.append((f"{key}.status", getattr(seq.status, "name", seq.status)))
        fields.append((f"{key}.num_tokens", seq.num_tokens))
        fields.append((f"{key}.num_cached_tokens", seq.num_cached_tokens))
        fields.append((f"{key}.num_scheduled_tokens", seq.num_scheduled_tokens))
        fields.append((f"{key}.is_prefill", seq.is_prefill))
        fields.append((f"{key}.block_table", list(seq.block_table)))
    fields.append(("block_manager.free_block_ids (head first)", list(bm.free_block_ids)))
    fields.append(("block_manager.hash_to_block_id", dict(bm.hash_to_block_id)))
    return fields


def function_world(implementation: Callable | None) -> Callable:
    """A pure function is its own world: `Call("__call__", args)` calls it (Part II graders
    call the reference function directly, so there is no reference world to build)."""
    if implementation is None:
        raise ValueError("a function world is built around the student's function only")
    return implementation


def plain_function_world(implementation: Callable | None) -> Callable:
    """A pure function whose answers are objects (groups, a cache config): each answer is
    turned into plain data (`grader.lockstep.calls.plain`) where it is made, so it can be
    compared field by field and sent back from a grading child."""
    function = function_world(implementation)
    return lambda *args: plain(function(*args))


# --- patches a scenario applies to both worlds
def _hash_input(token_ids: list[int], prefix: int = -1) -> bytes:
    """The bytes `compute_hash` feeds to xxh64 for one block (see `refimpl.paged.hashing`)."""
    head = prefix.to_bytes(8, "little") if prefix != -1 else b""
    return head + np.asarray(token_ids, dtype="<i8").tobytes()


class _CollidingXXH64:
    """An xxh64 hasher that reports the digest of another input for the inputs listed in
    `aliases`."""

    def __init__(self, aliases: dict[bytes, bytes]) -> None:
        self.aliases = aliases
        self.data = b""

    def update(self, data: bytes) -> None:
        self.data += bytes(data)

    def intdigest(self) -> int:
        return xxhash.xxh64_intdigest(self.aliases.get(self.data, self.data))


@contextmanager
def colliding_hashes(pairs: list[tuple[list[int], list[int]]]) -> Iterator[None]:
    """Make `compute_hash(a) == compute_hash(b)` for each (a, b) of first blocks, in both
    worlds.

    A real collision of xxh64 is too rare to find, so the hash function itself is patched for
    the scenario (`refimpl.paged.hashing`'s xxhash, which `compute_hash` and
    `BlockManager.compute_hash` both use); the managers' tables are never edited behind their
    back. A manager must hash with `compute_hash` for this to reach it.
    """
    aliases = {_hash_input(a): _hash_input(b) for a, b in pairs}
    # both the streaming and the one-shot API, whichever compute_hash uses
    fake = type(
        "xxhash",
        (),
        {
            "xxh64": staticmethod(lambda: _CollidingXXH64(aliases)),
            "xxh64_intdigest": staticmethod(
                lambda data: xxhash.xxh64_intdigest(aliases.get(bytes(data), bytes(data)))
            ),
        },
    )
    with mock.patch.object(hashing, "xxhash", fake):
        if hashing.compute_hash(pairs[0][0]) != hashing.compute_hash(pairs[0][1]):
            raise RuntimeError(
                "colliding_hashes no longer reaches compute_hash; fix the grader"
            )
        yield


WORLD_KINDS.update(
    {
        "manager": ManagerWorld.build,
        "scheduler": SchedulerWorld.build,
        "function": function_world,
        "plain_function": plain_function_world,
        "swa": swa_world,
    }
)
CONTEXTS["colliding_hashes"] = colliding_hashes


def _hybrid_world(kind: str) -> Callable[..., Any]:
    """Exercise 5's worlds (`grader.exercises.hybrid_allocator_worlds`), loaded on first
    use."""

    def build(implementation: Any, *args: Any) -> Any:
        from grader.exercises import hybrid_allocator_worlds as worlds

        world = worlds.WindowWorld if kind == "hybrid_window" else worlds.HitWorld
        return world.build(implementation, *args)

    return build


WORLD_KINDS["hybrid_window"] = _hybrid_world("hybrid_window")
WORLD_KINDS["hybrid_hit"] = _hybrid_world("hybrid_hit")
