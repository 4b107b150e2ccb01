"""The scenario vocabulary of the Part I graders: drivers that take a `Lockstep` through a
block manager's or a scheduler's life, one compared step per call.

Each driver plays the scheduler's and the model's part identically in both worlds; the worlds
themselves (what a step does, which fields are compared) are `grader.exercises.paged_worlds`.
"""

from __future__ import annotations

from typing import Any

import xxhash

from grader.exercises.paged_worlds import ManagerWorld, SchedulerWorld
from grader.lockstep.calls import Call, WorldSpec
from grader.lockstep.engine import Lockstep


class LockstepManagerDriver:
    """Scenario vocabulary for block-manager graders; every manager call is one compared step.

    The driver plays the scheduler's and the model's part (setting `num_scheduled_tokens`,
    advancing `num_cached_tokens`, appending sampled tokens) identically in both worlds.
    """

    def __init__(
        self,
        lockstep: Lockstep,
        student_class: Any,
        num_blocks: int,
        block_size: int,
        *,
        prefix_cache: bool,
    ) -> None:
        self.ls = lockstep
        self.block_size = block_size
        self.prefix_cache = prefix_cache
        lockstep.start(
            f"BlockManager(num_blocks={num_blocks}, block_size={block_size})",
            WorldSpec("manager", (num_blocks, block_size, prefix_cache)),
            student_class,
        )

    # --- driver-side changes
    @property
    def ref(self) -> ManagerWorld:
        return self.ls.reference

    def new(self, key: str, token_ids: list[int]) -> None:
        self.ls.both(Call("new", (key, list(token_ids))))

    def forget(self, key: str) -> None:
        self.ls.both(Call("forget", (key,)))

    def schedule_tokens(self, key: str, n: int) -> None:
        self.ls.both(Call("schedule_tokens", (key, n)))

    def commit(self, key: str, next_token: int | None) -> None:
        self.ls.both(Call("commit", (key, next_token)))

    # --- compared steps
    def _name(self, key: str) -> str:
        return f"{key}: {len(self.ref.seqs[key])} tokens"

    def can_allocate(self, key: str) -> int:
        return self.ls.step(f"can_allocate({self._name(key)})", Call("can_allocate", (key,)))

    def allocate(self, key: str, num_cached_blocks: int) -> None:
        self.ls.step(
            f"allocate({self._name(key)}, num_cached_blocks={num_cached_blocks})",
            Call("allocate", (key, num_cached_blocks)),
            compare_result=False,
        )

    def deallocate(self, key: str) -> None:
        self.ls.step(
            f"deallocate({self._name(key)})", Call("deallocate", (key,)), compare_result=False
        )

    def can_append(self, key: str) -> bool:
        return self.ls.step(f"can_append({self._name(key)})", Call("can_append", (key,)))

    def may_append(self, key: str) -> None:
        self.ls.step(
            f"may_append({self._name(key)})", Call("may_append", (key,)), compare_result=False
        )

    def hash_blocks(self, key: str) -> None:
        seq = self.ref.seqs[key]
        label = (
            f"hash_blocks({self._name(key)}, num_cached_tokens={seq.num_cached_tokens}, "
            f"num_scheduled_tokens={seq.num_scheduled_tokens})"
        )
        self.ls.step(label, Call("hash_blocks", (key,)), compare_result=False)

    # --- a request's life
    def admit(self, key: str) -> bool:
        """can_allocate, then allocate if it fits; False when it does not fit."""
        num_cached_blocks = self.can_allocate(key)
        if num_cached_blocks == -1:
            return False
        self.allocate(key, num_cached_blocks)
        return True

    def prefill(self, key: str, next_token: int, *, chunk: int | None = None) -> None:
        """Compute every uncached token (in chunks if asked), registering full blocks as
        postprocess does."""
        seq = self.ref.seqs[key]
        done = False
        while not done:
            n = seq.num_tokens - seq.num_cached_tokens
            if chunk is not None:
                n = min(n, chunk)
            self.schedule_tokens(key, n)
            if self.prefix_cache:
                self.hash_blocks(key)
            done = seq.num_cached_tokens + n == seq.num_tokens
            self.commit(key, next_token if done else None)

    def decode(self, key: str, next_token: int) -> bool:
        """One decode step for one sequence; False (and nothing changed) when no block is free
        for it."""
        if not self.can_append(key):
            return False
        self.may_append(key)
        self.schedule_tokens(key, 1)
        if self.prefix_cache:
            self.hash_blocks(key)
        self.commit(key, next_token)
        return True


# --- scheduler


class LockstepSchedulerDriver:
    """Scenario vocabulary for scheduler graders: add, step (schedule + postprocess), run to
    the end."""

    def __init__(
        self, lockstep: Lockstep, student_class: Any, config: Any, *, token_seed: int = 0
    ) -> None:
        self.ls = lockstep
        self.config = config
        self.token_seed = token_seed
        self.vocab = 32
        lockstep.start(
            f"Scheduler({config})", WorldSpec("scheduler", (config,)), student_class
        )

    @property
    def ref(self) -> SchedulerWorld:
        return self.ls.reference

    def add(
        self, key: str, token_ids: list[int], max_tokens: int, *, ignore_eos: bool = True
    ) -> None:
        self.ls.both(
            Call(
                "new",
                (key, list(token_ids), max_tokens, ignore_eos, self.config.kvcache_block_size),
            )
        )
        self.ls.step(
            f"add({key}: {len(token_ids)} prompt tokens, max_tokens={max_tokens})",
            Call("add", (key,)),
            compare_result=False,
        )

    def sampled_token(self, key: str, position: int) -> int:
        """The model's 'output': a fixed pseudo-random token per (sequence, position)."""
        return (
            xxhash.xxh32_intdigest(f"{self.token_seed}:{key}:{position}".encode()) % self.vocab
        )

    def step(self) -> tuple[list[str], bool]:
        """schedule() then postprocess() with deterministic tokens; both are compared."""
        keys, is_prefill = self.ls.step("schedule()", Call("schedule"))
        tokens = [self.sampled_token(k, self.ref.seqs[k].num_tokens) for k in keys]
        label = (
            f"postprocess([{', '.join(keys)}], token_ids={tokens}, is_prefill={is_prefill})"
        )
        self.ls.step(label, Call("postprocess", (tokens,)), compare_result=False)
        return keys, is_prefill

    def run(self, max_steps: int = 400) -> None:
        for _ in range(max_steps):
            if self.ref.sched.is_finished():
                return
            self.step()
        raise RuntimeError("grader scenario did not finish; this is a bug in the grader")
