"""Shared tiny DeepSeek V4 models for the tests/test_v4_*.py files (built once per session)."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile

import pytest
import torch

# Three tiny configurations: sliding windows 16 and 128, different layer mixes and indexer
# top-k.
CONFIGS = {
    "A": dict(seed=0, compress_ratios=(0, 4, 128, 4), sliding_window=16, index_topk=4),
    "B": dict(seed=1, compress_ratios=(4, 128), sliding_window=128, index_topk=8),
    "C": dict(seed=2, compress_ratios=(128, 0, 4), sliding_window=16, index_topk=2),
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices: one torch thread is ~100x faster than two contending ones. A test module
    that imports this fixture runs all its tests with it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@functools.cache
def model_dir(name: str) -> str:
    from refimpl.v4.tiny import make_tiny_v4

    kwargs = dict(CONFIGS[name])
    seed = kwargs.pop("seed")
    path = tempfile.mkdtemp(prefix=f"tiny_v4_{name}_")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    make_tiny_v4(path, seed=seed, **kwargs)
    return path


@functools.cache
def hf_model(name: str):
    from refimpl.v4.loader import load_hf_model

    return load_hf_model(model_dir(name))


def prompts(seed: int = 5) -> dict[str, list[int]]:
    """P1 and P3 share a 256-token prefix (one full 256-block: a prefix-cache hit); P2 is
    short."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(0, 256, (n,), generator=g).tolist()  # noqa: E731
    shared = rand(256)
    return {"P1": shared + rand(20), "P2": rand(40), "P3": shared + rand(12)}


@functools.cache
def oracle(name: str, prompt: str, max_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    from refimpl.v4.oracle import oracle_generate

    return oracle_generate(hf_model(name), prompts()[prompt], max_tokens)
