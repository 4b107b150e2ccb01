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

import io
import os
import re
import subprocess
import sys
import tokenize
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
#: Rerun although its code names no kernel: it runs benchmarks/kernels_gpu.py in-process.
ALSO_RERUN = {"test_kernels_benchmark.py"}


def code_without_text(source: str) -> str:
    """A file's code without its strings and comments: a kernel named in a student's cell
    (the grader's tests) or in a docstring does not make a file device-sensitive."""
    skipped = {tokenize.STRING, tokenize.COMMENT, getattr(tokenize, "FSTRING_MIDDLE", -1)}
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return " ".join(token.string for token in tokens if token.type not in skipped)


def device_sensitive_test_files() -> list[Path]:
    return sorted(
        path
        for path in TESTS.glob("test_*.py")
        if path.name not in NOT_RERUN
        and (
            path.name in ALSO_RERUN
            or DEVICE_SENSITIVE.search(code_without_text(path.read_text(encoding="utf-8")))
        )
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
        "test_device_probe.py",
    } <= names
    assert not names & NOT_RERUN
    # names a kernel only inside students' cells (strings): the grader's tests, not a device's
    assert "test_grading_attacks.py" not in names


#: The tests of test_device_probe.py that assume the machine has no GPU.
ASSUMING_THE_CPU = (
    "test_cpu_tensors_into_a_kernel",
    "test_forgets_one_tensor",
    "test_engine_on_the_default_device",
    "test_best_backend_for_no_device",
)


@pytest.mark.slow  # reruns every device-sensitive test file in a fresh process
def test_kernel_and_engine_tests_pass_as_if_on_a_gpu_machine_and_the_probe_fails():
    """Every device-sensitive test passes as if on a GPU machine, except the four tests of
    `test_device_probe.py` that assume the CPU (they pass in the ordinary run): so the rerun
    does catch a test that assumes the CPU."""
    files = [str(path.relative_to(ROOT)) for path in device_sensitive_test_files()]
    assert "tests/test_device_probe.py" in files
    done = run_as_if_on_a_gpu_machine("-rf", *files)
    out = done.stdout
    failed = re.findall(r"^FAILED (\S+?)(?: - |$)", out, flags=re.MULTILINE)
    report = out[-6000:] + done.stderr[-2000:]
    assert sorted(failed) == sorted(
        f"tests/test_device_probe.py::{name}" for name in ASSUMING_THE_CPU
    ), report
    assert re.search(rf"^{len(ASSUMING_THE_CPU)} failed, \d+ passed", out, re.MULTILINE), (
        report
    )
    assert "does not take the `kernel_device` fixture" in out, report
