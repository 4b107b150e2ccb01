"""What one scheduling step hands the model runner, and what comes back (vLLM's
`sched/output.py`, plus the small part of `vllm/v1/outputs.py` the scheduler reads).

A request appears in a step's output once as new (`NewRequestData`, with everything the runner
must cache: prompt and whole block table) and from then on as cached (`CachedRequestData`,
only what changed: newly allocated block ids and the computed-token count).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NewRequestData:
    """A request the model runner has not seen (or, on the V2 runner, one resumed after
    preemption)."""

    req_id: str
    prompt_token_ids: list[int]
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    max_tokens: int
    # the V2 runner is sent every token of a resumed request; the V1 runner gets None here
    all_token_ids: list[int] | None = None


@dataclass
class CachedRequestData:
    """Requests the runner already holds, in parallel lists (running ones first, then the
    resumed ones)."""

    req_ids: list[str] = field(default_factory=list)
    # requests that come back after a preemption: the runner replaces their block table
    resumed_req_ids: set[str] = field(default_factory=set)
    # V1 runner: every token of a request that did not run in the previous step (the runner
    # may have dropped its cached copy); absent for the others
    all_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # blocks allocated this step per group, or None when none was
    new_block_ids: list[tuple[list[int], ...] | None] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    num_output_tokens: list[int] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclass
class SchedulerOutput:
    """One step: who runs, how many tokens each, and what the runner must forget."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    # request id -> tokens computed this step (prompt chunk, decode token and draft tokens)
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # request id -> draft token ids verified this step (placeholders -1 under async)
    scheduled_spec_decode_tokens: dict[str, list[int]]
    # requests preempted since the previous step (their blocks are already freed)
    preempted_req_ids: set[str]
    # requests that finished between the previous step and this one: the runner drops them
    finished_req_ids: set[str]
    num_spec_tokens_to_schedule: int = 0


@dataclass
class ModelRunnerOutput:
    """The runner's answer for one step: the tokens each scheduled request sampled (an empty
    list for a prefill chunk that does not reach the end of the prompt)."""

    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]


@dataclass
class EngineCoreOutput:
    """New tokens of one request after a step, and why it finished if it did."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
