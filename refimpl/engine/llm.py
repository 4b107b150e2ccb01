"""LLM: the offline engine loop (nano-vllm's LLMEngine), schedule -> run -> postprocess.

    with LLM("path/to/model", kvcache_block_size=16, num_kvcache_blocks=64) as llm:
        outputs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8))
    outputs[0]["text"], outputs[0]["token_ids"], llm.stats

Leaving the `with` block (or `llm.close()`) releases the KV cache and the model, so another
engine in the same process can have the memory.

Each step the Scheduler picks a batch and fixes its blocks, the ModelRunner computes one token
per sequence through the paged KV cache, and `postprocess` records the results (registering
filled blocks in the prefix cache, finishing sequences, freeing their blocks).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence as SequenceLike
from dataclasses import dataclass
from time import perf_counter

from tqdm import TqdmWarning, tqdm

from refimpl.engine.config import Config
from refimpl.engine.lifecycle import ClosableEngine
from refimpl.engine.model_runner import ModelRunner
from refimpl.engine.prompts import checked_request_tokens, pair_prompts_with_params
from refimpl.paged.scheduler import Scheduler, SchedulerConfig
from refimpl.paged.sequence import SamplingParams, Sequence

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


@dataclass
class EngineStats:
    """What one `generate` call did (reset at the start of each call)."""

    # prompt tokens computed by the model (recomputation after preemption included)
    prefill_tokens: int = 0
    # tokens whose K/V came from the prefix cache instead (at a sequence's first
    cached_tokens: int = 0
    #                         prefill, and again when it is recomputed after a preemption)
    # tokens computed in decode steps (one per running sequence per step)
    decode_tokens: int = 0
    steps: int = 0
    prefill_steps: int = 0
    decode_steps: int = 0
    preemptions: int = 0
    peak_blocks_in_use: int = 0
    prefill_time_s: float = 0.0
    decode_time_s: float = 0.0


def load_tokenizer(model_dir: str):
    """The checkpoint's Hugging Face tokenizer, or None when the directory has none."""
    if not any(os.path.exists(os.path.join(model_dir, name)) for name in _TOKENIZER_FILES):
        return None
    # transformers imports tqdm.auto, which warns in a Jupyter kernel without ipywidgets;
    # refimpl never shows a widget, so that warning is only noise.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TqdmWarning)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_dir)


