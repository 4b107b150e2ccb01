"""benchmarks/v4_engine.py runs end to end and reports equal tokens and the prefix-cache
saving."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import torch

from tests.v4_models import model_dir

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "v4_engine.py"


def test_benchmark_smoke(monkeypatch, capsys):
    before = torch.get_num_threads()
    monkeypatch.setattr(
        sys,
        "argv",
        [
            str(SCRIPT),
            "--model-dir",
            model_dir("A"),
            "--num-prompts",
            "2",
            "--max-tokens",
            "2",
        ],
    )
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        torch.set_num_threads(before)
    out = capsys.readouterr().out
    assert "tokens equal: True" in out
    off = next(line for line in out.splitlines() if "prefix caching off" in line)
    on = next(line for line in out.splitlines() if "prefix caching on" in line)
    assert "taken from the cache     0" in off
    # the one request after the first reuses 256 tokens
    assert "taken from the cache   256" in on
