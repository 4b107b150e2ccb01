"""ModelRunner: turn a scheduled batch of sequences into tensors, run the model, sample.

This is where block tables stop being bookkeeping and become addresses. For each step it builds
  - input_ids / positions: the tokens to compute and where they sit in their sequence;
  - slot_mapping: for each of those tokens, the cache slot its K/V is written to,
    `block_table[pos // block_size] * block_size + pos % block_size`;
  - prefill: cu_seqlens_q / cu_seqlens_k (packed batch boundaries over new tokens and over
    whole contexts), their maxima, and the block tables;
  - decode: context_lens and the block tables.
It owns the KV cache: one tensor `[2, num_layers, num_blocks, block_size, num_kv_heads,
head_dim]`, of which each attention layer gets its own K and V views.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from refimpl.engine.config import Config, resolve_dtype
from refimpl.engine.context import Context, get_context, reset_context, set_context
from refimpl.engine.kv_budget import (
    available_kv_cache_memory,
    blocks_for_work,
    kv_cache_num_blocks,
)
from refimpl.engine.loader import load_model
from refimpl.engine.model import Qwen3ForCausalLM
from refimpl.engine.sampler import Sampler
from refimpl.errors import InvariantError
from refimpl.kernels.backend import attention_ops, check_attention_backend
from refimpl.paged.sequence import Sequence


@contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class ModelRunner:
    def __init__(self, config: Config) -> None:
        self.config = config
        hf = config.hf_config
        self.block_size = config.kvcache_block_size
        self.device = torch.device(
            config.device or ("cuda" if torch.cuda.is_available() else "cpu")
        )
        self.dtype = resolve_dtype(config.dtype, hf.torch_dtype, self.device)
        self.attention_backend = check_attention_backend(
            config.attention_backend, self.device, self.block_size
        )
        ops = attention_ops(self.attention_backend, self.device, self.block_size)
        with _default_dtype(self.dtype), torch.device(self.device):
            self.model = Qwen3ForCausalLM(hf, ops)
        load_model(self.model, config.model)
        self.model.eval()
        self.sampler = Sampler(config.seed, self.device)
        self.num_kvcache_blocks = self.allocate_kv_cache()

    # --- KV cache
    @property
    def block_bytes(self) -> int:
        """Bytes one block occupies across all layers, K and V."""
        hf = self.config.hf_config
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return (
            2
            * hf.num_hidden_layers
            * self.block_size
            * hf.num_key_value_heads
            * hf.head_dim
            * itemsize
        )

    def kv_cache_blocks(self) -> int:
        """The pool size: `num_kvcache_blocks` if given, else as many blocks as
        `kv_cache_memory_bytes` holds, else the blocks the work can use
        (`kv_budget.blocks_for_work`) within the memory this process may still use on its
        device (`kv_budget.available_kv_cache_memory`)."""
        config = self.config
        if config.num_kvcache_blocks is not None:
            return config.num_kvcache_blocks
        if config.kv_cache_memory_bytes is not None:
            work, available = (
                config.kv_cache_memory_bytes // self.block_bytes,
                config.kv_cache_memory_bytes,
            )
        else:
            work = blocks_for_work(config.max_num_seqs, config.max_model_len, self.block_size)
            available = available_kv_cache_memory(self.device, config.gpu_memory_utilization)
        return kv_cache_num_blocks(self.block_bytes, max(work, 1), available, self.device)

    def allocate_kv_cache(self) -> int:
        """Allocate the pool of `kv_cache_blocks()` blocks and attach each layer's views;
        return its size."""
        num_blocks = self.kv_cache_blocks()
        hf = self.config.hf_config
        self.kv_cache = torch.zeros(
            2,
            hf.num_hidden_layers,
            num_blocks,
            self.block_size,
            hf.num_key_value_heads,
            hf.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        for layer_id, attn in enumerate(self.model.attention_layers()):
            attn.k_cache = self.kv_cache[0, layer_id]
            attn.v_cache = self.kv_cache[1, layer_id]
        return num_blocks

    def close(self) -> None:
        """Drop the KV cache and the model, so their memory goes back (to the device, on CUDA).
        Idempotent."""
        if self.model is None:
            return
        for attn in self.model.attention_layers():
            attn.k_cache = attn.v_cache = torch.tensor([])
        self.kv_cache = None
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # --- inputs
    def slot(self, seq: Sequence, position: int) -> int:
        """The cache slot of token `position` of `seq`: its block's first slot plus the
        offset."""
        return (
            seq.block_table[position // self.block_size] * self.block_size
            + position % self.block_size
        )

    def _int32(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=self.device)

    def _int64(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    # --- the step's addresses, checked once on the Python lists they are built from, so that
    # no attention layer checks them again as tensors (`Context.checked`). They come from the
    # block manager, so a failure is a bug here (InvariantError), not bad input.
    def check_block_tables(self, seqs: list[Sequence], context_lens: list[int]) -> None:
        num_blocks = self.num_kvcache_blocks
        for seq, length in zip(seqs, context_lens):
            table = seq.block_table
            if not 1 <= length <= len(table) * self.block_size or not all(
                0 <= b < num_blocks for b in table
            ):
                raise InvariantError(
                    f"sequence {seq.seq_id}: a context of {length} tokens does not fit block "
                    f"table {table} "
                    f"(block size {self.block_size}, {num_blocks} blocks)"
                )

    def check_slot_mapping(self, slot_mapping: list[int]) -> None:
        num_slots = self.num_kvcache_blocks * self.block_size
        if len(set(slot_mapping)) != len(slot_mapping) or not all(
            0 <= s < num_slots for s in slot_mapping
        ):
            raise InvariantError(
                f"slot_mapping {slot_mapping} repeats a slot or leaves [0, {num_slots})"
            )

    def prepare_block_tables(self, seqs: list[Sequence]) -> torch.Tensor:
        """`[batch, longest block table]` int32, padded with -1 (never read: beyond the
        context)."""
        width = max(len(seq.block_table) for seq in seqs)
        return self._int32(
            [seq.block_table + [-1] * (width - len(seq.block_table)) for seq in seqs]
        )

    def prepare_prefill(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor]:
        """Pack this step's prompt tokens (or chunks of them) of every sequence; set the
        context.

        A sequence computes tokens `num_cached_tokens ... num_cached_tokens +
        num_scheduled_tokens - 1`; the cached ones (a prefix-cache hit or earlier chunks) are
        only read, through the block table. nano-vllm builds block tables here only when some
        prefix is cached, because flash-attn can attend to fresh K/V directly; the paged
        kernels always read through them, so we always do.
        """
        input_ids: list[int] = []
        positions: list[int] = []
        cu_seqlens_q, cu_seqlens_k = [0], [0]
        slot_mapping: list[int] = []
        self.check_block_tables(
            seqs, [seq.num_cached_tokens + seq.num_scheduled_tokens for seq in seqs]
        )
        for seq in seqs:
            start = seq.num_cached_tokens
            end = start + seq.num_scheduled_tokens
            input_ids.extend(seq[start:end])
            positions.extend(range(start, end))
            cu_seqlens_q.append(cu_seqlens_q[-1] + end - start)
            cu_seqlens_k.append(cu_seqlens_k[-1] + end)
            slot_mapping.extend(self.slot(seq, pos) for pos in range(start, end))
        self.check_slot_mapping(slot_mapping)
        set_context(
            Context(
                is_prefill=True,
                cu_seqlens_q=self._int32(cu_seqlens_q),
                cu_seqlens_k=self._int32(cu_seqlens_k),
                max_seqlen_q=max(b - a for a, b in zip(cu_seqlens_q, cu_seqlens_q[1:])),
                max_seqlen_k=max(b - a for a, b in zip(cu_seqlens_k, cu_seqlens_k[1:])),
                slot_mapping=self._int32(slot_mapping),
                block_tables=self.prepare_block_tables(seqs),
                checked=True,
            )
        )
        return self._int64(input_ids), self._int64(positions)

    def prepare_decode(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per sequence: its newest token, which has no K/V yet; set the context.

        Reads `seq.last_token` (not `token_ids[-1]`): a tensor-parallel worker receives only
        that.
        """
        input_ids = [seq.last_token for seq in seqs]
        positions = [len(seq) - 1 for seq in seqs]
        context_lens = [len(seq) for seq in seqs]
        self.check_block_tables(seqs, context_lens)
        slot_mapping = [
            seq.block_table[-1] * self.block_size + seq.last_block_num_tokens - 1
            for seq in seqs
        ]
        self.check_slot_mapping(slot_mapping)
        set_context(
            Context(
                is_prefill=False,
                slot_mapping=self._int32(slot_mapping),
                context_lens=self._int32(context_lens),
                block_tables=self.prepare_block_tables(seqs),
                checked=True,
            )
        )
        return self._int64(input_ids), self._int64(positions)

    def prepare_sample(self, seqs: list[Sequence]) -> torch.Tensor:
        return torch.tensor(
            [seq.temperature for seq in seqs], dtype=torch.float32, device=self.device
        )

    # --- run
    @torch.inference_mode()
    def run_model(
        self, input_ids: torch.Tensor, positions: torch.Tensor, is_prefill: bool
    ) -> torch.Tensor:
        """Logits of the last computed token of each sequence, `[batch, vocab]`."""
        hidden_states = self.model(input_ids, positions)
        if is_prefill:
            hidden_states = hidden_states[get_context().cu_seqlens_q[1:].long() - 1]
        return self.model.compute_logits(hidden_states)

    def run(self, seqs: list[Sequence], is_prefill: bool) -> list[int]:
        """One model step for the scheduled batch; one sampled token per sequence."""
        input_ids, positions = (
            self.prepare_prefill(seqs) if is_prefill else self.prepare_decode(seqs)
        )
        try:
            logits = self.run_model(input_ids, positions, is_prefill)
            token_ids = self.sampler(logits, self.prepare_sample(seqs)).tolist()
        finally:
            reset_context()
        return token_ids
