"""No test assumes the device: the kernel and engine tests pass as if on a GPU machine too.

CI has no GPU, so the tests that touch the Triton kernels, a backend choice or an engine run
once more in a fresh pytest with REFIMPL_FAKE_CUDA=1 (see conftest.py): torch reports a CUDA
device, the kernels run in Triton's interpreter, and the default device is "meta". A test that
hands the kernels tensors it did not put on `kernel_device`, launches a kernel without taking
that fixture, or builds an engine or asks for the best backend without naming the device, fails
there, as it would on a machine with a GPU (where the kernels compile for CUDA and refuse CPU
tensors).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
#: What makes a test file device-sensitive: a Triton kernel or its twin, a backend choice, an
# engine.
DEVICE_SENSITIVE = re.compile(
    r"\b(paged_decode_attention|paged_prefill_attention|store_kvcache|compute_swa_indices_and_lens|"
    r"compute_global_topk_indices_and_lens|attention_ops|v4_index_ops|attention_backend|"
    r"index_kernel_backend|triton|LLM)\b"
)
#: Not rerun: compiles for sm_80 in its own processes (TRITON_INTERPRET=0); and pins, not
# devices.
NOT_RERUN = {"test_kernels_compile.py", "test_check_install.py", Path(__file__).name}


def device_sensitive_test_files() -> list[Path]:
    return sorted(
        path
        for path in TESTS.glob("test_*.py")
        if path.name not in NOT_RERUN
        and DEVICE_SENSITIVE.search(path.read_text(encoding="utf-8"))
    )


def run_as_if_on_a_gpu_machine(*args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        REFIMPL_FAKE_CUDA="1",
        HYPOTHESIS_PROFILE="device-check",
        PYTHONPATH=str(ROOT),
    )
    env.pop("TRITON_INTERPRET", None)
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
        "-m",
        "not gpu",
        *args,
    ]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800
    )


def test_the_device_sensitive_files_are_found():
    names = {path.name for path in device_sensitive_test_files()}
    assert {
        "test_kernels_attention.py",
        "test_kernels_store.py",
        "test_kernels_v4.py",
        "test_kernels_v4_properties.py",
        "test_kernels_backend.py",
        "test_v4_kernels.py",
        "test_engine_model_runner.py",
        "test_engine_triton.py",
        "test_engine_kv_budget.py",
        "test_kernels_benchmark.py",
    } <= names
    assert not names & NOT_RERUN


ASSUMING = """
import torch
import refimpl.kernels as kernels
from refimpl.engine import LLM
from refimpl.kernels import backend


def test_cpu_tensors_into_a_kernel():
    rows = torch.ones(1, 1, 8)
    kernels.store_kvcache(rows, rows, torch.zeros(1, 4, 1, 8), torch.zeros(1, 4, 1, 8), torch.tensor([0]))


def test_forgets_one_tensor(kernel_device):
    rows = torch.ones(1, 1, 8, device=kernel_device)
    cache = torch.zeros(1, 4, 1, 8)  # no device
    kernels.store_kvcache(rows, rows, cache, cache.clone(), torch.tensor([0], device=kernel_device))


def test_engine_on_the_default_device(tiny_dir):
    LLM(tiny_dir, kvcache_block_size=4, num_kvcache_blocks=4)


def test_best_backend_for_no_device():
    assert backend.best_attention_backend() == "torch"


def test_states_every_device(kernel_device, tiny_dir):
    rows = torch.ones(1, 1, 8, device=kernel_device)
    cache = torch.zeros(1, 4, 1, 8, device=kernel_device)
    kernels.store_kvcache(rows, rows, cache, cache.clone(), torch.tensor([0], device=kernel_device))
    assert backend.best_attention_backend("cpu") == "torch"
    LLM(tiny_dir, device="cpu", kvcache_block_size=4, num_kvcache_blocks=4)
"""


@pytest.mark.slow  # runs pytest in fresh processes
def test_the_fake_gpu_run_catches_tests_that_assume_the_cpu(tmp_path):
    """Four tests that pass on a CPU-only machine and assume it; only the one that states its
    devices passes."""
    probe = tmp_path / "test_assuming.py"
    probe.write_text(ASSUMING)
    plain = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-p",
            "tests.conftest",
            str(probe),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert "5 passed" in plain.stdout, plain.stdout[-3000:]
    faked = run_as_if_on_a_gpu_machine("-p", "tests.conftest", "-rf", str(probe))
    out = faked.stdout
    assert "4 failed, 1 passed" in out, out[-3000:]
    for name in (
        "test_cpu_tensors_into_a_kernel",
        "test_forgets_one_tensor",
        "test_engine_on_the_default_device",
        "test_best_backend_for_no_device",
    ):
        assert re.search(rf"FAILED \S*{probe.name}::{name}\b", out), (name, out[-3000:])
    assert "does not take the `kernel_device` fixture" in out


@pytest.mark.slow  # reruns every device-sensitive test file in a fresh process
def test_kernel_and_engine_tests_pass_as_if_on_a_gpu_machine():
    files = [str(path.relative_to(ROOT)) for path in device_sensitive_test_files()]
    done = run_as_if_on_a_gpu_machine(*files)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
