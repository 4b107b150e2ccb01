"""Pictures for notebook 07 (kernels), each with a text twin that prints the same state.

- `draw_paged_layout` / `paged_layout_text`: which token of which sequence sits in each
  row of each physical block (what ``store_kvcache`` writes and the attention kernels read).
- `draw_prefill_mask` / `prefill_mask_text`: the causal mask of a prefill step whose first
  keys come from a cached prefix (queries aligned to the end of the context).
- `draw_reuse_by_block_size` / `reuse_by_block_size_text`: cached-prefix tokens a new
  prompt reuses at two block sizes (e.g. 16 versus flash-attn's minimum of 256).

Figures use `matplotlib.figure.Figure` (not pyplot), so nothing leaks or shows twice.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from refimpl.course.paged_scenarios import measure_reusable_prefix_tokens
from refimpl.viz.palette import EMPTY, SEQ_COLORS


def _check_layout(
    block_tables: Seq[Seq[int]], seq_lens: Seq[int], block_size: int, num_blocks: int
) -> None:
    if len(block_tables) != len(seq_lens):
        raise ValueError(
            f"{len(block_tables)} block tables but {len(seq_lens)} sequence lengths"
        )
    if block_size < 1 or num_blocks < 1:
        raise ValueError(
            f"block_size and num_blocks must be >= 1, got {block_size} and {num_blocks}"
        )
    for s, (table, n) in enumerate(zip(block_tables, seq_lens)):
        need = -(-n // block_size)
        if len(table) < need or any(not 0 <= b < num_blocks for b in table[:need]):
            raise ValueError(
                f"sequence {s} needs {need} valid block ids in [0, {num_blocks}), got "
                f"{list(table)}"
            )


def paged_layout(
    block_tables: Seq[Seq[int]], seq_lens: Seq[int], block_size: int, num_blocks: int
):
    """``cells[block][row] = (seq, position)`` or None, and each sequence's slot list."""
    _check_layout(block_tables, seq_lens, block_size, num_blocks)
    cells: list[list[tuple[int, int] | None]] = [
        [None] * block_size for _ in range(num_blocks)
    ]
    slots = []
    for s, (table, n) in enumerate(zip(block_tables, seq_lens)):
        seq_slots = []
        for t in range(n):
            block, row = table[t // block_size], t % block_size
            cells[block][row] = (s, t)
            seq_slots.append(block * block_size + row)
        slots.append(seq_slots)
    return cells, slots


def paged_layout_text(
    block_tables: Seq[Seq[int]], seq_lens: Seq[int], block_size: int, num_blocks: int
) -> str:
    """Text twin of `draw_paged_layout`: each sequence's slots, then each block's rows."""
    cells, slots = paged_layout(block_tables, seq_lens, block_size, num_blocks)
    lines = [
        f"block_size {block_size}, {num_blocks} blocks, slot = block_id * {block_size} + "
        "offset"
    ]
    for s, (table, seq_slots) in enumerate(zip(block_tables, slots)):
        lines.append(f"seq {s}: block_table {list(table)} -> slots {seq_slots}")
    for b, rows in enumerate(cells):
        text = " ".join("  .  " if c is None else f"s{c[0]}:t{c[1]:<2d}" for c in rows)
        lines.append(f"block {b:>2}: {text}".rstrip())
    return "\n".join(lines)


def draw_paged_layout(
    block_tables: Seq[Seq[int]], seq_lens: Seq[int], block_size: int, num_blocks: int
) -> Figure:
    """The physical cache as a grid (one row per block, one column per offset), tokens coloured
    by sequence."""
    cells, _ = paged_layout(block_tables, seq_lens, block_size, num_blocks)
    fig = Figure(figsize=(3.6 + 0.85 * block_size, 1.1 + 0.5 * num_blocks))
    ax = fig.add_subplot()
    for b, rows in enumerate(cells):
        for r, cell in enumerate(rows):
            color = EMPTY if cell is None else SEQ_COLORS[cell[0] % len(SEQ_COLORS)]
            ax.add_patch(Rectangle((r, b), 0.95, 0.9, facecolor=color, edgecolor="white"))
            label = (
                f"slot {b * block_size + r}"
                if cell is None
                else f"t{cell[1]}\nslot {b * block_size + r}"
            )
            ax.text(
                r + 0.47,
                b + 0.45,
                label,
                ha="center",
                va="center",
                fontsize=8,
                color="#555555" if cell is None else "white",
            )
    ax.set_xlim(0, block_size)
    ax.set_ylim(num_blocks, 0)
    ax.set_xticks(
        [r + 0.47 for r in range(block_size)], [str(r) for r in range(block_size)], fontsize=8
    )
    ax.set_yticks(
        [b + 0.45 for b in range(num_blocks)],
        [f"block {b}" for b in range(num_blocks)],
        fontsize=8,
    )
    ax.set_xlabel("offset in block (row)")
    handles = [
        Patch(color=SEQ_COLORS[s % len(SEQ_COLORS)], label=f"seq {s}: {list(t)}")
        for s, t in enumerate(block_tables)
    ]
    handles.append(Patch(color=EMPTY, label="free / unused"))
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
        fontsize=8,
        title="block tables",
    )
    ax.set_title(
        f"Paged KV cache (B = {block_size}): token t lives in\nblock block_table[t // B], row "
        "t % B",
        fontsize=9,
    )
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def prefill_mask(q_len: int, k_len: int) -> np.ndarray:
    """``mask[j, t]``: may query j (at position k_len - q_len + j) see key t? Shape ``[q_len,
    k_len]``."""
    if not 1 <= q_len <= k_len:
        raise ValueError(f"need 1 <= q_len <= k_len, got q_len={q_len}, k_len={k_len}")
    return np.arange(k_len)[None, :] <= np.arange(k_len - q_len, k_len)[:, None]