class LLMEngine(ClosableEngine):
    def __init__(self, model: str | os.PathLike, **kwargs) -> None:
        unknown = sorted(set(kwargs) - set(Config.field_names()))
        if unknown:
            raise ValueError(
                f"unknown LLM arguments {unknown}; allowed: {sorted(Config.field_names())}"
            )
        config = Config(str(model), **kwargs)
        self.tokenizer = load_tokenizer(config.model)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is None:
            eos = config.hf_config.eos_token_id
        config.eos = -1 if eos is None else eos
        self.config = config
        self.model_runner = ModelRunner(config)
        self.scheduler = Scheduler(
            SchedulerConfig(
                num_kvcache_blocks=self.model_runner.num_kvcache_blocks,
                kvcache_block_size=config.kvcache_block_size,
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                eos=config.eos,
                enable_prefix_caching=config.enable_prefix_caching,
            )
        )
        self.stats = EngineStats()
        self.closed = False

    @property
    def attention_backend(self) -> str:
        return self.model_runner.attention_backend

    # --- requests
    def make_sequence(
        self, prompt: str | list[int], sampling_params: SamplingParams
    ) -> Sequence:
        """Tokenize and check a request without queueing it."""
        self._check_open()
        token_ids = checked_request_tokens(
            prompt,
            sampling_params,
            self.tokenizer,
            self.config.model,
            self.config.hf_config.vocab_size,
            self.config.max_model_len,
        )
        seq = Sequence(token_ids, sampling_params, block_size=self.config.kvcache_block_size)
        need = self.scheduler.max_blocks_needed(seq)
        if need > self.scheduler.block_manager.num_blocks:
            raise ValueError(
                f"a request needing up to {need} blocks can never run in a pool of "
                f"{self.scheduler.block_manager.num_blocks} blocks "
                f"(block_size={self.config.kvcache_block_size})"
            )
        return seq

    def add_request(
        self, prompt: str | list[int], sampling_params: SamplingParams
    ) -> Sequence:
        seq = self.make_sequence(prompt, sampling_params)
        self.scheduler.add(seq)
        return seq

    def is_finished(self) -> bool:
        return self.scheduler.is_finished()

    # --- the loop
    def step(self) -> tuple[list[tuple[int, list[int]]], int]:
        """One scheduler step. Returns (finished (seq_id, completion ids), tokens computed),
        the count negative for a decode step (nano-vllm's convention for the progress bar)."""
        self._check_open()
        scheduler = self.scheduler
        # not yet allocated
        fresh = {seq.seq_id for seq in scheduler.waiting if not seq.block_table}
        preemptions_before = scheduler.num_preemptions
        start = perf_counter()
        seqs, is_prefill = scheduler.schedule()
        stats = self.stats
        stats.preemptions += scheduler.num_preemptions - preemptions_before
        stats.peak_blocks_in_use = max(
            stats.peak_blocks_in_use, len(scheduler.block_manager.used_block_ids)
        )
        num_tokens = sum(seq.num_scheduled_tokens for seq in seqs)
        if is_prefill:
            stats.cached_tokens += sum(
                seq.num_cached_tokens for seq in seqs if seq.seq_id in fresh
            )
        token_ids = self.model_runner.run(seqs, is_prefill)
        scheduler.postprocess(seqs, token_ids, is_prefill)
        elapsed = perf_counter() - start
        stats.steps += 1
        if is_prefill:
            stats.prefill_steps += 1
            stats.prefill_tokens += num_tokens
            stats.prefill_time_s += elapsed
        else:
            stats.decode_steps += 1
            stats.decode_tokens += num_tokens
            stats.decode_time_s += elapsed
        outputs = [(seq.seq_id, seq.completion_token_ids) for seq in seqs if seq.is_finished]
        return outputs, num_tokens if is_prefill else -num_tokens

    def generate(
        self,
        prompts: SequenceLike[str | list[int]],
        sampling_params: SamplingParams | SequenceLike[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[dict]:
        """Run prompts to completion; `[{"text", "token_ids"}]` in prompt order (completions
        only).

        Every prompt is checked before any is queued, so a bad one leaves the engine untouched.
        """
        self._check_open()
        prompts, sampling_params = pair_prompts_with_params(prompts, sampling_params)
        seqs = [self.make_sequence(p, sp) for p, sp in zip(prompts, sampling_params)]
        self.stats = EngineStats()
        for seq in seqs:
            self.scheduler.add(seq)
        wanted = {seq.seq_id for seq in seqs}
        results: dict[int, list[int]] = {}
        with tqdm(
            total=len(seqs), desc="Generating", dynamic_ncols=True, disable=not use_tqdm
        ) as pbar:
            prefill_tps = decode_tps = 0.0
            while not self.is_finished():
                start = perf_counter()
                finished, num_tokens = self.step()
                elapsed = max(perf_counter() - start, 1e-9)
                if num_tokens > 0:
                    prefill_tps = num_tokens / elapsed
                else:
                    decode_tps = -num_tokens / elapsed
                pbar.set_postfix(
                    {"Prefill": f"{prefill_tps:.0f}tok/s", "Decode": f"{decode_tps:.0f}tok/s"}
                )
                for seq_id, token_ids in finished:
                    results[seq_id] = token_ids
                    if seq_id in wanted:
                        pbar.update(1)
        outputs = []
        for seq in seqs:
            token_ids = results[seq.seq_id]
            text = self.tokenizer.decode(token_ids) if self.tokenizer is not None else None
            outputs.append({"text": text, "token_ids": token_ids})
        return outputs


class LLM(LLMEngine):
    """The user-facing name (as in vLLM and nano-vllm)."""
