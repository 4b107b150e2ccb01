"""Study the scheduler on a CPU with no model: a deterministic fake model runner and a step
driver.

`FakeModelRunner` plays nano-vllm's `ModelRunner.run(seqs, is_prefill)`. It keeps a fake KV
cache (one token id per slot instead of K/V vectors), writes the tokens each step computes into
the slots that the block tables name, reads a sequence's whole history back through its block
table, and returns a next token that is a pure function of that history. A wrong block table, a
wrong prefix-cache hit or a block reused while still needed makes the read-back differ and
raises; a correct scheduler gives the same outputs whatever the batching, chunking, caching or
preemption.

`SchedulerDriver` plays `LLMEngine.step`: schedule, run, postprocess, and record one
`StepRecord` per step for tables and timelines.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import xxhash

from refimpl.errors import InvariantError
from refimpl.paged.invariants import check_invariants
from refimpl.paged.scheduler import Scheduler
from refimpl.paged.sequence import Sequence
from refimpl.validation import check_int_at_least, check_positive_int


class FakeModelRunner:
    """A stand-in for the model: next token = xxh64(history) mod `vocab_size`.

    Because the token depends only on the sequence's own history, a batch of sequences gets the
    same outputs no matter how the scheduler groups, chunks, caches or preempts them.

    End of sequence, both optional and both deterministic:
    - `eos_after=k`: the completion token at index k (the (k+1)-th generated token) is `eos`;
    - `eos_period=p`: a history whose hash is divisible by p (about 1 in p) is followed by
      `eos`. Ordinary tokens are never equal to `eos`, so EOS appears only where these rules
      put it.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        vocab_size: int = 1000,
        eos: int = -1,
        eos_after: int | None = None,
        eos_period: int | None = None,
    ) -> None:
        self.num_blocks = check_positive_int("num_blocks", num_blocks)
        self.block_size = check_positive_int("block_size", block_size)
        check_int_at_least("vocab_size", vocab_size, 2)
        if (eos_after is not None or eos_period is not None) and eos < 0:
            raise ValueError(
                f"eos_after/eos_period need an eos token id >= 0, got eos={eos!r}"
            )
        if eos_after is not None:
            check_int_at_least("eos_after", eos_after, 0, " (a completion-token index)")
        if eos_period is not None:
            check_positive_int("eos_period", eos_period)
        self.vocab_size = vocab_size
        self.eos = eos
        self.eos_after = eos_after
        self.eos_period = eos_period
        # kv_cache[block_id][offset] is the token whose K/V the slot holds (-1: never written).
        self.kv_cache: list[list[int]] = [[-1] * block_size for _ in range(num_blocks)]
        # tokens pushed through the fake model, all steps together
        self.num_computed_tokens = 0

    @classmethod
    def for_scheduler(cls, scheduler: Scheduler, **kwargs) -> FakeModelRunner:
        """A runner whose cache matches the scheduler's pool and whose EOS is the
        scheduler's."""
        kwargs.setdefault("eos", scheduler.eos)
        return cls(scheduler.block_manager.num_blocks, scheduler.block_size, **kwargs)

    def next_token(self, history: list[int], num_prompt_tokens: int) -> int:
        """The token that follows `history`: a pure function of the history and the prompt
        length."""
        digest = xxhash.xxh64(np.asarray(history, dtype="<i8").tobytes()).intdigest()
        completion_index = len(history) - num_prompt_tokens
        if self.eos_after is not None and completion_index == self.eos_after:
            return self.eos
        if (
            self.eos_period is not None
            and completion_index >= 0
            and (digest >> 32) % self.eos_period == 0
        ):
            return self.eos
        token = digest % self.vocab_size
        if token == self.eos:  # keep ordinary tokens distinct from EOS
            token = (token + 1) % self.vocab_size
        return token

    def reference_completion(
        self, prompt: list[int], max_tokens: int, ignore_eos: bool = False
    ) -> list[int]:
        """What one sequence alone would generate, with no scheduler and no cache: the
        yardstick that every batched, chunked, cached or preempted run must equal."""
        tokens = list(prompt)
        while True:
            token = self.next_token(tokens, len(prompt))
            tokens.append(token)
            completion = tokens[len(prompt) :]
            if (not ignore_eos and token == self.eos) or len(completion) == max_tokens:
                return completion

    def _slot(self, seq: Sequence, position: int) -> tuple[int, int]:
        index = position // self.block_size
        if index >= len(seq.block_table):
            raise InvariantError(
                f"sequence {seq.seq_id} computes position {position} but its block table "
                f"{seq.block_table} has no block {index}"
            )
        return seq.block_table[index], position % self.block_size

    def run(self, seqs: list[Sequence], is_prefill: bool) -> list[int]:
        """Compute this step's tokens for every sequence and return one sampled token each.

        Prefill computes positions `num_cached_tokens ... num_cached_tokens +
        num_scheduled_tokens - 1`; decode computes the last position only (the token sampled in
        the previous step).
        """
        if seqs and self.block_size != seqs[0].block_size:
            raise ValueError(
                f"runner block_size {self.block_size} != sequence block_size "
                f"{seqs[0].block_size}"
            )
        token_ids = []
        for seq in seqs:
            if is_prefill:
                start, end = (
                    seq.num_cached_tokens,
                    seq.num_cached_tokens + seq.num_scheduled_tokens,
                )
            else:
                start, end = len(seq) - 1, len(seq)
            if not 0 <= start < end <= len(seq):
                raise InvariantError(
                    f"sequence {seq.seq_id} was scheduled to compute positions [{start}, "
                    f"{end}) of {len(seq)} tokens"
                )
            for position in range(start, end):  # store_kvcache through the slot mapping
                block_id, offset = self._slot(seq, position)
                self.kv_cache[block_id][offset] = seq.token_ids[position]
            self.num_computed_tokens += end - start
            # Attention reads the whole history back through the block table.
            history = [
                self.kv_cache[b][o] for b, o in (self._slot(seq, p) for p in range(end))
            ]
            if history != seq.token_ids[:end]:
                wrong = next(p for p in range(end) if history[p] != seq.token_ids[p])
                if history[wrong] == -1:
                    raise InvariantError(
                        f"sequence {seq.seq_id}: the cache slot for position {wrong} was "
                        "never written by this "
                        "runner (a block it did not compute, e.g. a prefix hit on another "
                        "runner's work)"
                    )
                raise InvariantError(
                    f"sequence {seq.seq_id}: the cache slot for position {wrong} holds token "
                    f"{history[wrong]}, "
                    f"expected {seq.token_ids[wrong]} (a block was shared or reused wrongly)"
                )
            token_ids.append(self.next_token(history, seq.num_prompt_tokens))
        return token_ids


