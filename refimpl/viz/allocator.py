"""Pictures of the hybrid allocator and of DeepSeek V4 addressing, each with a text twin.

- `draw_tables` / `tables_text`: one request's block table in every group (null blocks grey);
- `draw_pool` / `pool_text`: every block of the one pool, coloured by the group that owns it;
- `draw_blocks_over_time` / `blocks_over_time_text`: live blocks per group per step of a run;
- `draw_swa_window` / `swa_window_text`: which positions (and slots) a token's window reads;
- `draw_topk` / `topk_text`: compressed entries chosen by top-k and the slots they map to.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from refimpl.hybrid.addressing import slot_for_position

GROUP_COLORS = {
    "MLA": "#1f77b4",
    "SWA-a": "#2ca02c",
    "SWA-b": "#98df8a",
    "C128 state": "#c5b0d5",
    "C4 state": "#9467bd",
}
NULL_COLOR = "#d9d9d9"
FALLBACK_COLORS = ["#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]


def _color(label: str, i: int) -> str:
    return GROUP_COLORS.get(label, FALLBACK_COLORS[i % len(FALLBACK_COLORS)])


# --- block tables

def tables_text(manager, request_id: str, labels: Sequence[str]) -> str:
    """One line per group: the request's block ids, '.' for the null block."""
    width = max(len(label) for label in labels)
    lines = []
    for label, ids in zip(labels, manager.get_block_ids(request_id)):
        cells = " ".join("." if b == 0 else str(b) for b in ids) or "(empty)"
        lines.append(f"{label.ljust(width)} | {cells}")
    return "\n".join(lines)


