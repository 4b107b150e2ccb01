"""One request's state: its tokens, how far its KV has been computed, and its block table."""

from __future__ import annotations

import copy
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum, auto
from itertools import count
from numbers import Real

import numpy as np

from refimpl.validation import (
    check_bool,
    check_instance,
    check_int_at_least,
    check_positive_int,
    is_integer,
)

# Token ids are hashed as int64 (nano-vllm hashes `np.array(token_ids).tobytes()`), so that is
# their range.
MAX_TOKEN_ID = 2**63 - 1


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token; temperature 0 means greedy (argmax)."""

    temperature: float = 1.0
    max_tokens: int = 64
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if type(self.temperature) not in (float, int) and (
            isinstance(self.temperature, bool) or not isinstance(self.temperature, Real)
        ):
            raise TypeError(
                f"temperature must be a number >= 0 (0 means greedy), got {self.temperature!r}"
            )
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError(
                f"temperature must be >= 0 (0 means greedy), got {self.temperature!r}"
            )
        check_int_at_least("max_tokens", self.max_tokens, 1)
        check_bool("ignore_eos", self.ignore_eos)


class SequenceStatus(Enum):
    """Where a sequence is in its life: queued, scheduled, or done."""

    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


def check_block_size(block_size: int) -> int:
    """Return `block_size` if it is a positive integer, else raise a clear ValueError."""
    return check_positive_int("block_size", block_size)


def check_token_id(token_id: object, name: str = "token_id") -> None:
    """Raise a TypeError (not an integer) or ValueError (outside 0 .. 2**63 - 1) naming
    `name`."""
    if type(token_id) is not int and not is_integer(token_id):
        raise TypeError(
            f"{name} must be an integer token id, got {token_id!r} ({type(token_id).__name__})"
        )
    if not 0 <= token_id <= MAX_TOKEN_ID:
        raise ValueError(
            f"{name} must be from 0 to 2**63 - 1 (ids are hashed as int64), got {token_id}"
        )


def checked_token_ids(
    token_ids: Iterable[int], name: str = "token_ids"
) -> tuple[list[int], bytes]:
    """The ids as a new list and packed as little-endian int64 (what the prefix cache hashes),
    after checking every one as `check_token_id` does (`name` names the argument).

    `struct.pack` converts the whole list in C and refuses floats, strings and ids past int64;
    a negative id sets the top bit of its last byte, so those bytes are all ASCII exactly when
    no id is negative. It takes True as 1 and False as 0, so the ids packed as 0 or 1 (numpy
    finds them in C) have their type looked at. Only a refused list is walked in Python, to
    name the first bad id.
    """
    try:
        token_ids = list(token_ids)
    except TypeError:
        raise TypeError(
            f"{name} must be an iterable of integer token ids, got {type(token_ids).__name__}"
        ) from None
    try:
        packed = struct.pack(f"<{len(token_ids)}q", *token_ids)
    except struct.error:
        packed = None  # refused: find the first bad id below
    if packed is None or not packed[7::8].isascii() or _has_bool(token_ids, packed):
        for i, token_id in enumerate(token_ids):
            check_token_id(token_id, f"{name}[{i}]")
    return token_ids, packed


def _has_bool(token_ids: list[int], packed: bytes) -> bool:
    """Whether an id is True or False (`packed`: the ids as little-endian int64)."""
    zero_or_one = np.flatnonzero(np.frombuffer(packed, dtype="<i8") <= 1)
    return any(type(token_ids[i]) is bool for i in zero_or_one)


class Sequence:
    """A request: prompt plus generated tokens, and the page table of its KV cache.

    `block_table[i]` is the physical block holding logical block i (tokens
    `i*block_size ... (i+1)*block_size - 1`), exactly like an OS page table maps pages to
    frames.
    """

    counter = count()

    def __init__(
        self,
        token_ids: Iterable[int],
        sampling_params: SamplingParams = SamplingParams(),
        *,
        block_size: int = 256,
    ) -> None:
        # our own copy: the caller's list is never changed
        token_ids, prompt_bytes = checked_token_ids(token_ids)
        if not token_ids:
            raise ValueError("a sequence needs at least one prompt token, got an empty prompt")
        check_instance("sampling_params", sampling_params, SamplingParams)
        self.block_size = check_block_size(block_size)
        self.seq_id = next(Sequence.counter)
        self.status = SequenceStatus.WAITING
        self.token_ids = token_ids
        self.last_token = token_ids[-1]
        self.num_tokens = len(token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.num_cached_tokens = 0  # tokens whose K/V are already in the cache
        self.num_scheduled_tokens = 0  # tokens this step computes
        # becomes False on the first decode step, True again on preemption
        self.is_prefill = True
        self.block_table: list[int] = []
        # block_hashes[i]: the chained prefix-cache hash of full block i, filled in by the
        # BlockManager the first time it needs it and kept, as vLLM keeps block hashes on its
        # Request (nano-vllm recomputes them on every walk). Full blocks never change, so the
        # hashes stay valid.
        self.block_hashes: list[int] = []
        # The prompt as little-endian int64, packed once while its ids were checked: the bytes
        # the prefix cache hashes for each full block of the prompt.
        self.prompt_bytes = prompt_bytes
        self.temperature = sampling_params.temperature
        self.max_tokens = sampling_params.max_tokens
        self.ignore_eos = sampling_params.ignore_eos

    def __len__(self) -> int:
        return self.num_tokens

    def __getitem__(self, key):
        return self.token_ids[key]

    def __repr__(self) -> str:
        return (
            f"Sequence(seq_id={self.seq_id}, status={self.status.name}, "
            f"num_tokens={self.num_tokens}, "
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
            raise ValueError(
                f"logical block {i} out of range: the sequence has {self.num_blocks} blocks"
            )
        return self.token_ids[i * self.block_size : (i + 1) * self.block_size]

    def append_token(self, token_id: int) -> None:
        if type(token_id) is not int or not 0 <= token_id <= MAX_TOKEN_ID:
            check_token_id(token_id)  # raises, unless a numpy integer in range
        self.token_ids.append(token_id)
        self.last_token = token_id
        self.num_tokens += 1

    def __copy__(self) -> Sequence:
        """Every field (the compact state below is for workers, not for copies)."""
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        return twin

    def __deepcopy__(self, memo: dict) -> Sequence:
        """Every field, the lists copied too: a twin with the same seq_id and block table,
        which a BlockManager refuses as not the sequence it allocated."""
        twin = object.__new__(type(self))
        memo[id(self)] = twin
        twin.__dict__.update(
            {name: copy.deepcopy(value, memo) for name, value in self.__dict__.items()}
        )
        return twin

    # Workers of a tensor-parallel engine receive the batch pickled every step. A prefill needs
    # every token; a decode needs only the last one, so the state is a few integers plus the
    # block table. block_size rides along because here it is per sequence, not a class variable
    # as in nano-vllm.
    _STATE_FIELDS = (
        "num_tokens",
        "num_prompt_tokens",
        "num_cached_tokens",
        "num_scheduled_tokens",
        "block_table",
    )

    def __getstate__(self):
        last_state = self.token_ids if self.is_prefill else self.last_token
        return (
            *(getattr(self, name) for name in self._STATE_FIELDS),
            last_state,
            self.block_size,
        )

    def __setstate__(self, state) -> None:
        *fields, last_state, self.block_size = state
        # the scheduler's business; workers never hash
        self.block_hashes, self.prompt_bytes = [], b""
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
