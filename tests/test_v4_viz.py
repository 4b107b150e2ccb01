"""The V4 engine's figure and its text twins."""

from __future__ import annotations

import torch
from matplotlib.figure import Figure

from refimpl.course.v4_layer_checks import identity_tables
from refimpl.v4.cache import build_kv_cache
from refimpl.v4.tiny import tiny_v4_config_dict
from refimpl.viz.v4_engine import draw_hit_reads, hit_reads_text, slot_table_text

SUMMARY = {
    "hit": 256,
    "caches": {
        "layers.1.swa_cache": {
            "ratio": 1,
            "block_size": 64,
            "reused": list(range(192, 256)),
            "read": list(range(241, 256)),
        },
        "layers.1.compressor.state_cache": {
            "ratio": 1,
            "block_size": 4,
            "reused": list(range(248, 256)),
            "read": [252, 253, 254, 255],
        },
        "layers.2.attn": {"ratio": 128, "block_size": 256, "reused": [0, 1], "read": [0, 1]},
        "layers.3.swa_cache": {"ratio": 1, "block_size": 64, "reused": [], "read": []},
    },
}


def test_slot_table_text_exact():
    kv = build_kv_cache(tiny_v4_config_dict(), 64)
    tables = identity_tables(kv, 128)
    text = slot_table_text(kv.layers[2], tables, [126, 127])
    lines = text.splitlines()
    assert lines[0].split() == ["position", "swa", "attn", "attn_state"]
    # HCA: position 127 closes entry 0, written to row 0 of the attention group's block 0 (2
    # entries per block); each cache is addressed by its own group's table, wherever the
    # planner put that group
    hca = kv.layers[2]
    swa, attn, state = (
        tables[hca.swa.group],
        tables[hca.attn.group],
        tables[hca.attn_state.group],
    )
    assert lines[2].split() == ["126", str(swa[1] * 64 + 62), "-", str(state[15] * 8 + 6)]
    assert lines[3].split()[2] == f"e0->{attn[0] * 2}"


def test_hit_reads_text_and_figure():
    text = hit_reads_text(SUMMARY, layers=[1, 2])
    assert text.splitlines()[0] == "prefix hit: 256 tokens"
    assert "L1 window kv" in text and "241..255" in text and "L3" not in text
    assert "L2 c128 entries" in text
    fig = draw_hit_reads(SUMMARY, layers=[1, 2])
    assert isinstance(fig, Figure)
    assert len(fig.axes[0].get_yticklabels()) == 3
    assert hit_reads_text(SUMMARY, layers=[1, 2]) == text  # deterministic
    assert torch.get_num_threads() >= 1


def test_engine_stepper_frames_equal_a_fresh_engine_stepped_by_hand():
    from refimpl.paged.sequence import SamplingParams
    from refimpl.v4.llm import V4LLM
    from refimpl.viz.stepper import Stepper, record_frames
    from refimpl.viz.v4_engine import draw_engine_state, engine_snapshot, engine_state_text
    from tests.v4_models import hf_model, model_dir, prompts

    sp = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    names = ["A", "B", "C"]

    def fresh():
        llm = V4LLM(
            model_dir("A"),
            hf_model=hf_model("A"),
            num_kvcache_blocks=160,
            max_num_batched_tokens=64,
        )
        return llm, [llm.add_request(prompts()[p], sp) for p in ("P1", "P2", "P3")]

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    again, reqs2 = fresh()
    states = [engine_snapshot(again, reqs2, names)]
    while not again.is_finished():
        again.step()
        states.append(engine_snapshot(again, reqs2, names))
    llm, reqs = fresh()
    frames = record_frames(
        lambda: engine_snapshot(llm, reqs, names),
        [(f"step {i + 1}", llm.step) for i in range(len(states) - 1)],
    )
    stepper = Stepper(frames, draw_engine_state, engine_state_text)
    torch.set_num_threads(before)
    assert [f.state for f in stepper.frames] == states
    assert all(status == "finished" for _, status, *_ in states[-1][0])
    assert isinstance(stepper.figure(3), Figure)


def test_engine_state_text_fits_a_laptop():
    """One line per request within 95 columns, even with three-digit counts and five groups
    (chapter 13's strip printed lines of 108 characters)."""
    from refimpl.viz.v4_engine import engine_state_text

    rows = (("A", "running", 276, 256, 2, (2, 2, 1, 24, 18)),) * 2
    text = engine_state_text((rows, 123))
    assert max(len(line) for line in text.splitlines()) <= 95
    assert text.splitlines()[0] == (
        "A: running  prompt 276, kv computed or cached 256, generated 2, "
        "live blocks/group 2/2/1/24/18"
    )