def draw_tables(manager, request_id: str, labels: Sequence[str], title: str = "") -> Figure:
    """Each group's block table as a row of cells; null blocks are grey and empty."""
    tables = manager.get_block_ids(request_id)
    n = max([len(t) for t in tables] + [1])
    fig = Figure(figsize=(min(0.32 * n + 2.0, 16), 0.42 * len(tables) + 0.9))
    ax = fig.add_subplot()
    for row, (label, ids) in enumerate(zip(labels, tables)):
        for col, b in enumerate(ids):
            color = NULL_COLOR if b == 0 else _color(label, row)
            ax.add_patch(Rectangle((col, -row - 0.9), 0.95, 0.8, color=color))
            if b != 0:
                ax.text(col + 0.47, -row - 0.5, str(b), ha="center", va="center", fontsize=6)
    ax.set_xlim(0, n)
    ax.set_ylim(-len(tables), 0.1)
    ax.set_yticks([-r - 0.5 for r in range(len(tables))], list(labels), fontsize=8)
    ax.set_xlabel("logical block index (grey: null block, out of the window)", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(title or f"block tables of request {request_id}", fontsize=9)
    fig.tight_layout()
    return fig


# --- the pool

def _owners(manager, labels: Sequence[str], request_ids: Sequence[str]) -> list[str]:
    """Per pool block: the owning group's label, 'null', 'cached' (free, hashed) or 'free'."""
    pool = manager.block_pool
    owner = ["free"] * pool.num_gpu_blocks
    owner[0] = "null"
    for b in pool.blocks[1:]:
        if b.ref_cnt == 0 and b.block_hash is not None:
            owner[b.block_id] = "cached"
    for rid in request_ids:
        for label, ids in zip(labels, manager.get_block_ids(rid)):
            for b in ids:
                if b != 0:
                    owner[b] = label
    return owner


def pool_text(manager, labels: Sequence[str], request_ids: Sequence[str]) -> str:
    """Blocks per owner (groups, free and hashed, free, null) and the pool's usage."""
    owner = _owners(manager, labels, request_ids)
    parts = [f"{label}={owner.count(label)}" for label in labels]
    parts += [f"free(cached)={owner.count('cached')}", f"free={owner.count('free')}", "null=1"]
    return f"{len(owner)} blocks: " + ", ".join(parts) + f"; usage {manager.block_pool.get_usage():.3f}"


def draw_pool(manager, labels: Sequence[str], request_ids: Sequence[str], title: str = "", ncols: int | None = None) -> Figure:
    """All blocks of the pool as a grid (block 0 top left), coloured by owner."""
    owner = _owners(manager, labels, request_ids)
    kinds = list(labels) + ["cached", "free", "null"]
    colors = [_color(label, i) for i, label in enumerate(labels)] + ["#fdd0a2", "white", "black"]
    code = np.array([kinds.index(o) for o in owner])
    ncols = ncols or int(np.ceil(np.sqrt(len(code))))
    nrows = int(np.ceil(len(code) / ncols))
    grid = np.full(nrows * ncols, len(kinds) - 2)  # pad with "free" colour
    grid[: len(code)] = code
    fig = Figure(figsize=(6.5, 6.5 * nrows / ncols + 0.9))
    ax = fig.add_subplot()
    ax.imshow(grid.reshape(nrows, ncols), cmap=ListedColormap(colors), vmin=0, vmax=len(kinds) - 1, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    handles = [Patch(facecolor=c, edgecolor="#555555", label=k) for k, c in zip(kinds, colors)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    ax.set_title(title or f"one pool of {len(owner)} blocks, row by row", fontsize=9)
    fig.tight_layout()
    return fig


# --- blocks over time

def blocks_over_time_text(run) -> str:
    """One line per step: computed tokens, live blocks per group, total, free blocks."""
    header = "step phase    computed  " + "  ".join(f"{label:>10}" for label in run.labels) + "   total    free"
    lines = [header]
    for r in run.records:
        cells = "  ".join(f"{n:>10}" for n in r.live_blocks)
        lines.append(f"{r.step:>4} {r.phase:<8} {r.num_computed_tokens:>8}  {cells}  {r.total_live:>6}  {r.free_blocks:>6}")
    return "\n".join(lines)


def draw_blocks_over_time(run, title: str = "") -> Figure:
    """Stacked bars: live blocks of each group after every step of one request."""
    fig = Figure(figsize=(8, 3.6))
    ax = fig.add_subplot()
    steps = [r.step for r in run.records]
    bottom = np.zeros(len(steps))
    for g, label in enumerate(run.labels):
        values = np.array([r.live_blocks[g] for r in run.records])
        ax.bar(steps, values, bottom=bottom, color=_color(label, g), label=label, width=0.8)
        bottom += values
    ax.set_xlabel("step (prefill chunks, then decode tokens)")
    ax.set_ylabel("blocks held")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title or f"blocks per group of request {run.request.request_id}", fontsize=9)
    fig.tight_layout()
    return fig


# --- addressing

def swa_window_text(block_ids: Sequence[int], block_size: int, position: int, window: int) -> str:
    """The window of `position`: each position with its block and slot."""
    start = max(position - window + 1, 0)
    rows = [f"token at position {position}, window {window}: positions {start}..{position}"]
    for p in range(start, position + 1):
        j = p // block_size
        rows.append(f"  pos {p:>4} -> block_table[{j}] = {block_ids[j]:>3}, offset {p % block_size:>2} -> slot {slot_for_position(block_ids, p, block_size)}")
    return "\n".join(rows)


def draw_swa_window(block_ids: Sequence[int], block_size: int, position: int, window: int, title: str = "") -> Figure:
    """Positions 0..position as cells, one colour per block; the window is outlined, with slots."""
    n = position + 1
    start = max(position - window + 1, 0)
    fig = Figure(figsize=(min(0.42 * n + 1.5, 16), 2.0))
    ax = fig.add_subplot()
    for p in range(n):
        j = p // block_size
        inside = p >= start
        face = FALLBACK_COLORS[j % len(FALLBACK_COLORS)] if inside else NULL_COLOR
        ax.add_patch(Rectangle((p, 0), 0.95, 1, facecolor=face, edgecolor="black" if inside else "none", lw=0.6))
        ax.text(p + 0.47, 1.15, str(p), ha="center", fontsize=6)
        if inside:
            ax.text(p + 0.47, 0.5, str(slot_for_position(block_ids, p, block_size)), ha="center", va="center", fontsize=6, rotation=90)
    for j in range(0, n, block_size):
        ax.text(j + 0.1, -0.35, f"block {block_ids[j // block_size]}", fontsize=7)
    ax.set_xlim(0, n)
    ax.set_ylim(-0.6, 1.5)
    ax.axis("off")
    ax.set_title(title or f"window of the token at position {position} (numbers inside: slots)", fontsize=9)
    fig.tight_layout()
    return fig


def topk_text(mla_block_ids: Sequence[int], block_size: int, compress_ratio: int, position: int, local_topk: Sequence[int]) -> str:
    """Chosen compressed entries of a token and the slots they map to."""
    storage = block_size // compress_ratio
    usable = (position + 1) // compress_ratio
    rows = [f"token at position {position}, ratio {compress_ratio}: {usable} usable entries, {storage} per block"]
    for x in local_topk:
        if x < 0:
            continue
        rows.append(
            f"  entry {x:>3} (tokens {x * compress_ratio}..{x * compress_ratio + compress_ratio - 1}) -> "
            f"block_table[{x // storage}] = {mla_block_ids[x // storage]}, offset {x % storage} -> slot {slot_for_position(mla_block_ids, x, storage)}"
        )
    return "\n".join(rows)


def draw_topk(mla_block_ids: Sequence[int], block_size: int, compress_ratio: int, position: int, local_topk: Sequence[int], title: str = "") -> Figure:
    """Compressed entries 0..usable-1 (coloured by block); chosen ones are outlined with slots."""
    storage = block_size // compress_ratio
    usable = (position + 1) // compress_ratio
    chosen = {x for x in local_topk if x >= 0}
    fig = Figure(figsize=(min(0.42 * max(usable, 1) + 1.5, 16), 2.0))
    ax = fig.add_subplot()
    for x in range(usable):
        j = x // storage
        face = FALLBACK_COLORS[j % len(FALLBACK_COLORS)] if x in chosen else NULL_COLOR
        ax.add_patch(Rectangle((x, 0), 0.95, 1, facecolor=face, edgecolor="black" if x in chosen else "none", lw=0.6))
        ax.text(x + 0.47, 1.15, str(x), ha="center", fontsize=6)
        if x in chosen:
            ax.text(x + 0.47, 0.5, str(slot_for_position(mla_block_ids, x, storage)), ha="center", va="center", fontsize=6, rotation=90)
    for j in range(0, usable, storage):
        ax.text(j + 0.1, -0.35, f"block {mla_block_ids[j // storage]}", fontsize=7)
    ax.set_xlim(0, max(usable, 1))
    ax.set_ylim(-0.6, 1.5)
    ax.axis("off")
    ax.set_title(title or f"top-k entries of the token at position {position} (numbers inside: slots)", fontsize=9)
    fig.tight_layout()
    return fig
