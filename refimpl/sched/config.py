"""The scheduler's settings (the fields of vLLM's `SchedulerConfig`, `CacheConfig` and
`SpeculativeConfig` that the default scheduling path reads), checked once."""

from __future__ import annotations

from dataclasses import dataclass

from refimpl.validation import check_bool, check_int_at_least, check_positive_int


@dataclass(frozen=True)
class SchedulerConfig:
    """`vllm serve`'s scheduling flags, with vLLM's defaults where it has one.

    - `max_num_batched_tokens`: tokens per step over all requests (the token budget).
    - `max_num_seqs`: requests running at once.
    - `enable_chunked_prefill`: a prompt longer than the budget left runs in pieces; without
      it a waiting prompt that does not fit the budget stops admission for the step.
    - `long_prefill_token_threshold`: 0, or the most tokens one prefill gets per step (only
      while more than one request is eligible, as vLLM does).
    - `policy`: "fcfs" or "priority" (smaller priority value first; preemption takes the
      largest (priority, arrival_time)).
    - `async_scheduling`: the next step is scheduled before this step's output is back; the
      scheduler counts the in-flight tokens (`AsyncScheduler`).
    - `num_speculative_tokens` / `num_lookahead_tokens`: draft tokens per step, and KV slots
      reserved past the scheduled tokens for the drafter (vLLM: equal for EAGLE/MTP).
    - `enable_prefix_caching`, `prefix_cache_retention_interval` (None, 0 or k tokens),
      `watermark`: handed to `KVCacheManager`.
    - `scheduler_reserve_full_isl`: admit a waiting request only if its whole prompt fits.
    """

    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"
    async_scheduling: bool = False
    num_speculative_tokens: int = 0
    num_lookahead_tokens: int = 0
    enable_prefix_caching: bool = True
    prefix_cache_retention_interval: int | None = 0
    watermark: float = 0.0
    scheduler_reserve_full_isl: bool = True

    def __post_init__(self) -> None:
        check_positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        check_positive_int("max_num_seqs", self.max_num_seqs)
        check_positive_int("max_model_len", self.max_model_len)
        check_int_at_least(
            "long_prefill_token_threshold", self.long_prefill_token_threshold, 0
        )
        check_int_at_least("num_speculative_tokens", self.num_speculative_tokens, 0)
        check_int_at_least("num_lookahead_tokens", self.num_lookahead_tokens, 0)
        for name in (
            "enable_chunked_prefill",
            "async_scheduling",
            "enable_prefix_caching",
            "scheduler_reserve_full_isl",
        ):
            check_bool(name, getattr(self, name))
        if self.policy not in ("fcfs", "priority"):
            raise ValueError(f"policy must be 'fcfs' or 'priority', got {self.policy!r}")
        if (
            not self.enable_chunked_prefill
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                f"max_model_len ({self.max_model_len}): without chunked prefill a prompt must "
                "fit one step"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        if self.long_prefill_token_threshold > self.max_model_len:
            raise ValueError(
                f"long_prefill_token_threshold ({self.long_prefill_token_threshold}) cannot "
                f"exceed max_model_len ({self.max_model_len})"
            )

    @property
    def max_concurrent_batches(self) -> int:
        """Steps in flight at once: 2 under async scheduling (V1 runner, no pipeline
        parallelism), else 1."""
        return 2 if self.async_scheduling else 1

    @property
    def max_in_flight_tokens(self) -> int:
        """Tokens scheduled but not yet settled: a sliding window's admission check reserves
        for them."""
        return self.max_concurrent_batches * self.max_num_batched_tokens
