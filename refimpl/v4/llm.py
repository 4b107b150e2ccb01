"""V4LLM: a tiny DeepSeek V4 served from the hybrid paged cache (Part III's engine loop).

    llm = V4LLM(model_dir, num_kvcache_blocks=64, max_num_batched_tokens=64)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8))
    outputs[0]["text"], outputs[0]["token_ids"], llm.stats

The loop is vLLM v1's: each step hands a token budget first to running requests (a decode token
or the next prefill chunk), then to waiting ones (after a prefix-cache lookup); every request
gets its blocks from `KVCacheManager.allocate_slots`; the model runs one packed batch; a
request whose tokens are all computed samples its next token. When the pool runs dry the last
running request is preempted (its blocks freed, recomputed later).
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from time import perf_counter
from typing import Sequence as SequenceLike

import torch

from refimpl.engine.llm import EngineStats, load_tokenizer
from refimpl.engine.prompts import checked_request_tokens, pair_prompts_with_params
from refimpl.hybrid.kv_cache_manager import KVCacheManager
from refimpl.hybrid.request import Request, RequestStatus
from refimpl.paged.sequence import SamplingParams
from refimpl.v4.attention import SeqChunk, StepContext
from refimpl.v4.cache import build_kv_cache
from refimpl.v4.model import forward_step, load_hf_model


@dataclass
class V4Request:
    """A request plus what the engine needs besides the allocator's view of it."""

    request: Request
    sampling_params: SamplingParams
    index: int  # position in the generate() call
    logits: list[torch.Tensor] = field(default_factory=list)  # the logits behind each sampled token

    @property
    def num_completion_tokens(self) -> int:
        return len(self.request.output_token_ids)


@dataclass
class ScheduledChunk:
    req: V4Request
    num_tokens: int
    first_position: int


