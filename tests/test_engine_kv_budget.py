"""KV-cache sizing and release: the pool is sized to the work within the memory left to this
process, two engines live in one process, and close() / `with` give the memory back.

The GPU arithmetic runs on a CPU against a fake card: `torch.cuda.mem_get_info`,
`memory_allocated` and `memory_reserved` replaced by a `FakeCard` that counts what each
"process" holds. Engines themselves run on the CPU (device="cpu").
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from refimpl.engine import LLM, SamplingParams
from refimpl.engine.kv_budget import (
    CPU_KV_CACHE_BYTES,
    available_kv_cache_memory,
    blocks_for_work,
    kv_cache_num_blocks,
)

GiB = 1024**3


class FakeCard:
    """A CUDA device of `total` bytes: `others` held by other processes, `held` in this
    process's live tensors and `cached` freed by this process but kept by torch's allocator."""

    def __init__(self, total: int, others: int = 0, held: int = 0, cached: int = 0) -> None:
        self.total, self.others, self.held, self.cached = total, others, held, cached

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(
            torch.cuda, "mem_get_info", lambda device=None: (self.free, self.total)
        )
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: self.held)
        monkeypatch.setattr(
            torch.cuda, "memory_reserved", lambda device=None: self.held + self.cached
        )

    @property
    def free(self) -> int:
        return self.total - self.others - self.held - self.cached

    def allocate(self, num_bytes: int) -> None:
        reuse = min(num_bytes, self.cached)
        self.cached -= reuse
        self.held += num_bytes


def test_blocks_for_work_is_every_sequence_at_the_longest_length():
    assert blocks_for_work(max_num_seqs=512, max_model_len=4096, block_size=256) == 512 * 16
    assert blocks_for_work(2, 65, 16) == 2 * 5  # 65 tokens need a fifth block
    with pytest.raises(ValueError, match="max_model_len"):
        blocks_for_work(2, 0, 16)


def test_a_cpu_budget_is_fixed():
    assert available_kv_cache_memory("cpu") == CPU_KV_CACHE_BYTES == 256 * 1024**2


def test_the_gpu_budget_is_this_processs_share_less_what_it_holds(monkeypatch):
    card = FakeCard(total=100 * GiB, others=30 * GiB, held=8 * GiB, cached=2 * GiB)
    card.install(monkeypatch)
    # this process's share: 90 GiB, of which it holds 8; the card can still give 60 free + 2
    # cached
    assert (
        available_kv_cache_memory("cuda", 0.9)
        == min(90 * GiB - 8 * GiB, 60 * GiB + 2 * GiB)
        == 62 * GiB
    )
    card.others = 0
    # now the share is the limit
    assert available_kv_cache_memory("cuda", 0.5) == 50 * GiB - 8 * GiB
    card.held = 60 * GiB
    # holds more than its share: nothing, never negative
    assert available_kv_cache_memory("cuda", 0.5) == 0
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        available_kv_cache_memory("cuda", 1.5)


def test_two_engines_on_one_card_each_get_their_work(monkeypatch):
    """The issue's failure: the first engine used to size its cache from the free memory (most
    of the card) and the second computed a negative budget. Sized to the work, both fit; the
    error comes only when the card is really full, and says what this process holds."""
    card = FakeCard(total=141 * GiB, others=1 * GiB)
    card.install(monkeypatch)
    # the tiny model: 2 layers, K and V, 256 tokens, 2 KV heads x 16, fp32
    block_bytes = 2 * 2 * 256 * 2 * 16 * 4
    work = blocks_for_work(512, 4096, 256)
    for engine in range(2):
        card.allocate(50 * 1024**2)  # the model's weights
        blocks = kv_cache_num_blocks(
            block_bytes, work, available_kv_cache_memory("cuda"), "cuda"
        )
        assert blocks == work == 8192, engine
        card.allocate(blocks * block_bytes)
    card.allocate(int(141 * GiB * 0.9))  # something really fills this process's share
    with pytest.raises(
        ValueError, match=r"holds no block of 131072 bytes \(.* bytes free; this process holds"
    ):
        kv_cache_num_blocks(block_bytes, work, available_kv_cache_memory("cuda"), "cuda")


def test_fewer_blocks_than_the_work_when_memory_is_short():
    assert (
        kv_cache_num_blocks(
            block_bytes=1000, work_blocks=50, available_bytes=20_500, device="cpu"
        )
        == 20
    )
    assert kv_cache_num_blocks(1000, 5, 20_500, "cpu") == 5
    with pytest.raises(
        ValueError, match="a KV budget of 999 bytes on cpu holds no block of 1000 bytes"
    ):
        kv_cache_num_blocks(1000, 5, 999, "cpu")


def test_engine_pool_is_sized_to_its_work_on_a_cpu(tiny_dir):
    small = LLM(
        tiny_dir, device="cpu", kvcache_block_size=16, max_num_seqs=2, max_model_len=64
    )
    assert (
        small.model_runner.num_kvcache_blocks
        == 2 * 4
        == small.scheduler.block_manager.num_blocks
    )
    # 512 sequences of 4096 tokens: capped
    default = LLM(tiny_dir, device="cpu", kvcache_block_size=256)
    block_bytes = default.model_runner.block_bytes
    assert (
        default.model_runner.num_kvcache_blocks
        == min(512 * 16, CPU_KV_CACHE_BYTES // block_bytes)
        == 2048
    )


def test_the_engine_asks_the_shared_budget_functions(tiny_dir, monkeypatch):
    """The model runner takes its memory from kv_budget (the same functions V4LLM can use)."""
    seen = []

    def fake_available(device, utilization):
        seen.append((torch.device(device).type, utilization))
        return 5 * 2048  # five blocks of the tiny model at block size 4

    monkeypatch.setattr(
        "refimpl.engine.model_runner.available_kv_cache_memory", fake_available
    )
    llm = LLM(tiny_dir, device="cpu", kvcache_block_size=4, gpu_memory_utilization=0.5)
    assert seen == [("cpu", 0.5)] and llm.model_runner.num_kvcache_blocks == 5
    monkeypatch.setattr(
        "refimpl.engine.model_runner.available_kv_cache_memory",
        lambda device, utilization: 100,
    )
    with pytest.raises(
        ValueError, match="a KV budget of 100 bytes on cpu holds no block of 2048 bytes"
    ):
        LLM(tiny_dir, device="cpu", kvcache_block_size=4)


def test_two_engines_in_one_process_and_close_releases_the_cache(tiny_dir):
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    prompts = ["two engines", "one process"]
    with (
        LLM(
            tiny_dir, device="cpu", kvcache_block_size=4, enable_prefix_caching=True
        ) as cached,
        LLM(
            tiny_dir, device="cpu", kvcache_block_size=8, enable_prefix_caching=False
        ) as plain,
    ):
        first = cached.generate(prompts, sp, use_tqdm=False)
        assert plain.generate(prompts, sp, use_tqdm=False) == first  # interleaved, both alive
        assert cached.generate(prompts, sp, use_tqdm=False) == first
        pool = weakref.ref(cached.model_runner.kv_cache)
        layer = cached.model_runner.model.attention_layers()[0]
        cached.close()
        gc.collect()
        assert pool() is None  # nothing holds the cache any more: its memory is free
        assert cached.model_runner.kv_cache is None and cached.model_runner.model is None
        assert layer.k_cache.numel() == 0 and layer.v_cache.numel() == 0
        # the other engine is untouched
        assert plain.generate(prompts, sp, use_tqdm=False) == first
        with pytest.raises(ValueError, match="this LLM is closed"):
            cached.generate(prompts, sp, use_tqdm=False)
        cached.close()  # closing twice is harmless
    assert plain.closed and plain.model_runner.kv_cache is None
    with pytest.raises(ValueError, match="closed"):
        plain.add_request("late", sp)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("share", [0, -0.1, 1.5, float("nan"), True, "0.9", None])
def test_a_share_outside_vllms_bounds_is_refused_on_every_device(share, device, monkeypatch):
    FakeCard(total=100 * GiB, others=0, held=0, cached=0).install(monkeypatch)
    with pytest.raises(
        ValueError, match=r"gpu_memory_utilization must be a fraction in \(0, 1\]"
    ):
        available_kv_cache_memory(device, share)


@pytest.mark.parametrize("available", [1e9, 4096.0, "4096", None])
def test_a_budget_that_is_not_a_byte_count_is_refused(available):
    with pytest.raises(ValueError, match="available_bytes must be an integer"):
        kv_cache_num_blocks(4096, 10, available, "cpu")
