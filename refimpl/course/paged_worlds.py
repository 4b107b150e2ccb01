"""The two kinds of Part I worlds a grader drives, and the fields it compares after every step.

A world holds one block manager (or scheduler) plus its own copies of the sequences, keyed by a
short name ("A", "S3") so that the reference's and the student's sequences can be matched.
"""

from __future__ import annotations

from typing import Any

from refimpl.course.lockstep import Lockstep, StateFields
from refimpl.paged import BlockManager, Scheduler, Sequence


class ManagerWorld:
    """A block manager and the sequences it serves."""

    def __init__(self, manager: Any, block_size: int) -> None:
        self.bm = manager
        self.block_size = block_size
        self.seqs: dict[str, Sequence] = {}


def manager_state(world: ManagerWorld, *, prefix_cache: bool) -> StateFields:
    """Everything observable about a block manager, in the order a learner should look at it."""
    bm = world.bm
    fields: StateFields = [
        ("free_block_ids (head first)", list(bm.free_block_ids)),
        ("used_block_ids", sorted(bm.used_block_ids)),
    ]
    for key, seq in world.seqs.items():
        fields.append((f"{key}.block_table", list(seq.block_table)))
        fields.append((f"{key}.num_cached_tokens", seq.num_cached_tokens))
    fields.extend((f"blocks[{i}].ref_count", block.ref_count) for i, block in enumerate(bm.blocks))
    if prefix_cache:
        fields.append(("hash_to_block_id", dict(bm.hash_to_block_id)))
        for i, block in enumerate(bm.blocks):
            fields.append((f"blocks[{i}].hash", block.hash))
            fields.append((f"blocks[{i}].token_ids", list(block.token_ids)))
    return fields


class LockstepManagerDriver:
    """Scenario vocabulary for block-manager graders; every manager call is one compared step.

    The driver plays the scheduler's and the model's part (setting `num_scheduled_tokens`,
    advancing `num_cached_tokens`, appending sampled tokens) identically in both worlds.
    """

    def __init__(self, lockstep: Lockstep, student_class: type, num_blocks: int, block_size: int, *, prefix_cache: bool) -> None:
        self.ls = lockstep
        self.block_size = block_size
        self.prefix_cache = prefix_cache
        lockstep.start(
            f"BlockManager(num_blocks={num_blocks}, block_size={block_size})",
            lambda: ManagerWorld(BlockManager(num_blocks, block_size, enable_prefix_caching=prefix_cache), block_size),
            lambda: ManagerWorld(student_class(num_blocks, block_size), block_size),
        )

    # --- driver-side changes
    @property
    def ref(self) -> ManagerWorld:
        return self.ls.reference

    def new(self, key: str, token_ids: list[int]) -> None:
        self.ls.both(lambda w: w.seqs.__setitem__(key, Sequence(token_ids, block_size=w.block_size)))

    def forget(self, key: str) -> None:
        self.ls.both(lambda w: w.seqs.pop(key))

    def schedule_tokens(self, key: str, n: int) -> None:
        self.ls.both(lambda w: setattr(w.seqs[key], "num_scheduled_tokens", n))

    def commit(self, key: str, next_token: int | None) -> None:
        """What postprocess does after hash_blocks: count the computed tokens, append the sampled one."""

        def apply(w: ManagerWorld) -> None:
            seq = w.seqs[key]
            seq.num_cached_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            if next_token is not None:
                seq.append_token(next_token)

        self.ls.both(apply)

    # --- compared steps
    def _name(self, key: str) -> str:
        return f"{key}: {len(self.ref.seqs[key])} tokens"

    def can_allocate(self, key: str) -> int:
        return self.ls.step(f"can_allocate({self._name(key)})", lambda w: w.bm.can_allocate(w.seqs[key]))

    def allocate(self, key: str, num_cached_blocks: int) -> None:
        self.ls.step(
            f"allocate({self._name(key)}, num_cached_blocks={num_cached_blocks})",
            lambda w: w.bm.allocate(w.seqs[key], num_cached_blocks),
            compare_result=False,
        )

    def deallocate(self, key: str) -> None:
        self.ls.step(f"deallocate({self._name(key)})", lambda w: w.bm.deallocate(w.seqs[key]), compare_result=False)

    def can_append(self, key: str) -> bool:
        return self.ls.step(f"can_append({self._name(key)})", lambda w: w.bm.can_append(w.seqs[key]))

    def may_append(self, key: str) -> None:
        self.ls.step(f"may_append({self._name(key)})", lambda w: w.bm.may_append(w.seqs[key]), compare_result=False)

    def hash_blocks(self, key: str) -> None:
        seq = self.ref.seqs[key]
        label = f"hash_blocks({self._name(key)}, num_cached_tokens={seq.num_cached_tokens}, num_scheduled_tokens={seq.num_scheduled_tokens})"
        self.ls.step(label, lambda w: w.bm.hash_blocks(w.seqs[key]), compare_result=False)

    # --- a request's life
    def admit(self, key: str) -> bool:
        """can_allocate, then allocate if it fits; False when it does not fit."""
        num_cached_blocks = self.can_allocate(key)
        if num_cached_blocks == -1:
            return False
        self.allocate(key, num_cached_blocks)
        return True

    def prefill(self, key: str, next_token: int, *, chunk: int | None = None) -> None:
        """Compute every uncached token (in chunks if asked), registering full blocks as postprocess does."""
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
        """One decode step for one sequence; False (and nothing changed) when no block is free for it."""
        if not self.can_append(key):
            return False
        self.may_append(key)
        self.schedule_tokens(key, 1)
        if self.prefix_cache:
            self.hash_blocks(key)
        self.commit(key, next_token)
        return True