class V4LLM:
    """The tiny V4 engine. Keyword arguments mirror Part I's `LLM` where they mean the same."""

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
        hf_model=None,
    ) -> None:
        for name, value in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.model_dir = str(model)
        self.hf_model = hf_model if hf_model is not None else load_hf_model(self.model_dir)
        config = self.hf_model.config
        self.max_model_len = max_model_len or config.max_position_embeddings
        if self.max_model_len > config.max_position_embeddings:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the model's {config.max_position_embeddings}")
        self.kv_cache = build_kv_cache(config, num_kvcache_blocks, kvcache_block_size)
        self.manager = KVCacheManager.from_config(
            self.kv_cache.config, self.max_model_len, enable_caching=enable_prefix_caching,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        self.tokenizer = load_tokenizer(self.model_dir)
        self.eos = config.eos_token_id if isinstance(config.eos_token_id, int) else -1
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_prefix_caching = enable_prefix_caching
        self.waiting: deque[V4Request] = deque()
        self.running: list[V4Request] = []
        self.stats = EngineStats()
        self.last_contexts: list[StepContext] = []  # kept only when record_steps is True
        self.record_steps = False
        self._next_id = 0

    # --- requests
    def make_request(self, prompt: str | list[int], sampling_params: SamplingParams, index: int = 0) -> V4Request:
        """Tokenize and check one request without queueing it (ValueError on bad input)."""
        ids = checked_request_tokens(prompt, sampling_params, self.tokenizer, self.model_dir,
                                     self.hf_model.config.vocab_size, self.max_model_len)
        longest = len(ids) + sampling_params.max_tokens
        request_id = f"req-{self._next_id}"
        need = self.manager.coordinator.get_num_blocks_to_allocate(request_id, longest, None, 0, apply_admission_cap=True)
        usable = self.kv_cache.config.num_blocks - 1  # block 0 is the null block
        if need > usable:
            raise ValueError(f"a request of up to {longest} tokens needs {need} blocks; the pool has only {usable}")
        self._next_id += 1
        return V4Request(self.manager.make_request(request_id, ids), sampling_params, index)

    def add_request(self, prompt: str | list[int], sampling_params: SamplingParams) -> V4Request:
        """Check and queue one request (for stepping the engine by hand with `step()`)."""
        req = self.make_request(prompt, sampling_params, len(self.waiting) + len(self.running))
        if not hasattr(self, "_generator"):
            self._generator = torch.Generator().manual_seed(0)
        self.waiting.append(req)
        return req

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    # --- scheduling
    def _preempt(self, victim: V4Request) -> None:
        self.running.remove(victim)
        self.manager.free(victim.request)
        victim.request.num_computed_tokens = 0
        victim.request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(victim)
        self.stats.preemptions += 1

    def schedule(self) -> list[ScheduledChunk]:
        """Pick this step's chunks: running requests first, then waiting ones while budget lasts."""
        budget = self.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted = False
        for req in list(self.running):
            if budget == 0 or req not in self.running:
                continue
            r = req.request
            n = min(r.num_tokens - r.num_computed_tokens, budget)
            while self.manager.allocate_slots(r, n) is None:
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is req:
                    n = 0
                    break
            if n:
                chunks.append(ScheduledChunk(req, n, r.num_computed_tokens))
                budget -= n
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            r = req.request
            hits, num_hit = self.manager.get_computed_blocks(r)
            n = min(r.num_tokens - num_hit, budget)
            if self.manager.allocate_slots(r, n, num_new_computed_tokens=num_hit, new_computed_blocks=hits if num_hit else None,
                                           has_scheduled_reqs=bool(chunks)) is None:
                break
            self.waiting.popleft()
            r.num_computed_tokens = num_hit
            r.status = RequestStatus.RUNNING
            self.running.append(req)
            self.stats.cached_tokens += num_hit
            chunks.append(ScheduledChunk(req, n, num_hit))
            budget -= n
        return chunks

    def build_context(self, chunks: list[ScheduledChunk]) -> tuple[torch.Tensor, StepContext]:
        """Packed input ids, positions and every chunk's block tables (one per cache group)."""
        ids, positions, seq_chunks, start = [], [], [], 0
        for c in chunks:
            tokens = c.req.request.all_token_ids
            ids.extend(tokens[c.first_position : c.first_position + c.num_tokens])
            positions.extend(range(c.first_position, c.first_position + c.num_tokens))
            tables = tuple(list(t) for t in self.manager.get_block_ids(c.req.request.request_id))
            seq_chunks.append(SeqChunk(start, c.num_tokens, c.first_position, tables))
            start += c.num_tokens
        ctx = StepContext(torch.tensor(positions, dtype=torch.long), seq_chunks)
        return torch.tensor(ids, dtype=torch.long), ctx

    def _sample(self, logits: torch.Tensor, params: SamplingParams) -> int:
        if params.temperature == 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / params.temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self._generator))

    def step(self) -> list[V4Request]:
        """Schedule, run the model on one packed batch, sample, finish; returns finished requests."""
        start = perf_counter()
        chunks = self.schedule()
        if not chunks:
            raise RuntimeError("no request could be scheduled (the pool is too small for the waiting request)")
        ids, ctx = self.build_context(chunks)
        hidden = forward_step(self.hf_model, ids, ctx, self.kv_cache.layers)
        if self.record_steps:
            self.last_contexts.append(ctx)
        finished, prefill = [], 0
        used = self.manager.block_pool.num_gpu_blocks - 1 - self.manager.block_pool.get_num_free_blocks()
        self.stats.peak_blocks_in_use = max(self.stats.peak_blocks_in_use, used)
        for c, sc in zip(chunks, ctx.chunks):
            r = c.req.request
            prompt_part = max(0, min(r.num_prompt_tokens, c.first_position + c.num_tokens) - c.first_position)
            prefill += prompt_part
            r.num_computed_tokens += c.num_tokens
            if r.num_computed_tokens < r.num_tokens:
                continue  # a prefill chunk that has not reached the end yet
            logits = self.hf_model.lm_head(hidden[sc.start + sc.num_tokens - 1])
            token = self._sample(logits, c.req.sampling_params)
            c.req.logits.append(logits)
            r.append_output_token_ids([token])
            params = c.req.sampling_params
            if c.req.num_completion_tokens >= params.max_tokens or (not params.ignore_eos and token == self.eos):
                self.running.remove(c.req)
                self.manager.free(r)
                r.status = RequestStatus.FINISHED
                finished.append(c.req)
        num_tokens = sum(c.num_tokens for c in chunks)
        elapsed = perf_counter() - start
        self.stats.steps += 1
        if prefill:
            self.stats.prefill_steps += 1
            self.stats.prefill_tokens += prefill
            self.stats.prefill_time_s += elapsed
        if num_tokens - prefill:
            self.stats.decode_steps += 1 if not prefill else 0
            self.stats.decode_tokens += num_tokens - prefill
            self.stats.decode_time_s += 0.0 if prefill else elapsed
        return finished

    def generate(
        self,
        prompts: SequenceLike[str | list[int]],
        sampling_params: SamplingParams | SequenceLike[SamplingParams] | None = None,
        use_tqdm: bool = False,
        seed: int = 0,
    ) -> list[dict]:
        """Run prompts to completion; `[{"text", "token_ids"}]` in prompt order (completions only).

        Every prompt is checked before any is queued, so a bad one leaves the engine untouched.
        `use_tqdm` is accepted for Part I's signature; this engine shows no progress bar.
        """
        prompts, sampling_params = pair_prompts_with_params(prompts, sampling_params)
        next_id = self._next_id
        try:
            reqs = [self.make_request(p, sp, i) for i, (p, sp) in enumerate(zip(prompts, sampling_params))]
        except ValueError:
            self._next_id = next_id
            raise
        self._generator = torch.Generator().manual_seed(seed)
        self.stats = EngineStats()
        self.last_requests = reqs
        self.waiting.extend(reqs)
        while self.waiting or self.running:
            self.step()
        outputs = []
        for req in reqs:
            ids = list(req.request.output_token_ids)
            text = self.tokenizer.decode(ids) if self.tokenizer is not None else None
            outputs.append({"text": text, "token_ids": ids})
        return outputs
