"""Scheduler: which sequences run this step, as prefill or decode, and what happens after.

Waiting sequences are prefilled first; only the first of them may be cut into a chunk when the
token budget runs out. With nothing to prefill, every running sequence decodes one token; if a
decode needs a block and none is free, the last running sequence is preempted (its blocks are
freed and it is recomputed later from the front of the waiting queue).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from refimpl.errors import InvariantError
from refimpl.paged.block_manager import BlockManager
from refimpl.paged.sequence import (
    Sequence,
    SequenceStatus,
    check_block_size,
    checked_token_ids,
)
from refimpl.validation import (
    StepContract,
    check_bool,
    check_instance,
    check_int_at_least,
    check_positive_int,
)


@dataclass(frozen=True)
class SchedulerConfig:
    """The knobs nano-vllm's Config passes to its Scheduler."""

    num_kvcache_blocks: int
    kvcache_block_size: int = 256
    max_num_seqs: int = 512
    max_num_batched_tokens: int = 16384
    eos: int = -1
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        check_positive_int("num_kvcache_blocks", self.num_kvcache_blocks)
        check_block_size(self.kvcache_block_size)
        check_positive_int("max_num_seqs", self.max_num_seqs)
        check_positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        check_int_at_least(
            "eos", self.eos, -1, " (a token id, or -1 for no end-of-sequence token)"
        )
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(
                "enable_prefix_caching must be True or False, got "
                f"{self.enable_prefix_caching!r}"
            )


