"""A probe for `test_device_neutral.py`: five tests that pass on a CPU-only machine, four of
which assume it (they pass here, and fail as if on a GPU machine). Only
`test_states_every_device` is written as every test in this folder must be.

In `make test` they run as ordinary tests (each passes on the CPU); `test_device_neutral.py`
reruns this file as if on a GPU machine and requires exactly the four assuming tests to fail
there, which shows that the rerun catches such a test. On a machine with a real GPU they are
skipped (four of them would fail, as intended).
"""

import os

import pytest
import torch

import refimpl.kernels as kernels
from refimpl.engine import LLM
from refimpl.kernels import backend

pytestmark = pytest.mark.skipif(
    os.environ.get("REFIMPL_FAKE_CUDA") != "1" and torch.cuda.is_available(),
    reason="the probe assumes a CPU-only machine (or the fake GPU of test_device_neutral.py)",
)


def test_cpu_tensors_into_a_kernel():
    rows = torch.ones(1, 1, 8)
    cache = torch.zeros(1, 4, 1, 8)
    kernels.store_kvcache(rows, rows, cache, cache.clone(), torch.tensor([0]))


def test_forgets_one_tensor(kernel_device):
    rows = torch.ones(1, 1, 8, device=kernel_device)
    cache = torch.zeros(1, 4, 1, 8)  # no device
    slots = torch.tensor([0], device=kernel_device)
    kernels.store_kvcache(rows, rows, cache, cache.clone(), slots)


def test_engine_on_the_default_device(tiny_dir):
    LLM(tiny_dir, kvcache_block_size=4, num_kvcache_blocks=4)


def test_best_backend_for_no_device():
    assert backend.best_attention_backend() == "torch"


def test_states_every_device(kernel_device, tiny_dir):
    rows = torch.ones(1, 1, 8, device=kernel_device)
    cache = torch.zeros(1, 4, 1, 8, device=kernel_device)
    slots = torch.tensor([0], device=kernel_device)
    kernels.store_kvcache(rows, rows, cache, cache.clone(), slots)
    assert backend.best_attention_backend("cpu") == "torch"
    LLM(tiny_dir, device="cpu", kvcache_block_size=4, num_kvcache_blocks=4)
