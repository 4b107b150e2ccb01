"""One request's state: its tokens, how far its KV has been computed, and its block table."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from itertools import count
from typing import Iterable

from refimpl.validation import check_int_at_least, check_positive_int


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token; temperature 0 means greedy (argmax)."""

    temperature: float = 1.0
    max_tokens: int = 64
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature!r}")
        check_int_at_least("max_tokens", self.max_tokens, 1)


class SequenceStatus(Enum):
    """Where a sequence is in its life: queued, scheduled, or done."""

    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


def check_block_size(block_size: int) -> int:
    """Return `block_size` if it is a positive integer, else raise a clear ValueError."""
    return check_positive_int("block_size", block_size)


class Sequence:
    """A request: prompt plus generated tokens, and the page table of its KV cache.

    `block_table[i]` is the physical block holding logical block i (tokens
    `i*block_size ... (i+1)*block_size - 1`), exactly like an OS page table maps pages to frames.
    """

    counter = count()

    def __init__(
        self,
        token_ids: Iterable[int],
        sampling_params: SamplingParams = SamplingParams(),
        *,
        block_size: int = 256,
    ) -> None:
        token_ids = list(token_ids)  # our own copy: the caller's list is never changed
        if not token_ids:
            raise ValueError("a sequence needs at least one prompt token, got an empty prompt")
        self.block_size = check_block_size(block_size)
        self.seq_id = next(Sequence.counter)
        self.status = SequenceStatus.WAITING
        self.token_ids = token_ids
        self.last_token = token_ids[-1]
        self.num_tokens = len(token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.num_cached_tokens = 0  # tokens whose K/V are already in the cache
        self.num_scheduled_tokens = 0  # tokens this step computes
        self.is_prefill = True  # becomes False on the first decode step, True again on preemption
        self.block_table: list[int] = []
        # block_hashes[i]: the chained prefix-cache hash of full block i, filled in by the BlockManager
        # the first time it needs it and kept, as vLLM keeps block hashes on its Request (nano-vllm
        # recomputes them on every walk). Full blocks never change, so the hashes stay valid.
        self.block_hashes: list[int] = []
        self.temperature = sampling_params.temperature
        self.max_tokens = sampling_params.max_tokens
        self.ignore_eos = sampling_params.ignore_eos

    def __len__(self) -> int:
        return self.num_tokens

    def __getitem__(self, key):
        return self.token_ids[key]

    def __repr__(self) -> str:
        return (
            f"Sequence(seq_id={self.seq_id}, status={self.status.name}, num_tokens={self.num_tokens}, "
            f"num_cached_tokens={self.num_cached_tokens}, block_table={self.block_table})"
        )

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def num_completion_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_cached_blocks(self) -> int:
        return self.num_cached_tokens // self.block_size

    @property
    def num_blocks(self) -> int:
        """Blocks needed to hold every token (ceiling division)."""
        return (self.num_tokens + self.block_size - 1) // self.block_size

    @property
    def last_block_num_tokens(self) -> int:
        """Tokens in the last block: between 1 and block_size."""
        return self.num_tokens - (self.num_blocks - 1) * self.block_size

    def block(self, i: int) -> list[int]:
        """The token ids of logical block i."""
        if not 0 <= i < self.num_blocks:
            raise ValueError(f"logical block {i} out of range: the sequence has {self.num_blocks} blocks")
        return self.token_ids[i * self.block_size : (i + 1) * self.block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.last_token = token_id
        self.num_tokens += 1

    # Workers of a tensor-parallel engine receive the batch pickled every step. A prefill needs every
    # token; a decode needs only the last one, so the state is a few integers plus the block table.
    # block_size rides along because here it is per sequence, not a class variable as in nano-vllm.
    _STATE_FIELDS = ("num_tokens", "num_prompt_tokens", "num_cached_tokens", "num_scheduled_tokens", "block_table")

    def __getstate__(self):
        last_state = self.token_ids if self.is_prefill else self.last_token
        return (*(getattr(self, name) for name in self._STATE_FIELDS), last_state, self.block_size)

    def __setstate__(self, state) -> None:
        *fields, last_state, self.block_size = state
        self.block_hashes = []  # the scheduler's business; workers never hash
        for name, value in zip(self._STATE_FIELDS, fields):
            setattr(self, name, value)
        if isinstance(last_state, list):
            self.token_ids = last_state
            self.last_token = last_state[-1]
            self.is_prefill = True
        else:
            self.token_ids = []
            self.last_token = last_state
            self.is_prefill = False
