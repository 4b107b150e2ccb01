"""The V4 engine's figure and its text twins."""

from __future__ import annotations

import torch
from matplotlib.figure import Figure

from refimpl.v4.cache import build_kv_cache
from refimpl.v4.oracle import identity_tables
from refimpl.v4.tiny import tiny_v4_config_dict
from refimpl.viz.v4_engine import draw_hit_reads, hit_reads_text, slot_table_text

SUMMARY = {"hit": 256, "caches": {
    "layers.1.swa_cache": {"ratio": 1, "block_size": 64, "reused": list(range(192, 256)), "read": list(range(241, 256))},
    "layers.1.compressor.state_cache": {"ratio": 1, "block_size": 4, "reused": list(range(248, 256)), "read": [252, 253, 254, 255]},
    "layers.2.attn": {"ratio": 128, "block_size": 256, "reused": [0, 1], "read": [0, 1]},
    "layers.3.swa_cache": {"ratio": 1, "block_size": 64, "reused": [], "read": []},
}}


def test_slot_table_text_exact():
    kv = build_kv_cache(tiny_v4_config_dict(), 64)
    tables = identity_tables(kv, 128)
    text = slot_table_text(kv.layers[2], tables, [126, 127])
    lines = text.splitlines()
    assert lines[0].split() == ["position", "swa", "attn", "attn_state"]
    # HCA: position 127 closes entry 0, written to row 0 of the group-0 block 1 (2 entries per block)
    assert lines[2].split() == ["126", str(tables[1][1] * 64 + 62), "-", str(tables[4][15] * 8 + 6)]
    assert lines[3].split()[2] == f"e0->{tables[0][0] * 2}"


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
