"""`python -m refimpl simulate`: plan's flags, the report, --json, --sweep and --plot."""

from __future__ import annotations

import json

import pytest

from refimpl.__main__ import main

CONFIG = "tests/data/configs/llama-3.1-8b"


@pytest.fixture
def trace(tmp_path):
    """Three users behind one system prompt, arriving 10 ms apart, two turns each."""
    lines = []
    for turn in range(2):
        for user in range(3):
            segments = [["system", 300], [f"user{user}-t0", 100]]
            if turn:
                segments.append([f"user{user}-t1", 60])
            lines.append(
                {"timestamp": 10 * (3 * turn + user), "segments": segments, "output_length": 8}
            )
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def run(capsys, *argv):
    code = main(["simulate", "--config", CONFIG, "--max-model-len", "4096", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_report_fits_100_columns_and_names_each_figure(capsys, trace):
    code, out, err = run(capsys, "--trace", trace, "--kv-cache-memory-bytes", "1G")
    assert code == 0 and err == ""  # no progress bar when stderr is not a terminal
    assert max(len(line) for line in out.splitlines()) <= 100
    for words in (
        "Prefix-cache hits",
        "Upper bound",
        "Preemptions",
        "Waiting",
        "KV cache usage",
        "Batches",
        "Throughput",
        "roofline estimate on NVIDIA H100 80GB HBM3",
    ):
        assert words in out


def test_json_hits_match_the_trace(capsys, trace):
    code, out, _ = run(
        capsys,
        "--trace",
        trace,
        "--kv-cache-memory-bytes",
        "1G",
        "--clock",
        "arrivals",
        "--json",
    )
    data = json.loads(out)
    assert code == 0
    # turn 0: users 1 and 2 reuse the 300-token system prompt (18 blocks of 16 = 288);
    # turn 1: each user reuses its whole first turn (400 tokens = 25 blocks)
    assert data["upper_bound_tokens"] == 2 * 300 + 3 * 400
    assert data["hit_tokens"] == 2 * 288 + 3 * 400
    assert data["waiting_seconds_mean"] is None  # arrival order has no time
    assert data["num_requests"] == 6


def test_sweep_prints_a_row_per_value_and_plots(capsys, trace, tmp_path):
    png = tmp_path / "sweep.png"
    code, out, _ = run(
        capsys,
        "--trace",
        trace,
        "--kv-cache-memory-bytes",
        "1G",
        "--sweep",
        "block-size=16,32",
        "--plot",
        str(png),
    )
    assert code == 0
    rows = out.splitlines()
    assert rows[0].split()[0] == "--block-size" and len(rows) == 4
    assert [r.split()[0] for r in rows[2:]] == ["16", "32"]
    # a 32-token block keeps one block less of the system prompt (288 -> 288, 400 -> 384)
    assert rows[2].split()[1] != rows[3].split()[1]
    assert png.stat().st_size > 1000


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--plot", "x.png"], "--plot draws a --sweep"),
        (["--sweep", "max-num-seqs"], "--sweep takes FLAG=V1,V2"),
        (["--sweep", "max-num-seqs=4,x"], "--sweep --max-num-seqs x"),
        (["--trace-file", "x"], "did you mean --trace"),
    ],
)
def test_bad_flags_get_one_line(capsys, trace, argv, words):
    code, out, err = run(capsys, "--trace", trace, *argv)
    assert code == 2 and out == ""
    assert words in err and err.count("\n") == 1


def test_a_pasted_serve_command_with_vllm_spellings_plans_the_same(capsys, trace):
    code, out, _ = run(capsys, "--trace", trace, "--kv-cache-memory-bytes", "1G", "--json")
    pasted = main(
        ["simulate", "--trace", trace, "--json", "--", "vllm", "serve", CONFIG]
        + ["--max_model_len", "4096", "--kv-cache-memory-bytes", "1G"]
    )
    again, _ = capsys.readouterr()
    assert code == pasted == 0
    assert json.loads(out) == json.loads(again)


#: granite-4.0-h's layout at small scale: 48-token blocks on an H100 (the real model's are 400)
TINY_MAMBA_HYBRID = "tests/data/configs/tiny-granite-h"


def simulate_json(capsys, *argv, config: str = TINY_MAMBA_HYBRID) -> dict:
    code = main(["simulate", "--config", config, "--json", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_a_mamba_hybrid_runs_with_and_without_prefix_caching(capsys, trace):
    """Mamba states are allocated: with prefix caching (vLLM's "align") the shared system
    prompt hits; without it ("none", one state per request) nothing does. vLLM 0.32 derives
    the mode from prefix caching, so `--mamba-cache-mode none` alone changes nothing."""
    base = ["--trace", trace, "--max-model-len", "4096", "--kv-cache-memory-bytes", "1G"]
    on = simulate_json(capsys, *base)
    off = simulate_json(capsys, *base, "--no-enable-prefix-caching")
    mode_none = simulate_json(capsys, *base, "--mamba-cache-mode", "none")
    assert 0 < on["hit_tokens"] <= on["upper_bound_tokens"]
    assert off["hit_tokens"] == 0 and off["upper_bound_tokens"] == on["upper_bound_tokens"]
    assert mode_none == on


@pytest.mark.slow
def test_a_mamba_hybrid_replays_the_mooncake_slice(capsys):
    """The shipped Mooncake slice on granite-4.0-h-tiny (400-token blocks), prefix caching on
    and off (about 4 s each)."""
    base = ["--trace", "refimpl/sched/data/mooncake_conversation_slice.jsonl"]
    base += ["--max-model-len", "131072", "--kv-cache-memory-bytes", "4G"]
    config = "tests/data/configs/granite-4.0-h-tiny"
    on = simulate_json(capsys, *base, config=config)
    off = simulate_json(capsys, *base, "--no-enable-prefix-caching", config=config)
    assert on["num_requests"] == off["num_requests"] == 100
    assert 0 < on["hit_tokens"] <= on["upper_bound_tokens"]
    assert off["hit_tokens"] == 0


def test_the_plan_line_names_the_attention_block_not_the_scheduler_block(capsys, trace):
    """Without prefix caching a Mamba state block spans max_model_len, so the scheduler's
    block (the lcm) is 4,096 tokens; the report names the block `plan` prints (48 tokens)."""
    base = ["simulate", "--config", TINY_MAMBA_HYBRID, "--trace", trace]
    base += ["--max-model-len", "4096", "--kv-cache-memory-bytes", "1G"]
    assert main([*base, "--no-enable-prefix-caching"]) == 0
    out, _ = capsys.readouterr()
    assert "blocks of 48 tokens (" in out and "blocks of 4096" not in out


def test_prompts_of_max_model_len_are_refused_as_vllm_refuses_them(capsys, trace):
    """vLLM's input processor refuses a prompt of max_model_len tokens or more (the server
    answers with an error): the second turns (460 tokens) are left out at 460 and counted;
    the hits and the upper bound are the first turns' (the 300-token system prompt, twice)."""
    base = ["--trace", trace, "--kv-cache-memory-bytes", "1G", "--max-model-len"]
    code, out, _ = run(capsys, *base, "460", "--json")
    assert code == 0
    s = json.loads(out)
    assert (s["num_requests"], s["refused_requests"]) == (3, 3)
    assert s["prompt_tokens"] == 3 * 400 and s["upper_bound_tokens"] == 2 * 300
    code, out, _ = run(capsys, *base, "461", "--json")
    assert json.loads(out)["refused_requests"] == 0
    code, out, _ = run(capsys, *base, "460")
    assert "6 requests, 3 served, 1,200 prompt tokens" in out
    assert "Refused    3 requests with prompts of max-model-len (460) tokens or more" in out
    code, _, err = run(capsys, *base, "400")
    assert code == 2 and "vLLM would refuse them all" in err
