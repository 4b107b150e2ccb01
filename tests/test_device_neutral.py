"""No test assumes the device: the kernel and engine tests pass as if on a GPU machine too.

CI has no GPU, so the tests that touch the Triton kernels, a backend choice or an engine run
once more in fresh pytest processes with REFIMPL_FAKE_CUDA=1 (see conftest.py): torch reports a CUDA
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


def run_as_if_on_a_gpu_machine(*args: str, part: str = "") -> subprocess.CompletedProcess:
    """A fresh pytest of `args` under REFIMPL_FAKE_CUDA; `part` "k/n" runs every n-th test."""
    env = dict(
        os.environ,
        REFIMPL_FAKE_CUDA="1",
        HYPOTHESIS_PROFILE="device-check",
        PYTHONPATH=str(ROOT),
        REFIMPL_RERUN_PART=part,
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
PROBE = "tests/test_device_probe.py"
#: The rerun goes in this many fresh processes, one test each, so that `make test`'s xdist
#: workers share it instead of one worker running it alone while the other runs out of work;
#: each process runs every RERUN_PARTS-th test (REFIMPL_RERUN_PART, see conftest.py).
RERUN_PARTS = 2


def failures_and_report(done: subprocess.CompletedProcess) -> tuple[list[str], str]:
    failed = re.findall(r"^FAILED (\S+?)(?: - |$)", done.stdout, flags=re.MULTILINE)
    return sorted(failed), done.stdout[-6000:] + done.stderr[-2000:]


@pytest.mark.slow  # reruns half of the device-sensitive tests in a fresh process
@pytest.mark.parametrize("part", range(RERUN_PARTS))
def test_kernel_and_engine_tests_pass_as_if_on_a_gpu_machine(part):
    """Every device-sensitive test passes as if on a GPU machine (every other one here)."""
    files = [
        str(path.relative_to(ROOT))
        for path in device_sensitive_test_files()
        if path.name != Path(PROBE).name
    ]
    done = run_as_if_on_a_gpu_machine("-rf", *files, part=f"{part}/{RERUN_PARTS}")
    failed, report = failures_and_report(done)
    assert failed == [], report
    assert done.returncode == 0 and re.search(r"^\d+ passed", done.stdout, re.MULTILINE), (
        report
    )


@pytest.mark.slow  # a fresh pytest
def test_the_rerun_fails_the_probes_tests_that_assume_the_cpu():
    """The four tests of `test_device_probe.py` that assume the CPU (they pass in the ordinary
    run) fail in the rerun, and its test that states every device passes: so the rerun does
    catch a test that assumes the CPU."""
    assert PROBE in [str(path.relative_to(ROOT)) for path in device_sensitive_test_files()]
    done = run_as_if_on_a_gpu_machine("-rf", PROBE)
    failed, report = failures_and_report(done)
    assert failed == sorted(f"{PROBE}::{name}" for name in ASSUMING_THE_CPU), report
    assert re.search(
        rf"^{len(ASSUMING_THE_CPU)} failed, 1 passed", done.stdout, re.MULTILINE
    ), report
    assert "does not take the `kernel_device` fixture" in done.stdout, report