def prefill_mask_text(q_len: int, k_len: int) -> str:
    """Text twin of `draw_prefill_mask`: '#' where a query sees a key, '.' where it is
    masked."""
    mask = prefill_mask(q_len, k_len)
    cached = k_len - q_len
    lines = [
        f"{cached} cached keys + {q_len} new tokens; columns are key positions 0..{k_len - 1}"
    ]
    for j, row in enumerate(mask):
        text = "".join("#" if m else "." for m in row)
        lines.append(f"query {j} (position {cached + j:>2}): {text[:cached]}|{text[cached:]}")
    return "\n".join(lines)


def draw_prefill_mask(q_len: int, k_len: int) -> Figure:
    """Which keys each query of a prefill step sees, with the cached prefix shaded."""
    mask = prefill_mask(q_len, k_len)
    cached = k_len - q_len
    fig = Figure(figsize=(max(5.5, 2.8 + 0.32 * k_len), 1.3 + 0.32 * q_len))
    ax = fig.add_subplot()
    for j in range(q_len):
        for t in range(k_len):
            if mask[j, t]:
                color = "#8fb3d9" if t < cached else "#4c72b0"
            else:
                color = EMPTY
            ax.add_patch(Rectangle((t, j), 0.92, 0.88, facecolor=color, edgecolor="white"))
    ax.axvline(cached - 0.04, color="#c44e52", linewidth=1.5)  # where the cached prefix ends
    ax.set_xlim(0, k_len)
    ax.set_ylim(q_len, 0)
    ax.set_xticks([t + 0.46 for t in range(k_len)], [str(t) for t in range(k_len)], fontsize=8)
    ax.set_yticks(
        [j + 0.44 for j in range(q_len)],
        [f"q{j} @ {cached + j}" for j in range(q_len)],
        fontsize=8,
    )
    ax.set_xlabel("key position in the context")
    ax.legend(
        handles=[
            Patch(color="#8fb3d9", label="cached prefix key"),
            Patch(color="#4c72b0", label="key from this step"),
            Patch(color=EMPTY, label="masked (future)"),
            Line2D([], [], color="#c44e52", linewidth=1.5, label="end of the cached prefix"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
        fontsize=8,
    )
    ax.set_title(f"Prefill with a cached prefix: {q_len} queries, {k_len} keys", fontsize=9)
    fig.tight_layout()
    return fig


def reuse_by_block_size(
    prefix_lens: Seq[int], suffix_len: int, block_sizes: Seq[int]
) -> list[list[int]]:
    """Measured on a BlockManager: reused tokens for each prefix length (rows) and block size
    (columns)."""
    if suffix_len < 0:
        raise ValueError(f"suffix_len must be >= 0, got {suffix_len}")
    return [
        [measure_reusable_prefix_tokens(p, p + suffix_len, bs) for bs in block_sizes]
        for p in prefix_lens
    ]


def reuse_by_block_size_text(
    prefix_lens: Seq[int], suffix_len: int, block_sizes: Seq[int]
) -> str:
    """Text twin of `draw_reuse_by_block_size`."""
    table = reuse_by_block_size(prefix_lens, suffix_len, block_sizes)
    head = "shared prefix  " + "  ".join(f"{'reused@' + str(bs):>11}" for bs in block_sizes)
    lines = [f"prompt = shared prefix + {suffix_len} own tokens", head]
    for p, row in zip(prefix_lens, table):
        lines.append(f"{p:>13}  " + "  ".join(f"{r:>11d}" for r in row))
    totals = [sum(col) for col in zip(*table)]
    lines.append(
        f"{'total':>13}  "
        + "  ".join(f"{t:>11d}" for t in totals)
        + f"   of {sum(prefix_lens)} shared"
    )
    return "\n".join(lines)


def draw_reuse_by_block_size(
    prefix_lens: Seq[int], suffix_len: int, block_sizes: Seq[int]
) -> Figure:
    """Grouped bars: shared prefix length and the tokens actually reused at each block size."""
    table = np.array(reuse_by_block_size(prefix_lens, suffix_len, block_sizes))
    fig = Figure(figsize=(7, 3.6))
    ax = fig.add_subplot()
    x = np.arange(len(prefix_lens))
    width = 0.8 / (len(block_sizes) + 1)
    ax.bar(x, prefix_lens, width, color="#cccccc", label="shared prefix")
    for i, bs in enumerate(block_sizes):
        bars = ax.bar(
            x + (i + 1) * width,
            table[:, i],
            width,
            color=SEQ_COLORS[i % len(SEQ_COLORS)],
            label=f"reused, block size {bs}",
        )
        for rect, value in zip(bars, table[:, i]):
            ax.text(
                rect.get_x() + rect.get_width() / 2,
                value,
                str(value),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_xticks(x + width * len(block_sizes) / 2, [str(p) for p in prefix_lens])
    ax.set_xlabel(f"shared prefix length (prompt = prefix + {suffix_len} tokens)")
    ax.set_ylabel("tokens")
    ax.legend(fontsize=8)
    ax.set_title(
        "Prefix-cache reuse: whole blocks only, never the prompt's last block", fontsize=9
    )
    fig.tight_layout()
    return fig