@dataclass(frozen=True)
class StepRecord:
    """What one engine step did. Per-sequence tuples are aligned with `seq_ids` (batch
    order)."""

    step: int
    is_prefill: bool
    seq_ids: tuple[int, ...]
    num_scheduled_tokens: tuple[int, ...]  # tokens computed for each sequence (its chunk size)
    # tokens served by the prefix cache when allocated this step
    prefix_hit_tokens: tuple[int, ...]
    chunked_seq_ids: tuple[int, ...]  # prefills that leave part of the prompt for a later step
    # freed to make room during this step's decode scheduling
    preempted_seq_ids: tuple[int, ...]
    finished_seq_ids: tuple[int, ...]
    num_blocks_in_use: int  # after postprocess
    num_waiting: int  # after postprocess
    num_running: int  # after postprocess

    @property
    def kind(self) -> str:
        return "prefill" if self.is_prefill else "decode"

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_scheduled_tokens)

    @property
    def num_prefix_hit_tokens(self) -> int:
        return sum(self.prefix_hit_tokens)


class MaxStepsExceeded(RuntimeError):
    """The driver ran more steps than allowed without the scheduler becoming idle."""


class SchedulerDriver:
    """`LLMEngine.step` without a model: schedule, run the fake model, postprocess, record.

    With `check=True` (the default) every step ends with `check_invariants` over all live
    sequences and a check that finished sequences hold no blocks.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        runner: FakeModelRunner | None = None,
        *,
        check: bool = True,
    ) -> None:
        bm = scheduler.block_manager
        if runner is None and (bm.used_block_ids or bm.hash_to_block_id):
            raise ValueError(
                "this scheduler already holds or caches blocks computed by an earlier runner; "
                "pass that "
                "FakeModelRunner (its fake KV cache holds their contents), or keep using the "
                "same driver"
            )
        self.scheduler = scheduler
        self.runner = (
            runner if runner is not None else FakeModelRunner.for_scheduler(scheduler)
        )
        if (self.runner.num_blocks, self.runner.block_size) != (
            scheduler.block_manager.num_blocks,
            scheduler.block_size,
        ):
            raise ValueError(
                f"runner cache ({self.runner.num_blocks} blocks of {self.runner.block_size}) "
                "does not match the "
                f"scheduler pool ({scheduler.block_manager.num_blocks} blocks of "
                f"{scheduler.block_size})"
            )
        self.check = check
        self.steps: list[StepRecord] = []
        self.finished: list[Sequence] = []  # in the order they finished

    def add(self, seqs: Sequence | Iterable[Sequence]) -> None:
        """Queue one sequence or several, in order; if one is rejected, none of them stays
        queued."""
        added: list[Sequence] = []
        try:
            for seq in [seqs] if isinstance(seqs, Sequence) else list(seqs):
                self.scheduler.add(seq)
                added.append(seq)
        except ValueError:
            for seq in added:  # they sit untouched at the tail of `waiting`
                self.scheduler.waiting.remove(seq)
            raise

    def step(self) -> StepRecord:
        sched = self.scheduler
        fresh = {id(seq) for seq in sched.waiting if not seq.block_table}
        seqs, is_prefill = sched.schedule()
        preempted = tuple(sched.preempted_last_step)
        scheduled = tuple(seq.num_scheduled_tokens for seq in seqs)
        hits = tuple(
            seq.num_cached_tokens if is_prefill and id(seq) in fresh else 0 for seq in seqs
        )
        chunked = tuple(
            seq.seq_id
            for seq in seqs
            if is_prefill and seq.num_cached_tokens + seq.num_scheduled_tokens < seq.num_tokens
        )
        token_ids = self.runner.run(seqs, is_prefill)
        done = sched.postprocess(seqs, token_ids, is_prefill)
        finished = [seq for seq, d in zip(seqs, done) if d]
        self.finished.extend(finished)
        if self.check:
            check_invariants(sched.block_manager, list(sched.waiting) + list(sched.running))
            for seq in finished:
                if seq.block_table:
                    raise InvariantError(
                        f"finished sequence {seq.seq_id} still holds blocks {seq.block_table}"
                    )
        record = StepRecord(
            step=len(self.steps),
            is_prefill=is_prefill,
            seq_ids=tuple(seq.seq_id for seq in seqs),
            num_scheduled_tokens=scheduled,
            prefix_hit_tokens=hits,
            chunked_seq_ids=chunked,
            preempted_seq_ids=preempted,
            finished_seq_ids=tuple(seq.seq_id for seq in finished),
            num_blocks_in_use=len(sched.block_manager.used_block_ids),
            num_waiting=len(sched.waiting),
            num_running=len(sched.running),
        )
        self.steps.append(record)
        return record

    def run(self, max_steps: int = 10_000) -> list[StepRecord]:
        """Step until both queues are empty; returns the records of this call's steps.

        Raises `MaxStepsExceeded` after `max_steps` steps instead of looping forever.
        """
        check_positive_int("max_steps", max_steps)
        first = len(self.steps)
        while not self.scheduler.is_finished():
            if len(self.steps) - first >= max_steps:
                raise MaxStepsExceeded(
                    f"still {len(self.scheduler.waiting)} waiting and "
                    f"{len(self.scheduler.running)} running "
                    f"after {max_steps} steps (max_steps={max_steps})"
                )
            self.step()
        if self.check and self.scheduler.block_manager.used_block_ids:
            raise InvariantError(
                "all sequences finished but blocks "
                f"{sorted(self.scheduler.block_manager.used_block_ids)} are still in use"
            )
        return self.steps[first:]


def run_to_completion(
    scheduler: Scheduler,
    seqs: Iterable[Sequence],
    runner: FakeModelRunner | None = None,
    *,
    max_steps: int = 10_000,
    check: bool = True,
) -> list[StepRecord]:
    """Add `seqs`, run the scheduler with a fake model until everything finished, return the
    steps.

    The generated tokens are in each sequence's `completion_token_ids`.
    """
    driver = SchedulerDriver(scheduler, runner, check=check)
    driver.add(seqs)
    return driver.run(max_steps)
