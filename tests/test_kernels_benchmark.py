"""benchmarks/kernels_gpu.py keeps working: a polite exit without CUDA, and a smoke run of
every step on tiny shapes (in the interpreter here); benchmarks/kernels_cpu.py times the
chapters' kernels."""

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
def test_without_cuda_it_says_so_and_exits_zero(capsys):
    assert load_script().main([]) == 0
    assert "No CUDA device here" in capsys.readouterr().out


def test_smoke_run_checks_every_kernel_and_records_the_decode_timings(
    kernel_device, tmp_path, capsys
):
    """--smoke: tiny shapes wherever the kernels run here (the interpreter on a CPU, compiled
    on a GPU)."""
    record, figure = tmp_path / "kernels_gpu.json", tmp_path / "split.png"
    assert load_script().main(["--smoke", "--json", str(record), "--figure", str(figure)]) == 0
    out = capsys.readouterr().out
    assert out.count(" ok") == 3 and "FAIL" not in out  # one shape per dtype: fp16, bf16, fp32
    for line in (
        "== store_kvcache",
        "of copy bandwidth",
        "== paged decode",
        "x SDPA time",
        "Triton,  4 chunks",
        "Triton, automatic",
        "goals: within 2x of SDPA",
        "all kernels match",
    ):
        assert line in out
    import json

    saved = json.loads(record.read_text())
    (decode,) = saved["decode"]
    assert (
        decode["batch"],
        decode["context"],
        decode["num_heads"],
        decode["num_kv_heads"],
    ) == (2, 40, 4, 2)
    assert (
        set(decode["sweep_ms"]) == {"1", "2", "4", "8", "16", "32"}
        and decode["unsplit_ms"] == decode["sweep_ms"]["1"]
    )
    # K and V, batch 2, 40 tokens, 2 KV heads, dim 16, fp16
    assert decode["kv_bytes"] == 2 * 2 * 40 * 2 * 16 * 2
    assert decode["max_abs_error"] < 2e-3
    assert figure.stat().st_size > 0


def test_cpu_benchmark_times_every_chapter_kernel(kernel_device, capsys):
    """benchmarks/kernels_cpu.py prints the interpreter/twin times that chapters 07 and 11
    leave out."""
    spec = importlib.util.spec_from_file_location(
        "kernels_cpu_benchmark", SCRIPT.with_name("kernels_cpu.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for name in (
        "store_kvcache, 17 tokens",
        "paged_decode_attention, 2 sequences",
        "compute_swa_indices_and_lens, 5 tokens",
    ):
        line = next(line for line in out.splitlines() if line.startswith(name))
        assert line.rstrip().endswith("x") and len(line.split()) >= 4