class Scheduler:
    """nano-vllm's scheduler over a BlockManager, with counters a learner can inspect.

    It moves blocks only through the BlockManager's six public methods, at the lines where
    nano-vllm's scheduler calls them, so any BlockManager with those methods can be plugged in
    (`scheduler.block_manager = MyBlockManager(...)` before the first `add`).
    """

    def __init__(self, config: SchedulerConfig) -> None:
        check_instance("config", config, SchedulerConfig)
        self.config = config
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.eos = config.eos
        self.block_size = config.kvcache_block_size
        self.block_manager = BlockManager(
            config.num_kvcache_blocks,
            config.kvcache_block_size,
            enable_prefix_caching=config.enable_prefix_caching,
        )
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        # what add() accepted (by seq_id) and the batch awaiting postprocess (nano-vllm trusts
        # its engine to postprocess each batch once; this scheduler checks)
        self._contract = StepContract("sequence")
        self.num_preemptions = 0
        self.preempted_last_step: list[int] = []  # seq_ids preempted by the latest schedule()
        self._scheduled_is_prefill = False  # the kind of the batch awaiting postprocess

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def max_blocks_needed(self, seq: Sequence) -> int:
        """Blocks the sequence holds at its longest: every prompt token and every sampled token
        except the last (whose K/V is never computed)."""
        remaining = seq.max_tokens - seq.num_completion_tokens
        longest = seq.num_tokens + max(remaining - 1, 0)
        return (longest + self.block_size - 1) // self.block_size

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence; reject one that could never fit in the whole pool."""
        check_instance("seq", seq, Sequence)
        if seq.block_size != self.block_size:
            raise ValueError(
                f"sequence block_size {seq.block_size} != scheduler kvcache_block_size "
                f"{self.block_size}"
            )
        if seq.status != SequenceStatus.WAITING or seq.block_table:
            raise ValueError(
                f"sequence {seq.seq_id} is {seq.status.name} and cannot be added again"
            )
        # keyed by seq_id, so a copy of a queued sequence is refused too
        self._contract.check_add(
            seq.seq_id,
            (self.waiting, self.running),
            self.max_blocks_needed(seq),
            self.config.num_kvcache_blocks,
            f"{seq.num_prompt_tokens} prompt tokens + max_tokens={seq.max_tokens}, "
            f"block_size={self.block_size}",
        )
        self._contract.added(seq.seq_id, seq)
        self.waiting.append(seq)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """Pick this step's batch: (sequences, is_prefill).

        Sets each scheduled sequence's `num_scheduled_tokens` (the prompt tokens not served by
        the prefix cache, or a chunk of them; 1 for a decode) for the model runner and
        `postprocess`.
        """
        if self.is_finished():
            raise ValueError(
                "nothing to schedule: the waiting and running queues are empty (check "
                "is_finished())"
            )
        scheduled_seqs: list[Sequence] = []
        num_batched_tokens = 0
        self.preempted_last_step = []
        self._contract.take()

        # Prefill: the waiting queue in order, stopping at the first sequence that does not
        # fit.
        while self.waiting and len(scheduled_seqs) < self.max_num_seqs:
            seq = self.waiting[0]
            remaining = self.max_num_batched_tokens - num_batched_tokens
            if remaining == 0:
                break
            # new, or preempted: the cached leading blocks, and room for the rest?
            if not seq.block_table:
                num_cached_blocks = self.block_manager.can_allocate(seq)
                if num_cached_blocks == -1:
                    break
                num_tokens = seq.num_tokens - num_cached_blocks * self.block_size
            else:  # the rest of a prompt that an earlier step cut into a chunk
                num_tokens = seq.num_tokens - seq.num_cached_tokens
            # only the first sequence of a step may be chunked
            if remaining < num_tokens and scheduled_seqs:
                break
            if not seq.block_table:
                self.block_manager.allocate(seq, num_cached_blocks)
            seq.num_scheduled_tokens = min(num_tokens, remaining)
            num_batched_tokens += seq.num_scheduled_tokens
            if seq.num_cached_tokens + seq.num_scheduled_tokens == seq.num_tokens:
                seq.status = SequenceStatus.RUNNING
                self.waiting.popleft()
                self.running.append(seq)
            # else: a partial prefill stays first in `waiting`, holding all its blocks.
            scheduled_seqs.append(seq)
        if scheduled_seqs:
            self._contract.hand_out(scheduled_seqs)
            self._scheduled_is_prefill = True
            return scheduled_seqs, True

        # Decode: one token per running sequence, preempting from the back when blocks run out.
        while self.running and len(scheduled_seqs) < self.max_num_seqs:
            seq = self.running.popleft()
            while not self.block_manager.can_append(seq):
                if self.running:
                    self.preempt(self.running.pop())
                else:
                    # nothing left to take blocks from: wait for recomputation
                    self.preempt(seq)
                    break
            else:
                seq.num_scheduled_tokens = 1
                seq.is_prefill = False
                self.block_manager.may_append(seq)
                scheduled_seqs.append(seq)
        if not scheduled_seqs:
            raise InvariantError(
                "schedule() found nothing to run although sequences are queued"
            )
        self.running.extendleft(reversed(scheduled_seqs))
        self._contract.hand_out(scheduled_seqs)
        self._scheduled_is_prefill = False
        return scheduled_seqs, False

    def preempt(self, seq: Sequence) -> None:
        """Free the sequence's blocks and put it first in line to be prefilled again.

        `schedule` calls it on a running sequence it has already taken out of `running`.
        """
        if not seq.block_table:
            raise ValueError(
                f"sequence {seq.seq_id} holds no blocks, so there is nothing to preempt"
            )
        if seq in self.running:
            raise ValueError(
                f"sequence {seq.seq_id} is still in `running`: schedule() takes a sequence "
                "out before preempting it"
            )
        self.block_manager.deallocate(seq)  # first: it refuses a sequence it did not allocate
        seq.status = SequenceStatus.WAITING
        seq.is_prefill = True
        seq.num_scheduled_tokens = 0
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        self.preempted_last_step.append(seq.seq_id)

    def postprocess(
        self, seqs: list[Sequence], token_ids: list[int], is_prefill: bool
    ) -> list[bool]:
        """Record a step's results; returns, per sequence, whether it finished.

        Blocks filled this step are registered in the prefix cache (`hash_blocks`), then the
        computed tokens count as cached. A sampled token is kept only when the whole prompt has
        been computed (a chunk in the middle of a prompt produces no usable token).
        """
        self._check_step_results(seqs, token_ids, is_prefill)
        self._contract.take()
        finished = []
        for seq, token_id in zip(seqs, token_ids):
            self.block_manager.hash_blocks(seq)
            seq.num_cached_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            if is_prefill and seq.num_cached_tokens < seq.num_tokens:
                finished.append(False)
                continue
            seq.append_token(token_id)
            eos_hit = not seq.ignore_eos and token_id == self.eos
            if eos_hit or seq.num_completion_tokens == seq.max_tokens:
                seq.status = SequenceStatus.FINISHED
                self.block_manager.deallocate(seq)
                self.running.remove(seq)
                self._contract.finished(seq.seq_id)
                finished.append(True)
            else:
                finished.append(False)
        return finished

    def _check_step_results(
        self, seqs: list[Sequence], token_ids: list[int], is_prefill: bool
    ) -> None:
        """Refuse anything but the batch of the latest schedule(), once, with one valid token
        each.

        nano-vllm trusts its engine here. A second postprocess of one step would append a token
        whose K/V is never computed; a sequence that was never scheduled has nothing to record.
        Every check runs before postprocess changes anything. The batch schedule() returned is
        recognised at once; anything else (a subclass's own schedule(), a copy) is checked
        sequence by sequence.
        """
        if not (is_prefill is self._scheduled_is_prefill and self._contract.is_latest(seqs)):
            check_bool("is_prefill", is_prefill)
            for i, seq in enumerate(seqs):
                check_instance(f"seqs[{i}]", seq, Sequence)
                if (
                    seq.num_scheduled_tokens < 1
                    or seq.is_prefill != is_prefill
                    or self._contract.queued.get(seq.seq_id) is not seq
                ):
                    raise ValueError(
                        f"seqs[{i}]: sequence {seq.seq_id} ({seq.status.name}, "
                        "num_scheduled_tokens="
                        f"{seq.num_scheduled_tokens}, is_prefill={seq.is_prefill}) is not "
                        "part of the "
                        f"{'prefill' if is_prefill else 'decode'} batch waiting for "
                        "postprocess(): pass the batch "
                        "of the latest schedule(), once"
                    )
            if len(set(map(id, seqs))) != len(seqs):
                raise ValueError("seqs lists a sequence twice")
        if len(seqs) != len(token_ids):
            raise ValueError(f"got {len(token_ids)} sampled tokens for {len(seqs)} sequences")
        # the ids only; their packed bytes are not needed
        checked_token_ids(token_ids, "token_ids")
