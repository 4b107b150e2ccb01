"""The engine on the Triton kernels equals transformers: on ``kernel_device`` (the CPU under
Triton's interpreter, CUDA where the kernels compile), in float32 like the transformers model
on the CPU."""

from __future__ import annotations

import pytest
import torch

from refimpl.engine import LLM, SamplingParams, make_tiny_model
from refimpl.engine.oracle import hf_greedy, load_hf_model
from refimpl.kernels.triton_setup import HAS_TRITON

pytestmark = pytest.mark.slow  # the engine on the Triton interpreter


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_triton_backend_greedy_equals_transformers_with_a_prefix_hit(kernel_device, tmp_path):
    prompts = [list(b"Hello"), list(b"paged kv cache!")]
    sp = SamplingParams(temperature=0, max_tokens=3)
    with torch.device("cpu"):  # the checkpoint and the transformers oracle live on the CPU
        path = make_tiny_model(tmp_path / "tiny", seed=0)
        want = [hf_greedy(load_hf_model(path), p, 3) for p in prompts]
    llm = LLM(
        path,
        device=kernel_device,
        dtype="float32",
        kvcache_block_size=4,
        num_kvcache_blocks=16,
        attention_backend="triton",
    )
    assert llm.attention_backend == "triton"
    assert [o["token_ids"] for o in llm.generate(prompts, sp, use_tqdm=False)] == want
    # Again: the prefill now reads 12 cached tokens of the second prompt through its block
    # table.
    assert [o["token_ids"] for o in llm.generate(prompts[1:], sp, use_tqdm=False)] == want[1:]
    assert llm.stats.cached_tokens == 12