# --- scheduler
class SchedulerWorld:
    """A scheduler, the sequences added to it, and its latest batch."""

    def __init__(self, scheduler: Any) -> None:
        self.sched = scheduler
        self.seqs: dict[str, Sequence] = {}
        self.batch: list[Sequence] = []
        self.is_prefill = False

    def key_of(self, seq: Any) -> str:
        for key, own in self.seqs.items():
            if own is seq:
                return key
        return f"<unknown object {type(seq).__name__}>"


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


class LockstepSchedulerDriver:
    """Scenario vocabulary for scheduler graders: add, step (schedule + postprocess), run to the end."""

    def __init__(self, lockstep: Lockstep, student_class: type, config: Any, *, token_seed: int = 0) -> None:
        self.ls = lockstep
        self.config = config
        self.token_seed = token_seed
        self.vocab = 32
        lockstep.start(
            f"Scheduler({config})",
            lambda: SchedulerWorld(Scheduler(config)),
            lambda: SchedulerWorld(student_class(config)),
        )

    @property
    def ref(self) -> SchedulerWorld:
        return self.ls.reference

    def add(self, key: str, token_ids: list[int], max_tokens: int, *, ignore_eos: bool = True) -> None:
        from refimpl.paged import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
        block_size = self.config.kvcache_block_size
        self.ls.both(lambda w: w.seqs.__setitem__(key, Sequence(token_ids, params, block_size=block_size)))
        self.ls.step(
            f"add({key}: {len(token_ids)} prompt tokens, max_tokens={max_tokens})",
            lambda w: w.sched.add(w.seqs[key]),
            compare_result=False,
        )

    def sampled_token(self, key: str, position: int) -> int:
        """The model's 'output': a fixed pseudo-random token per (sequence, position)."""
        import xxhash

        return xxhash.xxh32_intdigest(f"{self.token_seed}:{key}:{position}".encode()) % self.vocab

    def step(self) -> tuple[list[str], bool]:
        """schedule() then postprocess() with deterministic tokens; both are compared."""

        def schedule(w: SchedulerWorld) -> tuple[list[str], bool]:
            batch, is_prefill = w.sched.schedule()
            w.batch, w.is_prefill = list(batch), bool(is_prefill)
            return [w.key_of(s) for s in w.batch], w.is_prefill

        keys, is_prefill = self.ls.step("schedule()", schedule)
        tokens = [self.sampled_token(k, self.ref.seqs[k].num_tokens) for k in keys]
        label = f"postprocess([{', '.join(keys)}], token_ids={tokens}, is_prefill={is_prefill})"
        self.ls.step(label, lambda w: w.sched.postprocess(w.batch, tokens, w.is_prefill), compare_result=False)
        return keys, is_prefill

    def run(self, max_steps: int = 400) -> None:
        for _ in range(max_steps):
            if self.ref.sched.is_finished():
                return
            self.step()
        raise RuntimeError("grader scenario did not finish; this is a bug in the grader")
