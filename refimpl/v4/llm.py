"""V4LLM: a tiny DeepSeek V4 served from the hybrid paged cache (Part III's engine loop).

    with V4LLM(model_dir, num_kvcache_blocks=64, max_num_batched_tokens=64) as llm:
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8))
    outputs[0]["text"], outputs[0]["token_ids"], llm.stats

Split the way Part I's `LLM` is: the `Scheduler` picks each step's chunks and holds the blocks
(Part II's `KVCacheManager`), the `ModelRunner` builds the step's tensors and addresses, runs
the model and samples with the shared `Sampler`, `postprocess` records the result, and
`record_step` keeps the statistics. The model directory is loaded like Part I's: a local
directory, safetensors only (`refimpl.v4.loader`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence as SequenceLike
from time import perf_counter

from tqdm import tqdm

from refimpl.engine.lifecycle import ClosableEngine
from refimpl.engine.llm import EngineStats, load_tokenizer
from refimpl.engine.prompts import checked_request_tokens, pair_prompts_with_params
from refimpl.engine.sampler import Sampler
from refimpl.hybrid.kv_cache_manager import KVCacheManager
from refimpl.paged.sequence import SamplingParams
from refimpl.v4.loader import check_v4_checkpoint, load_hf_model
from refimpl.v4.model_runner import ModelRunner
from refimpl.v4.scheduler import ScheduledChunk, Scheduler, V4Request
from refimpl.validation import check_bool, check_positive_int


def record_step(
    stats: EngineStats,
    chunks: list[ScheduledChunk],
    elapsed: float,
    blocks_in_use: int,
    preemptions: int,
) -> None:
    """Add one step to `stats`: prompt tokens computed or taken from the prefix cache, decode
    tokens, time, preemptions, and the peak of blocks in use."""
    prompt = sum(
        max(
            0,
            min(c.req.request.num_prompt_tokens, c.first_position + c.num_tokens)
            - c.first_position,
        )
        for c in chunks
    )
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
    cache is allocated on that model's device.
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
        manager = KVCacheManager.from_config(
            self.model_runner.kv_cache.config,
            self.max_model_len,
            enable_caching=enable_prefix_caching,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        eos = config.eos_token_id if isinstance(config.eos_token_id, int) else -1
        self.scheduler = Scheduler(manager, max_num_seqs, max_num_batched_tokens, eos)
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
        req = V4Request(
            self.scheduler.kv_cache_manager.make_request(request_id, ids), sampling_params
        )
        self.scheduler.check_request(req)  # refuses a request that could never fit
        self._next_id += 1
        return req

    def add_request(
        self, prompt: str | list[int], sampling_params: SamplingParams
    ) -> V4Request:
        """Check and queue one request (for stepping the engine by hand with `step()`)."""
        req = self.make_request(prompt, sampling_params)
        self.scheduler.add(req)
        return req

    def is_finished(self) -> bool:
        return self.scheduler.is_finished()

    # --- the loop
    def step(self) -> list[V4Request]:
        """Schedule, run the model on one packed batch, sample, postprocess; returns finished
        requests."""
        self._check_open()
        start = perf_counter()
        preemptions_before = self.scheduler.num_preemptions
        chunks = self.scheduler.schedule()
        if not chunks:
            raise RuntimeError(
                "no request could be scheduled (the pool is too small for the waiting request)"
            )
        usable = self.model_runner.kv_cache.config.num_blocks - 1
        blocks_in_use = round(self.scheduler.kv_cache_manager.usage * usable)
        token_ids, logits = self.model_runner.run(chunks)
        if self.record_logits:
            for c, row in zip([c for c in chunks if c.samples], logits):
                c.req.logits.append(row)
        finished = self.scheduler.postprocess(chunks, token_ids)
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
            self.scheduler.add(req)
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
