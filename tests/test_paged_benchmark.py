"""benchmarks/block_manager.py at toy sizes: it runs, and nano-vllm's deque free queue swapped
into the same BlockManager gives exactly the same workload (operation count and prefix hit
rate) as FreeBlockQueue."""

import argparse
import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "block_manager.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_block_manager", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_workload_is_the_same_with_either_free_queue(bench):
    args = argparse.Namespace(seed=0, prefixes=4, requests=60, concurrency=6)
    results = [
        bench.serving_workload(bench.make_manager(80, 4, queue), args)
        for queue in bench.QUEUES
    ]
    assert results[0]["ops"] == results[1]["ops"] > 60
    assert results[0]["hit_rate"] == results[1]["hit_rate"] > 0


@pytest.mark.parametrize("queue", ["FreeBlockQueue", "deque"])
def test_revival_and_queue_move_run(bench, queue):
    result = bench.revival(400, 4, queue, num_revivals=50, seed=0)
    assert result["count"] == 50 and result["us_per_revival"] > 0
    assert bench.queue_move(400, queue, num_moves=50, seed=0) > 0
