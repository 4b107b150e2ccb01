"""benchmarks/kernels_gpu.py keeps working: a polite exit without CUDA, and a CPU smoke run of every step."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # runs the kernel benchmark script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "kernels_gpu.py"


def load_script():
    spec = importlib.util.spec_from_file_location("kernels_gpu_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_without_cuda_it_says_so_and_exits_zero(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["kernels_gpu.py"])
    assert load_script().main() == 0
    assert "No CUDA device here" in capsys.readouterr().out


def test_smoke_run_on_cpu_checks_every_kernel(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["kernels_gpu.py", "--smoke-on-cpu"])
    assert load_script().main() == 0
    out = capsys.readouterr().out
    assert out.count(" ok") == 3 and "FAIL" not in out  # one shape per dtype: fp16, bf16, fp32
    for line in ("== store_kvcache", "of copy bandwidth", "== paged decode", "x SDPA time", "all kernels match"):
        assert line in out


def test_cpu_benchmark_times_every_chapter_kernel(kernel_device, capsys):
    """benchmarks/kernels_cpu.py prints the interpreter/twin times that chapters 07 and 11 leave out."""
    spec = importlib.util.spec_from_file_location("kernels_cpu_benchmark", SCRIPT.with_name("kernels_cpu.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for name in ("store_kvcache, 17 tokens", "paged_decode_attention, 2 sequences", "compute_swa_indices_and_lens, 5 tokens"):
        line = next(line for line in out.splitlines() if line.startswith(name))
        assert line.rstrip().endswith("x") and len(line.split()) >= 4
