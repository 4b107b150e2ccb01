"""The redrawn allocator figures: per-group block widths on a token axis, legends only for what
is drawn."""

from __future__ import annotations

from refimpl.course import hybrid_simulate
from refimpl.hybrid.kv_cache_manager import KVCacheManager
from refimpl.viz.allocator import draw_swa_window, draw_tables, draw_topk


def legend_labels(fig) -> list[str]:
    return [text.get_text() for text in fig.axes[0].get_legend().get_texts()]


def test_block_tables_share_one_token_axis():
    manager = KVCacheManager(
        hybrid_simulate.mini_v4_groups(), num_blocks=64, max_model_len=256
    )
    request = manager.make_request("A", hybrid_simulate.prompt_tokens(40, seed=1))
    hybrid_simulate.schedule_step(manager, request, 16)
    hybrid_simulate.schedule_step(manager, request, 16)
    ax = draw_tables(manager, "A", hybrid_simulate.MINI_V4_LABELS).axes[0]
    # every group's table spans the same 32 token positions
    assert ax.get_xlim() == (0.0, 32.0)
    widths = sorted({round(p.get_width()) for p in ax.patches})
    assert widths == [1, 2, 4, 16]  # one cell per block, as wide as its group's block size
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("31") == 1 and all(t.get_fontsize() >= 8 for t in ax.texts)


def test_window_and_topk_legends_list_only_drawn_blocks():
    fig = draw_swa_window([5, 9, 3], block_size=4, position=10, window=6)
    assert legend_labels(fig) == [
        "block_table[1] = block 9",
        "block_table[2] = block 3",
        "outside the window",
    ]
    assert all(t.get_fontsize() >= 8 for t in fig.axes[0].texts)
    slots = {t.get_text() for t in fig.axes[0].texts}
    # 20 = slot of position 0, outside
    assert {"37", "38", "39", "12", "13", "14"} <= slots and "20" not in slots
    fig = draw_topk(
        [7, 3], block_size=16, compress_ratio=4, position=27, local_topk=[0, 2, 5, -1]
    )
    assert legend_labels(fig) == [
        "block_table[0] = block 7",
        "block_table[1] = block 3",
        "usable, not chosen",
    ]
    assert {"28", "30", "13"} <= {t.get_text() for t in fig.axes[0].texts}
