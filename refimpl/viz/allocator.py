"""Pictures of the hybrid allocator and of DeepSeek V4 addressing, each with a text twin.

- `draw_tables` / `tables_text`: one request's block table in every group (null blocks grey);
- `draw_pool` / `pool_text`: every block of the one pool, coloured by the group that owns it;
- `draw_blocks_over_time` / `blocks_over_time_text`: live blocks per group per step of a run;
- `draw_swa_window` / `swa_window_text`: which positions (and slots) a token's window reads;
- `draw_topk` / `topk_text`: compressed entries chosen by top-k and the slots they map to;
- `draw_retention` / `retention_text`: which sliding-window checkpoints each retention setting
  keeps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from refimpl.hybrid.addressing import slot_for_position
from refimpl.viz.hybrid_stepper import allocator_state, draw_allocator_state
from refimpl.viz.palette import (
    EMPTY,
    FALLBACK_COLORS,
    MAX_WIDTH,
    NULL_COLOR,
    fits,
    group_color,
)

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
    """Each group's block table on one shared *token* axis: a cell spans its block's tokens.

    Groups have different block sizes, so logical block j of one group and of another cover
    different tokens; drawing every cell `block_size` tokens wide keeps each column one token
    position. Null blocks are grey and marked '.'.
    """
    tables = manager.get_block_ids(request_id)
    sizes = [m.block_size for m in manager.coordinator.single_type_managers]
    tokens = max([len(t) * bs for t, bs in zip(tables, sizes)] + [1])
    width = min(0.26 * tokens + 2.2, MAX_WIDTH)
    token_pt = (width - 2.2) * 72 / tokens  # how wide one token position is drawn
    fig = Figure(figsize=(width, 0.5 * len(tables) + 1.1))
    ax = fig.add_subplot()
    for row, (label, ids, bs) in enumerate(zip(labels, tables, sizes)):
        for col, b in enumerate(ids):
            color = NULL_COLOR if b == 0 else group_color(label, row)
            ax.add_patch(
                Rectangle(
                    (col * bs, -row - 0.9),
                    bs,
                    0.8,
                    facecolor=color,
                    edgecolor="black",
                    lw=0.6,
                    hatch="//" if b == 0 else None,
                )
            )
            # too narrow a cell shows its colour only
            if b != 0 and fits(str(b), bs * token_pt):
                ax.text(
                    col * bs + bs / 2, -row - 0.5, str(b), ha="center", va="center", fontsize=8
                )
    ax.set_xlim(0, tokens)
    ax.set_ylim(-len(tables), 0.1)
    ax.set_yticks(
        [-r - 0.5 for r in range(len(tables))],
        [f"{label} ({bs} tok/block)" for label, bs in zip(labels, sizes)],
        fontsize=8,
    )
    ax.set_xlabel(
        "token position (each cell is one block, as wide as its group's block size; "
        "grey, hatched: null block)",
        fontsize=8,
    )
    ax.tick_params(axis="x", labelsize=8)
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
    return (
        f"{len(owner)} blocks: "
        + ", ".join(parts)
        + f"; usage {manager.block_pool.get_usage():.3f}"
    )


def draw_pool(
    manager,
    labels: Sequence[str],
    request_ids: Sequence[str],
    title: str = "",
    ncols: int | None = None,
) -> Figure:
    """All blocks of the pool as a grid of bordered cells (block 0 top left): id, owner, queue
    ends.

    The same picture as a frame of `refimpl.viz.hybrid_stepper`, for one moment.
    """
    state = allocator_state(manager, labels, request_ids)
    return draw_allocator_state(state, ncols or 16, title=title)


# --- blocks over time


def blocks_over_time_text(run) -> str:
    """One line per step: computed tokens, live blocks per group, total, free blocks."""
    header = (
        "step phase    computed  "
        + "  ".join(f"{label:>10}" for label in run.labels)
        + "   total    free"
    )
    lines = [header]
    for r in run.records:
        cells = "  ".join(f"{n:>10}" for n in r.live_blocks)
        lines.append(
            f"{r.step:>4} {r.phase:<8} {r.num_computed_tokens:>8}  {cells}  {r.total_live:>6} "
            f" {r.free_blocks:>6}"
        )
    return "\n".join(lines)


def draw_blocks_over_time(run, title: str = "") -> Figure:
    """Stacked bars: live blocks of each group after every step of one request."""
    fig = Figure(figsize=(MAX_WIDTH - 1.0, 3.6))  # the legend right of the axes takes the rest
    ax = fig.add_subplot()
    steps = [r.step for r in run.records]
    bottom = np.zeros(len(steps))
    for g, label in enumerate(run.labels):
        values = np.array([r.live_blocks[g] for r in run.records])
        ax.bar(
            steps, values, bottom=bottom, color=group_color(label, g), label=label, width=0.8
        )
        bottom += values
    ax.set_xlabel("step (prefill chunks, then decode tokens)")
    ax.set_ylabel("blocks held")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title or f"blocks per group of request {run.request.request_id}", fontsize=9)
    fig.tight_layout()
    return fig


# --- addressing


def swa_window_text(
    block_ids: Sequence[int], block_size: int, position: int, window: int
) -> str:
    """The window of `position`: each position with its block and slot."""
    start = max(position - window + 1, 0)
    rows = [f"token at position {position}, window {window}: positions {start}..{position}"]
    for p in range(start, position + 1):
        j = p // block_size
        rows.append(
            f"  pos {p:>4} -> block_table[{j}] = {block_ids[j]:>3}, offset "
            f"{p % block_size:>2} -> slot {slot_for_position(block_ids, p, block_size)}"
        )
    return "\n".join(rows)


def _block_legend(ax, block_ids: Sequence[int], used: Sequence[int], extra: list) -> None:
    """Legend of the block colours that appear (`used`: table indices), then `extra`
    entries."""
    handles = [
        Patch(
            facecolor=FALLBACK_COLORS[j % len(FALLBACK_COLORS)],
            edgecolor="black",
            label=f"block_table[{j}] = block {block_ids[j]}",
        )
        for j in sorted(set(used))
    ]
    ax.legend(
        handles=handles + extra,
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.02),
        ncol=2,
        frameon=False,
    )


def _cells_width(n: int) -> float:
    """Figure width for `n` cells: half an inch each, between 7 inches and the widest
    figure."""
    return min(max(0.5 * n + 1.2, 7.0), MAX_WIDTH)


def _cells(ax, n: int, per_block: int, block_ids: Sequence[int], selected, slot_of) -> None:
    """Cells 0..n-1 (label on top), selected ones coloured by block with their slot inside;
    thick lines at block boundaries. Narrow cells label every k-th position only."""
    cell_pt = (_cells_width(n) - 1.2) * 72 / n
    every = next(k for k in (1, 2, 4, 8, 16, 32, 64, 10**9) if fits(str(n - 1), k * cell_pt))
    for x in range(n):
        j = x // per_block
        face = FALLBACK_COLORS[j % len(FALLBACK_COLORS)] if x in selected else NULL_COLOR
        ax.add_patch(Rectangle((x, 0), 1, 1, facecolor=face, edgecolor="black", lw=0.5))
        if x % every == 0:
            ax.text(x + 0.5, 1.08, str(x), ha="center", va="bottom", fontsize=8)
        if x in selected and fits(str(slot_of(x)), cell_pt):
            ax.text(x + 0.5, 0.5, str(slot_of(x)), ha="center", va="center", fontsize=8)
    for j in [*range(0, n, per_block), n]:
        ax.plot([j, j], [-0.15, 1.15], color="black", lw=2.2)
        label = f"block {block_ids[j // per_block]}" if j < n else ""
        if label and fits(label, per_block * cell_pt):
            ax.text(j + 0.08, -0.12, label, fontsize=8, va="top")
    ax.set_xlim(-0.1, n + 0.1)
    ax.set_ylim(-0.5, 1.5)
    ax.axis("off")


def draw_swa_window(
    block_ids: Sequence[int], block_size: int, position: int, window: int, title: str = ""
) -> Figure:
    """Positions 0..position as cells; the window's cells are coloured by block and show their
    slot.

    Thick lines are block boundaries; grey cells lie outside the window (never read again).
    """
    n = position + 1
    start = max(position - window + 1, 0)
    fig = Figure(figsize=(_cells_width(n), 3.0))
    ax = fig.add_subplot()
    _cells(
        ax,
        n,
        block_size,
        block_ids,
        set(range(start, n)),
        lambda p: slot_for_position(block_ids, p, block_size),
    )
    grey = Patch(facecolor=NULL_COLOR, edgecolor="black", label="outside the window")
    _block_legend(ax, block_ids, [p // block_size for p in range(start, n)], [grey])
    ax.set_title(
        title
        or f"window of the token at position {position}\n(positions on top, slots inside, "
        "thick lines: block boundaries)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def topk_text(
    mla_block_ids: Sequence[int],
    block_size: int,
    compress_ratio: int,
    position: int,
    local_topk: Sequence[int],
) -> str:
    """Chosen compressed entries of a token and the slots they map to."""
    storage = block_size // compress_ratio
    usable = (position + 1) // compress_ratio
    rows = [
        f"token at position {position}, ratio {compress_ratio}: {usable} usable entries, "
        f"{storage} per block"
    ]
    for x in local_topk:
        if x < 0:
            continue
        rows.append(
            f"  entry {x:>3} (tokens "
            f"{x * compress_ratio}..{x * compress_ratio + compress_ratio - 1}) -> "
            f"block_table[{x // storage}] = {mla_block_ids[x // storage]}, offset "
            f"{x % storage} -> slot {slot_for_position(mla_block_ids, x, storage)}"
        )
    return "\n".join(rows)


def draw_topk(
    mla_block_ids: Sequence[int],
    block_size: int,
    compress_ratio: int,
    position: int,
    local_topk: Sequence[int],
    title: str = "",
) -> Figure:
    """Compressed entries 0..usable-1; the chosen ones are coloured by block and show their
    slot."""
    storage = block_size // compress_ratio
    usable = (position + 1) // compress_ratio
    chosen = {x for x in local_topk if x >= 0}
    fig = Figure(figsize=(_cells_width(max(usable, 1)), 3.0))
    ax = fig.add_subplot()
    _cells(
        ax,
        max(usable, 1),
        storage,
        mla_block_ids,
        chosen,
        lambda x: slot_for_position(mla_block_ids, x, storage),
    )
    grey = Patch(facecolor=NULL_COLOR, edgecolor="black", label="usable, not chosen")
    _block_legend(ax, mla_block_ids, [x // storage for x in chosen], [grey])
    ax.set_title(
        title
        or f"compressed entries usable by the token at position {position}\n"
        "(entry numbers on top, chosen ones show their slot, thick lines: block boundaries)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


# --- retention: which sliding-window checkpoints survive

RETENTION_CELL = {
    "k": ("#2ca02c", "kept checkpoint"),
    "h": ("#98df8a", "reused from the cache"),
    "-": (EMPTY, "computed, then dropped"),
    ".": ("white", "null (before the hit)"),
}


def _retention_name(retention: int | None) -> str:
    if retention is None:
        return "None (dense)"
    return (
        "0 (vLLM's default)" if retention == 0 else f"{retention} (every {retention} tokens)"
    )


def retention_text(runs) -> str:
    """One block per setting: each request's window blocks (k kept, h reused, - dropped, .
    null), its hit and the junction it reported (see `hybrid_simulate.retention_run`)."""
    lines = []
    for run in runs:
        lines.append(f"retention {_retention_name(run.retention)}")
        for rid in run.hits:
            cells = run.blocks.get(rid, "")
            note = f"hit {run.hits[rid]:>2}" + (
                f", junction {run.junctions[rid]}" if run.junctions[rid] else ""
            )
            lines.append(
                f"  {rid}  {cells.ljust(max(len(c) for c in run.blocks.values()))}  {note}"
            )
    return "\n".join(lines)


def draw_retention(runs, title: str = "") -> Figure:
    """Per retention setting, the sliding-window blocks of requests A and B on a token axis
    (kept checkpoints dark, reused hits light, dropped blocks grey), the hit boundaries dashed,
    and each request's hit on the right; C only looks up."""
    first = runs[0]
    tokens = max(len(c) for c in first.blocks.values()) * first.block_size
    fig = Figure(figsize=(MAX_WIDTH, 1.15 * len(runs) + 0.9))
    axes = fig.subplots(len(runs), 1, sharex=True)
    for ax, run in zip(np.atleast_1d(axes), runs):
        rids = list(run.blocks)
        for row, rid in enumerate(rids):
            for col, state in enumerate(run.blocks[rid]):
                color, _ = RETENTION_CELL[state]
                ax.add_patch(
                    Rectangle(
                        (col * run.block_size, -row - 0.9),
                        run.block_size,
                        0.8,
                        facecolor=color,
                        edgecolor="black",
                        lw=0.5,
                    )
                )
        for boundary in range(run.alignment, tokens, run.alignment):
            ax.axvline(boundary, color="black", ls="--", lw=0.8)
        for row, rid in enumerate(rids):
            junction = f", pins {run.junctions[rid]}" if run.junctions[rid] else ""
            ax.text(
                tokens + 1,
                -row - 0.5,
                f"{rid}: hit {run.hits[rid]}{junction}",
                va="center",
                fontsize=8,
            )
        ax.text(
            tokens + 1, -len(rids) - 0.35, f"C: hit {run.hits['C']}", va="center", fontsize=8
        )
        ax.set_xlim(0, tokens + 17)
        ax.set_ylim(-len(rids) - 0.7, 0.1)
        ax.set_yticks([-r - 0.5 for r in range(len(rids))], rids, fontsize=8)
        ax.set_title(f"retention {_retention_name(run.retention)}", fontsize=9, loc="left")
        ax.tick_params(axis="x", labelsize=8)
    axes_list = list(np.atleast_1d(axes))
    axes_list[-1].set_xticks(range(0, tokens + 1, first.alignment))
    axes_list[-1].set_xlabel(
        f"token position (window blocks of {first.block_size} tokens; dashed: hit boundaries "
        f"every {first.alignment} tokens)",
        fontsize=8,
    )
    handles = [
        Patch(facecolor=c, edgecolor="black", lw=0.5, label=label)
        for c, label in RETENTION_CELL.values()
    ]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(title or "which sliding-window checkpoints survive", fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig
