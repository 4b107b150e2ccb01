"""V4LLM: a tiny DeepSeek V4 served from the hybrid paged cache (Part III's engine loop).

    with V4LLM(model_dir, num_kvcache_blocks=64, max_num_batched_tokens=64) as llm:
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8))
    outputs[0]["text"], outputs[0]["token_ids"], llm.stats

Split the way vLLM's engine core is: `refimpl.sched.Scheduler` (vLLM v1's scheduler, the one
`tools.crosscheck` proves step for step equal to vLLM 0.32's) picks each step's requests and
token counts and holds the blocks (Part II's `KVCacheManager`) in a `SchedulerOutput`; the
`ModelRunner` executes that output (tensors, addresses, the model, the shared `Sampler`) and
answers with a `ModelRunnerOutput`; `update_from_output` records it, and `record_step` keeps
the statistics. The model directory is loaded like Part I's: a local
directory, safetensors only (`refimpl.v4.loader`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence as SequenceLike
from dataclasses import dataclass, field
from time import perf_counter

import torch
from tqdm import tqdm

from refimpl.engine.lifecycle import ClosableEngine
from refimpl.engine.llm import EngineStats, load_tokenizer
from refimpl.engine.prompts import checked_request_tokens, pair_prompts_with_params
from refimpl.engine.sampler import Sampler
from refimpl.paged.sequence import SamplingParams
from refimpl.sched import Request, Scheduler, SchedulerConfig
from refimpl.v4.loader import check_v4_checkpoint, load_hf_model
from refimpl.v4.model_runner import ModelRunner, ScheduledChunk
from refimpl.validation import check_bool, check_positive_int


@dataclass
class V4Request:
    """A scheduler `Request` plus what the engine needs besides: its sampling parameters and,
    when recorded, the logits behind each sampled token."""

    request: Request
    sampling_params: SamplingParams
    logits: list[torch.Tensor] = field(default_factory=list)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_completion_tokens(self) -> int:
        return len(self.request.output_token_ids)


def record_step(
    stats: EngineStats,
    chunks: list[ScheduledChunk],
    elapsed: float,
    blocks_in_use: int,
    preemptions: int,
) -> None:
    """Add one step to `stats`: prompt tokens computed or taken from the prefix cache, decode
    tokens, time, preemptions, and the peak of blocks in use."""
    prompt = sum(c.num_prompt_tokens for c in chunks)
    decode = sum(c.num_tokens for c in chunks) - prompt
    stats.steps += 1
    stats.cached_tokens += sum(c.num_cached_tokens for c in chunks)
    stats.preemptions += preemptions
    stats.peak_blocks_in_use = max(stats.peak_blocks_in_use, blocks_in_use)
    if prompt:
        stats.prefill_steps += 1
        stats.prefill_tokens += prompt
        stats.prefill_time_s += elapsed
    if decode:
        stats.decode_tokens += decode
        if not prompt:  # a mixed step counts (and is timed) as a prefill step
            stats.decode_steps += 1
            stats.decode_time_s += elapsed


class V4LLM(ClosableEngine):
    """The tiny V4 engine. Keyword arguments mirror Part I's `LLM` where they mean the same.

    `index_kernel_backend` picks the three DeepSeek V4 index kernels that turn positions into
    slots: "torch" (the twins; default on a CPU), "triton" (Triton's interpreter on a CPU) or
    None / "auto" (the best on the model's device). The attention itself always runs in torch;
    Part I's `attention_backend` has no counterpart here. `hf_model` reuses an already loaded
    transformers model of the same directory (tests and notebooks build several engines); the
    cache is allocated on that model's device. `prefix_cache_retention_interval` is vLLM's
    engine argument with vLLM's default 0 (window blocks are kept only where a later request
    can resume; None keeps them at every 256-token boundary), handed to the `KVCacheManager`.
    """

    def __init__(
        self,
        model: str | os.PathLike,
        *,
        num_kvcache_blocks: int = 128,
        kvcache_block_size: int = 256,
        max_num_seqs: int = 16,
        max_num_batched_tokens: int = 512,
        enable_prefix_caching: bool = True,
        max_model_len: int | None = None,
        index_kernel_backend: str | None = None,
        hf_model=None,
        prefix_cache_retention_interval: int | None = 0,
    ) -> None:
        check_positive_int("max_num_seqs", max_num_seqs)
        check_positive_int("max_num_batched_tokens", max_num_batched_tokens)
        if max_model_len is not None:
            check_positive_int("max_model_len", max_model_len)
        if not isinstance(enable_prefix_caching, bool):
            raise ValueError(
                f"enable_prefix_caching must be True or False, got {enable_prefix_caching!r}"
            )
        self.model_dir = check_v4_checkpoint(model)
        self.hf_model = hf_model if hf_model is not None else load_hf_model(self.model_dir)
        config = self.hf_model.config
        self.max_model_len = max_model_len or config.max_position_embeddings
        if self.max_model_len > config.max_position_embeddings:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the model's "
                f"{config.max_position_embeddings}"
            )
        self.model_runner = ModelRunner(
            self.hf_model, num_kvcache_blocks, kvcache_block_size, index_kernel_backend
        )
        scheduler_config = SchedulerConfig(
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=self.max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            prefix_cache_retention_interval=prefix_cache_retention_interval,
        )
        self.scheduler = Scheduler(scheduler_config, self.model_runner.kv_cache.config)
        self.eos = config.eos_token_id if isinstance(config.eos_token_id, int) else None
        # requests queued and not finished yet, by id
        self.requests: dict[str, V4Request] = {}
        self.tokenizer = load_tokenizer(self.model_dir)
        self.stats = EngineStats()
        # keep the logits behind every sampled token (in V4Request.logits)
        self.record_logits = False
        self.closed = False
        self._next_id = 0

    @property
    def index_kernel_backend(self) -> str:
        """The backend of the index kernels in use ("torch" or "triton")."""
        return self.model_runner.index_kernel_backend

    # --- requests
    def make_request(
        self, prompt: str | list[int], sampling_params: SamplingParams
    ) -> V4Request:
        """Tokenize and check one request without queueing it (ValueError on bad input)."""
        self._check_open()
        ids = checked_request_tokens(
            prompt,
            sampling_params,
            self.tokenizer,
            self.model_dir,
            self.hf_model.config.vocab_size,
            self.max_model_len,
        )
        request_id = f"req-{self._next_id}"
        request = self.scheduler.make_request(
            request_id,
            ids,
            max_tokens=sampling_params.max_tokens,
            eos_token_id=None if sampling_params.ignore_eos else self.eos,
        )
        self.check_fits(request)
        self._next_id += 1
        return V4Request(request, sampling_params)

    def check_fits(self, request: Request) -> None:
        """Refuse a request that could never run: at its longest (prompt + max_tokens) it
        would hold more blocks at once than the pool has (windows freeing as it goes).
        vLLM's scheduler would wait for it forever."""
        manager = self.scheduler.kv_cache_manager
        longest = request.num_prompt_tokens + request.max_tokens
        need = manager.get_max_num_blocks(longest)
        capacity = manager.num_gpu_blocks - 1  # block 0 is the null block
        if need > capacity:
            raise ValueError(
                f"request {request.request_id} can grow to {need} blocks (up to {longest} "
                f"tokens: {request.num_prompt_tokens} prompt tokens + "
                f"max_tokens={request.max_tokens}) but the pool has only {capacity}; it "
                "could never run"
            )

    def add_request(
        self, prompt: str | list[int], sampling_params: SamplingParams
    ) -> V4Request:
        """Check and queue one request (for stepping the engine by hand with `step()`)."""
        req = self.make_request(prompt, sampling_params)
        self._queue(req)
        return req

    def _queue(self, req: V4Request) -> None:
        self.scheduler.add_request(req.request)
        self.requests[req.request_id] = req

    def close(self) -> None:
        """Abort every unfinished request (vLLM's `finish_requests`, so their blocks go back to
        the pool), then release the KV cache; the engine refuses work afterwards."""
        self.scheduler.finish_requests(list(self.scheduler.requests))
        self.requests.clear()
        self.model_runner.close()
        self.closed = True

    def is_finished(self) -> bool:
        """No request left, and the model runner told about every finished one."""
        return not self.scheduler.has_requests()

    # --- the loop
    def step(self) -> list[V4Request]:
        """Schedule, run the model on one packed batch, sample, `update_from_output`;
        returns the requests that finished."""
        self._check_open()
        start = perf_counter()
        preemptions_before = self.scheduler.num_preemptions
        scheduler_output = self.scheduler.schedule()
        if (
            not scheduler_output.total_num_scheduled_tokens
            and self.scheduler.get_num_unfinished_requests()
        ):
            raise RuntimeError(
                "no request could be scheduled (the pool is too small for the waiting request)"
            )
        usable = self.model_runner.kv_cache.config.num_blocks - 1
        blocks_in_use = round(self.scheduler.kv_cache_manager.usage * usable)
        temperatures = {
            new.req_id: self.requests[new.req_id].sampling_params.temperature
            for new in scheduler_output.scheduled_new_reqs
        }
        runner_output, chunks, logits = self.model_runner.execute_model(
            scheduler_output, temperatures
        )
        if self.record_logits:
            for c, row in zip([c for c in chunks if c.samples], logits):
                self.requests[c.state.req_id].logits.append(row)
        outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        finished = [self.requests.pop(o.request_id) for o in outputs if o.finish_reason]
        if chunks:  # a step that only flushes finished ids to the runner is not counted
            record_step(
                self.stats,
                chunks,
                perf_counter() - start,
                blocks_in_use,
                self.scheduler.num_preemptions - preemptions_before,
            )
        return finished

    def generate(
        self,
        prompts: SequenceLike[str | list[int]],
        sampling_params: SamplingParams | SequenceLike[SamplingParams] | None = None,
        use_tqdm: bool = False,
        seed: int = 0,
    ) -> list[dict]:
        """Run prompts to completion; `[{"text", "token_ids"}]` in prompt order (completions
        only), plus "logits" (one row per generated token) when `record_logits` is set.

        Every prompt is checked before any is queued, so a bad one leaves the engine untouched.
        `use_tqdm=True` shows a progress bar of finished requests, as Part I's `LLM` does (off
        by default here: the chapters print no bars). `seed` seeds the sampler for temperatures
        above 0.
        """
        self._check_open()
        check_bool("use_tqdm", use_tqdm)
        prompts, sampling_params = pair_prompts_with_params(prompts, sampling_params)
        next_id = self._next_id
        try:
            reqs = [self.make_request(p, sp) for p, sp in zip(prompts, sampling_params)]
        except ValueError:
            self._next_id = next_id
            raise
        self.model_runner.sampler = Sampler(seed, self.model_runner.device)
        self.stats = EngineStats()
        for req in reqs:
            self._queue(req)
        with tqdm(
            total=len(reqs), desc="Generating", dynamic_ncols=True, disable=not use_tqdm
        ) as pbar:
            while not self.is_finished():
                pbar.update(len(self.step()))
        outputs = []
        for req in reqs:
            ids = list(req.request.output_token_ids)
            out = {
                "text": self.tokenizer.decode(ids) if self.tokenizer is not None else None,
                "token_ids": ids,
            }
            if self.record_logits:
                out["logits"] = req.logits
            outputs.append(out)
        return outputs
