"""A request as vLLM v1's scheduler sees it (`vllm/v1/request.py`, the fields the default path
reads).

It extends the allocator's `refimpl.hybrid.request.Request` (tokens, computed tokens, prefix
hashes, the shared-prefix junction) with what the scheduler decides on: when the request stops,
its priority and arrival for the priority queue, the draft tokens it carries, and the async
scheduler's counts of tokens that are scheduled but whose output has not come back yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from refimpl.hybrid.request import Request as AllocatorRequest
from refimpl.hybrid.request import RequestStatus
from refimpl.validation import check_int_at_least, check_positive_int

__all__ = ["Request", "RequestStatus"]


@dataclass(eq=False)
class Request(AllocatorRequest):
    """One request, scheduled until it samples `eos_token_id` or `max_tokens` tokens.

    Requests compare by identity (as vLLM's do) and order by (priority, arrival_time,
    request_id) in the priority queue: a smaller priority value runs first.
    """

    max_tokens: int = 16
    eos_token_id: int | None = None
    priority: int = 0
    arrival_time: float = 0.0
    # draft tokens proposed for the next step (speculative decoding); -1 placeholders
    spec_token_ids: list[int] = field(default_factory=list)
    # async scheduling: output tokens scheduled but not yet returned by the model runner
    num_output_placeholders: int = 0
    # in-flight tokens scheduled before a preemption: their output is delivered but must not
    # move the reset counters
    num_stale_output_tokens: int = 0
    drop_stale_output: bool = False
    is_prefill_chunk: bool = False
    num_preemptions: int = 0
    finish_reason: str | None = None  # "stop" (EOS), "length" or "abort"

    __hash__ = object.__hash__

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int("max_tokens", self.max_tokens)
        check_int_at_least("priority", self.priority, -(2**63))

    def __eq__(self, other: object) -> bool:
        return self is other

    def __lt__(self, other: Request) -> bool:
        if self.priority != other.priority:
            return self.priority < other.priority
        if self.arrival_time != other.arrival_time:
            return self.arrival_time < other.arrival_time
        if self.request_id != other.request_id:
            return self.request_id < other.request_id
        return id(self) < id(other)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)

    @property
    def num_schedulable_tokens(self) -> int:
        return self.num_tokens_with_spec + self.num_output_placeholders

    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED
