"""`python -m refimpl plan` on DeepSeek V4: the packaged configs and the slab's views (grouping,
planner layout, byte offsets), text and JSON output, options, errors."""

import json
import subprocess
import sys

import pytest

from refimpl.__main__ import main

#: DeepSeek V4 Pro in 10 GiB, at a length one request fits in
PRO = ["--config", "deepseek-v4-pro", "--kv-cache-memory-bytes", "10GiB"]
PRO += ["--max-model-len", "8192"]


def view(capsys, *argv) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["deepseek_v4"]


def test_plan_pro_text(capsys):
    assert main(["plan", *PRO, "--layout", "B"]) == 0
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
    plan = view(capsys, *PRO, "--layout", "B")
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
        (["--config", "deepseek-v4-flash"], "approximate_gcd", 22),
        (["--grouping", "mla+swa"], "num_blocks", 4701),
        (["--num-gpu-blocks-override", "4000"], "num_blocks", 4000),
        (["--kv-cache-dtype", "bfloat16"], "block_stride", 2290688),
        (["--kv-cache-dtype", "fp8"], "block_stride", 1435968),
    ],
)
def test_plan_options(capsys, argv, key, value):
    assert view(capsys, *PRO, *argv)[key] == value


def test_plan_article_layout_says_what_it_leaves_out(capsys):
    assert main(["plan", *PRO, "--grouping", "mla+swa"]) == 0
    out = capsys.readouterr().out
    assert "plans 152 of them; 91 caches (the compressor states) are left out" in out
    assert "2,283,840 B (the widest group)" in out and "4,701 blocks" in out
    assert main(["plan", *PRO]) == 0 and "left out" not in capsys.readouterr().out


def test_plan_layout_c_is_the_default_and_lists_spec_runs(capsys):
    plan = view(capsys, *PRO)
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


def test_planner_c_rounds_a_512_token_stride_to_the_kernel_pages():
    """vLLM serves V4 with 256-token blocks only (the command refuses others); planner C's
    rounding at 512, where the 256-token kernel pages matter, is checked on the specs."""
    from refimpl.hybrid import deepseek_v4, older_planners
    from refimpl.hybrid.kv_cache_planning import get_kv_cache_config, get_kv_cache_groups

    specs = deepseek_v4.kv_cache_specs("pro", block_size=512)
    c = get_kv_cache_config(get_kv_cache_groups(specs), 20 << 30)
    # C rounds the stride up to a multiple of lcm(37,440, 1,728): the 256-token kernel pages
    assert c.block_stride == 2920320 and c.block_stride % 112320 == 0
    b = older_planners.get_kv_cache_config_b(
        older_planners.get_kv_cache_groups_b(specs), 20 << 30
    )
    assert b.block_stride == 2854080


def test_plan_all_offsets(capsys):
    assert main(["plan", *PRO, "--offsets", "-1", "--layout", "B", "--wide"]) == 0
    out = capsys.readouterr().out
    assert "more (--offsets" not in out
    assert len(out.split("distinct byte offsets in a block:\n")[1].strip().splitlines()) == 206


#: the Pro config at a length that fits, with no budget yet
PRO_NO_BUDGET = ["--config", "deepseek-v4-pro", "--max-model-len", "8192"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["--kv-cache-memory-bytes", "1KiB"],
            "the budget leaves no memory for KV cache blocks",
        ),
        (["--kv-cache-memory-bytes", "lots"], "cannot read memory size 'lots'"),
        (
            ["--kv-cache-memory-bytes", "-5GiB"],
            "argument --kv-cache-memory-bytes: memory size must not be negative, got '-5GiB'",
        ),
        (["--kv-cache-memory-bytes=-5GiB"], "memory size must not be negative"),
        (["--kv-cache-memory-bytes", "1e400GiB"], "cannot read memory size '1e400GiB'"),
        (["--kv-cache-memory-bytes", "99999999999999999999999999TiB"], "is more than 1 PiB"),
        (["--kv-cache-memory-bytes", "1.5"], "is not a whole number of bytes"),
        (["--block-size", "100"], "DeepSeek V4's kernels take 256-token blocks only"),
        (["--block-size", "0"], "argument --block-size: must be from 1 to"),
        (
            ["--num-gpu-blocks-override", "1"],
            "must be from 2 to 2,147,483,647 (block 0 is the null block; ids are int32)",
        ),
        (["--num-gpu-blocks-override", "10000000000000"], "must be from 2 to 2,147,483,647"),
        (["--num-gpu-blocks-override", "1e30"], "expected a whole number, got '1e30'"),
        (["--num-gpu-blocks-override", "True"], "expected a whole number, got 'True'"),
        (["--offsets", "-2"], "argument --offsets: must be from -1 to"),
        (["--offsets", "ten"], "argument --offsets: expected a whole number, got 'ten'"),
        (["--attention-backend", "flash_attn"], "runs only on its own sparse MLA backend"),
    ],
)
def test_plan_errors_are_one_line_naming_the_flag(capsys, argv, words):
    budget = (
        []
        if any(a.startswith("--kv-cache") for a in argv)
        else ["--kv-cache-memory-bytes", "10GiB"]
    )
    assert main(["plan", *PRO_NO_BUDGET, *budget, *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("python -m refimpl plan: error: ") and words in lines[0], lines[
        0
    ]
    for parameter in ("available_memory", "num_blocks_override", "block_size "):
        assert parameter not in lines[0]


def test_an_unknown_config_name_lists_the_packaged_ones(capsys):
    assert main(["plan", "--config", "deepseek-v4-max"]) == 2
    err = capsys.readouterr().err
    assert "deepseek-v4-flash, deepseek-v4-pro" in err


def test_plan_help_shows_defaults_without_markup(capsys):
    assert main(["plan", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
    for text in (
        "(default: NVIDIA H100 80GB HBM3)",  # the GPU planned for without a memory flag
        "(default: 0.9)",  # --gpu-memory-utilization, as vllm serve
        "(default: auto)",  # --kv-cache-dtype
        "(default: 1)",  # -tp
        "deepseek-v4-pro",
    ):
        assert text in out, text
    assert "`" not in out and "(default: None)" not in out and "(default: False)" not in out


def test_module_entry_point_runs():
    result = subprocess.run(
        [sys.executable, "-m", "refimpl", "plan", *PRO, "--json", "--offsets", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(result.stdout)["deepseek_v4"]["num_blocks"] == 7477


def test_plan_piped_into_a_reader_that_stops_early():
    # `true` exits at once, long before the plan is ready, so every write hits a closed pipe
    argv = " ".join(PRO)
    cmd = f"{sys.executable} -m refimpl plan {argv} --json --offsets -1 | true"
    result = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr


MTP = ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}']


def test_plan_mtp_marks_the_eagle_group(capsys):
    """--speculative-config with MTP adds V4's MTP layer (one SWA cache, registered last)
    and marks its group as the drafter's, as the old --mtp flag did."""
    plan = view(capsys, *PRO, *MTP, "--layout", "B")
    assert [g["is_eagle_group"] for g in plan["groups"]] == [False, False, True, False, False]
    assert [g["num_layers"] for g in plan["groups"]][1:3] == [31, 31]
    # planner C puts the two SWA groups first; the MTP layer's SWA cache lands in the second
    plan = view(capsys, *PRO, *MTP)
    assert [g["is_eagle_group"] for g in plan["groups"]] == [False, True, False, False, False]
    assert [g["num_layers"] for g in plan["groups"]] == [31, 31, 91, 31, 60]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["--speculative-config", '{"method": "eagle", "model": "x"}'],
            "method 'eagle' is not planned yet",
        ),
        (
            ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}'],
            "num_speculative_tokens 3 is not planned yet",
        ),
    ],
)
def test_speculative_settings_not_planned_are_refused_by_name(capsys, argv, words):
    assert main(["plan", *PRO, *argv]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and words in err[0], err


def test_mtp_needs_mtp_layers(capsys):
    from pathlib import Path

    llama = Path(__file__).parent / "data" / "configs" / "llama-3.1-8b"
    assert main(["plan", "--config", str(llama), "--kv-cache-memory-bytes", "20G", *MTP]) == 2
    assert "has no MTP layers" in capsys.readouterr().err
