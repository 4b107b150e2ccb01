"""`python -m refimpl plan`: text and JSON output, options, errors."""

import json
import re
import subprocess
import sys

import pytest

from refimpl.__main__ import main


def test_plan_pro_text(capsys):
    assert (
        main(["plan", "--model", "deepseek-v4-pro", "--memory", "10GiB", "--layout", "B"]) == 0
    )
    out = capsys.readouterr().out
    for text in (
        "approximate gcd d = 31",
        "1,435,968",
        "1,160,640",
        "1,123,200",
        "1,017,792",
        "1,244,160",
        "block stride: 1,435,968 B",
        "7,477 blocks (7,476 usable",
        "206 distinct byte offsets",
        "12,096  layers.2.attn",
        "... 196 more",
    ):
        assert text in out, text


def test_plan_json_is_complete(capsys):
    assert (
        main(
            [
                "plan",
                "--model",
                "deepseek-v4-pro",
                "--memory",
                "10GiB",
                "--json",
                "--layout",
                "B",
            ]
        )
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert plan["layer_tuples_per_bucket"] == [31, 61, 31, 30]
    assert [g["width_bytes"] for g in plan["groups"]] == [
        1435968,
        1160640,
        1123200,
        1017792,
        1244160,
    ]
    assert (plan["block_stride"], plan["num_blocks"], plan["num_usable_blocks"]) == (
        1435968,
        7477,
        7476,
    )
    assert len(plan["offsets"]) == 206 and plan["offsets"][1] == {
        "offset": 1728,
        "shared_by": ["layers.1.attn"],
        "layer_stride": None,
    }
    assert sum(g["num_layers"] for g in plan["groups"]) == 243


@pytest.mark.parametrize(
    "argv, key, value",
    [
        (["--model", "deepseek-v4-flash"], "approximate_gcd", 22),
        (["--indexer", "fp4"], "num_blocks", 8165),
        (["--grouping", "mla+swa"], "num_blocks", 4701),
        (["--num-blocks", "12"], "num_blocks", 12),
        (["--cache-dtype", "bfloat16"], "block_stride", 2290688),
        (["--cache-dtype", "fp8"], "block_stride", 1435968),
        (["--block-size", "512", "--memory", "20GiB"], "block_size", 512),
    ],
)
def test_plan_options(capsys, argv, key, value):
    assert main(["plan", *argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[key] == value


def test_plan_article_layout_says_what_it_leaves_out(capsys):
    assert main(["plan", "--grouping", "mla+swa"]) == 0
    out = capsys.readouterr().out
    assert "plans 152 of them; 91 caches (the compressor states) are left out" in out
    assert "2,283,840 B (the widest group)" in out and "4,701 blocks" in out
    assert main(["plan"]) == 0 and "left out" not in capsys.readouterr().out


def test_plan_mtp_marks_the_eagle_group(capsys):
    assert main(["plan", "--mtp", "--json", "--layout", "B"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [g["is_eagle_group"] for g in plan["groups"]] == [False, False, True, False, False]
    assert [g["num_layers"] for g in plan["groups"]][1:3] == [31, 31]
    # planner C puts the two SWA groups first; the MTP layer's SWA cache lands in the second
    assert main(["plan", "--mtp", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [g["is_eagle_group"] for g in plan["groups"]] == [False, True, False, False, False]
    assert [g["num_layers"] for g in plan["groups"]] == [31, 31, 91, 31, 60]


def test_plan_layout_c_is_the_default_and_lists_spec_runs(capsys):
    assert main(["plan", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["layout"] == "C" and plan["grouping"] == "grouped"
    assert [g["width_bytes"] for g in plan["groups"]] == [
        1160640,
        1123200,
        1435968,
        1017792,
        1244160,
    ]
    assert (plan["block_stride"], plan["num_blocks"]) == (1435968, 7477)
    # one tensor per (group, spec run): SWA-a, SWA-b, MLA x3 (ratio 128, indexer, ratio 4),
    # C128 state, C4 state x2
    assert [
        (t["offset"], len(t["shared_by"]), t["layer_stride"]) for t in plan["offsets"]
    ] == [
        (0, 31, 37440),
        (0, 30, 37440),
        (0, 31, 1728),
        (53568, 30, 8640),
        (312768, 30, 37440),
        (0, 31, 32832),
        (0, 30, 8640),
        (259200, 30, 32832),
    ]
    assert main(["plan", "--block-size", "512", "--memory", "20GiB", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    # C rounds the stride up to a multiple of lcm(37,440, 1,728): the 256-token kernel pages
    assert plan["block_stride"] == 2920320 and plan["block_stride"] % 112320 == 0
    assert (
        main(["plan", "--block-size", "512", "--memory", "20GiB", "--json", "--layout", "B"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["block_stride"] == 2854080


def test_plan_all_offsets(capsys):
    assert main(["plan", "--offsets", "-1", "--layout", "B"]) == 0
    out = capsys.readouterr().out
    assert "more (--offsets" not in out
    listing = out.split("distinct byte offsets in a block:\n")[1].splitlines()
    # one row per offset (a long row folds onto indented lines of its own)
    assert sum(1 for line in listing if re.match(r"  +[\d,]+  \S", line)) == 206
    assert max(len(line) for line in out.splitlines()) <= 95


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["--memory", "1KiB"],
            "--memory 1,024 B leaves no usable block: one block takes 1,435,968 B",
        ),
        # one block fits, but it is the null block
        (["--memory", "2871935"], "so give at least 2,871,936 B"),
        (["--memory", "lots"], "argument --memory: cannot read memory size 'lots'"),
        (
            ["--memory", "-5GiB"],
            "argument --memory: memory size must not be negative, got '-5GiB'",
        ),
        (["--memory=-5GiB"], "argument --memory: memory size must not be negative"),
        (
            ["--memory", "1e400GiB"],
            "argument --memory: memory size '1e400GiB' is more than 1 PiB",
        ),
        (["--memory", "99999999999999999999999999TiB"], "is more than 1 PiB"),
        (["--memory", "1.5"], "is not a whole number of bytes"),
        (["--block-size", "100"], "--block-size must be a positive multiple of 128"),
        (["--block-size", "0"], "argument --block-size: must be at least 1"),
        (
            ["--num-blocks", "1"],
            "argument --num-blocks: must be at least 2 (block 0 is the null block",
        ),
        (["--num-blocks", "-3"], "argument --num-blocks: must be at least 2"),
        (["--num-blocks", "10000000000000"], "--num-blocks 10,000,000,000,000 needs"),
        (
            ["--offsets", "-2"],
            "argument --offsets: must be at least -1 (-1 prints all), got -2",
        ),
        (["--offsets", "ten"], "argument --offsets: expected a whole number, got 'ten'"),
        (
            ["--model", "llama"],
            "invalid choice: 'llama' (choose from 'deepseek-v4-flash', 'deepseek-v4-pro')",
        ),
    ],
)
def test_plan_errors_are_one_line_naming_the_flag(capsys, argv, words):
    assert main(["plan", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("python -m refimpl plan: error: ") and words in lines[0], lines[
        0
    ]
    for parameter in ("available_memory", "num_blocks_override", "block_size "):
        assert parameter not in lines[0]


def test_plan_help_shows_defaults_without_markup(capsys):
    assert main(["plan", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
    for text in (
        "(default: 10GiB)",
        "256 by default",  # --block-size: 256 for --model, vLLM's choice for --config
        "(default: deepseek-v4-pro)",
        "(default: 10)",
        "(default: 0.9)",  # --gpu-memory-utilization, as vllm serve
        "(default: auto)",  # --kv-cache-dtype
    ):
        assert text in out, text
    assert "`" not in out and "(default: None)" not in out and "(default: False)" not in out


def test_module_entry_point_runs():
    result = subprocess.run(
        [sys.executable, "-m", "refimpl", "plan", "--json", "--offsets", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(result.stdout)["num_blocks"] == 7477


def test_plan_piped_into_a_reader_that_stops_early():
    # `true` exits at once, long before the plan is ready, so every write hits a closed pipe
    cmd = f"{sys.executable} -m refimpl plan --json --offsets -1 | true"
    result = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr
