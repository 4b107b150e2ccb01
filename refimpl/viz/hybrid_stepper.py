"""Step through the hybrid allocator: frames of one pool shared by several groups.

A frame (`AllocatorState`) is a snapshot of a `KVCacheManager` after one real call
(`allocate_slots`, `free`): who owns every block of the pool (group and requests), each
request's block table per group, the free queue from head to tail, and which blocks carry a
prefix-cache hash. `allocator_stepper` turns recorded frames into a `refimpl.viz.Stepper`
whose pictures are the pool grid (block ids, borders, a colour per group) plus the tables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from refimpl.viz.palette import MAX_WIDTH, NULL_COLOR, fits, group_color
from refimpl.viz.stepper import Frame, Stepper, record_frames

CACHED_COLOR = "#fdd0a2"
FREE_COLOR = "white"


def wrap_cells(prefix: str, cells: Sequence[str], width: int = 95) -> list[str]:
    """`prefix` then the cells separated by spaces, continued under the first cell on as many
    lines as it takes to stay within `width` columns."""
    lines, line = [], prefix
    for k, cell in enumerate(cells):
        piece = cell if k == 0 else f" {cell}"
        if k > 0 and len(line) + len(piece) > width:
            lines.append(line)
            line, piece = " " * len(prefix), cell
        line += piece
    return lines + [line]


#: Runs of more null entries than this print as one cell, "(n nulls)".
FOLD_NULLS = 8


def table_cells(ids: Sequence[int]) -> list[str]:
    """A block table's entries as text: the block id, '.' for the null block; a run of more
    than `FOLD_NULLS` null blocks (a long request's window groups) as one "(n nulls)" cell."""
    cells: list[str] = []
    run = 0
    for b in [*ids, None]:  # None flushes the last run
        if b == 0:
            run += 1
            continue
        cells += [f"({run} nulls)"] if run > FOLD_NULLS else ["."] * run
        run = 0
        if b is not None:
            cells.append(str(b))
    return cells or ["(empty)"]


@dataclass(frozen=True)
class AllocatorState:
    """The allocator after one step; every field is immutable and compares by value."""

    labels: tuple[str, ...]  # one label per group, in group order
    owners: tuple[str, ...]  # per block id: "null", "free", "cached" or "<group>:<requests>"
    # (request, block ids per group)
    tables: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...]
    free_queue: tuple[int, ...]  # block ids from the head (reused first) to the tail
    hashed: tuple[int, ...]  # block ids that carry a prefix-cache hash, sorted
    usage: float


def allocator_state(
    manager, labels: Sequence[str], request_ids: Sequence[str]
) -> AllocatorState:
    """Snapshot `manager` (a hybrid `KVCacheManager`); requests without blocks are left out."""
    if len(labels) != len(manager.coordinator.single_type_managers):
        raise ValueError(
            f"{len(labels)} labels for {len(manager.coordinator.single_type_managers)} groups"
        )
    pool = manager.block_pool
    owners: list[str] = ["free"] * pool.num_gpu_blocks
    owners[pool.null_block.block_id] = "null"
    for block in pool.blocks:
        if block.ref_cnt == 0 and not block.is_null and pool.is_cached(block):
            owners[block.block_id] = "cached"
    holders: dict[int, tuple[str, list[str]]] = {}
    tables = []
    for rid in request_ids:
        ids = manager.get_block_ids(rid)
        if not any(ids):
            continue
        tables.append((rid, tuple(tuple(group) for group in ids)))
        for label, group in zip(labels, ids):
            for b in group:
                if b != pool.null_block.block_id:
                    holders.setdefault(b, (label, []))[1].append(rid)
    for b, (label, rids) in holders.items():
        owners[b] = f"{label}:{'+'.join(rids)}"
    hashed = tuple(
        sorted(b.block_id for b in pool.blocks if not b.is_null and pool.is_cached(b))
    )
    queue = tuple(b.block_id for b in pool.free_block_queue)
    return AllocatorState(
        tuple(labels), tuple(owners), tuple(tables), queue, hashed, round(pool.get_usage(), 6)
    )


def record_allocator_frames(
    manager,
    labels: Sequence[str],
    request_ids: Sequence[str],
    actions: Sequence[tuple[str, Callable[[], object]]],
) -> list[Frame[AllocatorState]]:
    """Run `actions` (label, call) on the real objects, snapshotting the allocator after
    each."""
    return record_frames(lambda: allocator_state(manager, labels, request_ids), actions)


def _queue_text(queue: Sequence[int], show: int = 6) -> str:
    if len(queue) <= 2 * show:
        return " ".join(map(str, queue))
    return " ".join(map(str, queue[:show])) + " ... " + " ".join(map(str, queue[-show:]))


def allocator_state_text(state: AllocatorState) -> str:
    """The text twin of `draw_allocator_state`: pool counts, tables, free queue, hashes."""
    counts = {
        label: sum(1 for o in state.owners if o.split(":")[0] == label)
        for label in state.labels
    }
    lines = [
        "pool: "
        + ", ".join(f"{k}={v}" for k, v in counts.items())
        + f",\n  free(hashed)={state.owners.count('cached')}"
        + f", free={state.owners.count('free')}, null=1"
        + f"; usage {state.usage:.3f}"
    ]
    width = max(len(label) for label in state.labels)
    for rid, groups in state.tables:
        lines.append(f"request {rid}:")
        for label, ids in zip(state.labels, groups):
            lines += wrap_cells(f"  {label.ljust(width)} | ", table_cells(ids))
    lines.append(
        f"free queue ({len(state.free_queue)}), head -> tail: {_queue_text(state.free_queue)}"
    )
    # every hashed block, folded under the first one: a 46-block list stays within 95 columns
    lines += wrap_cells(
        f"hashed blocks ({len(state.hashed)}): ", [str(b) for b in state.hashed] or ["-"]
    )
    return "\n".join(lines)


def _fill(owner: str, labels: Sequence[str]) -> str:
    if owner == "null":
        return NULL_COLOR
    if owner == "cached":
        return CACHED_COLOR
    if owner == "free":
        return FREE_COLOR
    label = owner.split(":")[0]
    return group_color(label, list(labels).index(label))


def draw_pool_grid(ax, state: AllocatorState, ncols: int = 16) -> None:
    """The pool as a grid of bordered cells, block 0 top left: id on top, owning request(s)
    below."""
    n = len(state.owners)
    nrows = -(-n // ncols)
    head = state.free_queue[0] if state.free_queue else None
    tail = state.free_queue[-1] if state.free_queue else None
    hashed = set(state.hashed)
    for b, owner in enumerate(state.owners):
        row, col = divmod(b, ncols)
        ax.add_patch(
            Rectangle(
                (col, -row - 1),
                0.94,
                0.94,
                facecolor=_fill(owner, state.labels),
                edgecolor="black",
                lw=1.6 if b in hashed else 0.6,
                hatch="//" if owner == "null" else None,
            )
        )
        # over the hatch
        plate = (
            {"facecolor": NULL_COLOR, "edgecolor": "none", "pad": 0.5}
            if owner == "null"
            else None
        )
        ax.text(  # block ids at 9 pt: the numbers the reader follows from frame to frame
            col + 0.47, -row - 0.3, str(b), ha="center", va="center", fontsize=9, bbox=plate
        )
        below = owner.split(":")[1] if ":" in owner else ("null" if owner == "null" else "")
        if b == head:
            below = "head"
        elif b == tail:
            below = "tail"
        if below:
            ax.text(
                col + 0.47,
                -row - 0.7,
                below,
                ha="center",
                va="center",
                fontsize=8,
                bbox=plate,
                fontweight="bold" if below in ("head", "tail") else "normal",
            )
    ax.set_xlim(-0.05, ncols)
    ax.set_ylim(-nrows - 0.05, 0.05)
    ax.axis("off")


#: Table columns the row labels take, left of block_table[0].
_LABEL_COLUMNS = 4


def _table_span(state: AllocatorState, ncols: int) -> int:
    """Table cells per line: as many as the figure holds while the largest block id still
    reads at 8 pt inside its cell with a point to spare each side; a longer table wraps."""
    digits = len(str(max(len(state.owners) - 1, 0)))
    # a cell is 0.92 of the pitch; the table's axes take about 0.95 of the figure's width
    pitch_pt = (digits * 0.62 * 8 + 2 + 2) / 0.92
    return max(int(0.95 * MAX_WIDTH * 72 / pitch_pt) - _LABEL_COLUMNS, ncols)


def _table_lines(
    state: AllocatorState, span: int
) -> list[tuple[str, str | None, int, Sequence[int]]]:
    """(request id, group label or None for the request's heading or a continuation, group
    index, block ids) for each line of the tables, a group's ids cut into lines of `span`."""
    lines = []
    for rid, groups in state.tables:
        lines.append((rid, None, -1, ()))
        for g, (label, ids) in enumerate(zip(state.labels, groups)):
            for start in range(0, max(len(ids), 1), span):
                lines.append((rid, label if start == 0 else "", g, ids[start : start + span]))
    return lines


def draw_allocator_state(state: AllocatorState, ncols: int = 16, title: str = "") -> Figure:
    """The pool grid with its legend (top) and each live request's block table per group
    (below; a table longer than the figure's width goes on in a line marked "cont.")."""
    span = _table_span(state, ncols)
    lines = _table_lines(state, span)
    nrows = -(-len(state.owners) // ncols)
    widest = max([len(ids) for *_, ids in lines] + [ncols])
    grid_h, legend_h, table_h = 0.5 * nrows, 0.75, 0.3 * len(lines)
    fig = Figure(figsize=(MAX_WIDTH, grid_h + legend_h + table_h + 0.9))
    if state.tables:
        grid_ax, table_ax = fig.subplots(
            2, 1, gridspec_kw={"height_ratios": [grid_h + legend_h, table_h]}
        )
    else:
        grid_ax, table_ax = fig.add_subplot(), None
    draw_pool_grid(grid_ax, state, ncols)
    handles = [
        Patch(facecolor=group_color(label, i), edgecolor="black", label=label)
        for i, label in enumerate(state.labels)
    ]
    handles += [
        Patch(facecolor=CACHED_COLOR, edgecolor="black", label="free, hashed (evicted last)"),
        Patch(facecolor=FREE_COLOR, edgecolor="black", label="free"),
        Patch(facecolor=NULL_COLOR, edgecolor="black", hatch="//", label="null block"),
        Patch(facecolor="white", edgecolor="black", lw=1.6, label="thick border: has a hash"),
    ]
    grid_ax.legend(
        handles=handles,
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=5,
        frameon=False,
    )
    grid_ax.set_title(
        title
        or "the pool: block id on top; below it the owning request, "
        "or head / tail of the free queue",
        fontsize=9,
    )
    if table_ax is not None:
        # one table column, in points (x spans -_LABEL_COLUMNS..widest)
        pitch_pt = 0.95 * MAX_WIDTH * 72 / (widest + _LABEL_COLUMNS)
        for y, (rid, label, g, ids) in enumerate(lines):
            y = -y
            if label is None:
                table_ax.text(
                    -0.2,
                    y,
                    f"request {rid}: block table of each group (grey, hatched: null block)",
                    fontsize=9,
                    fontweight="bold",
                    va="center",
                )
                continue
            table_ax.text(-0.2, y, label or "cont.", fontsize=8, va="center", ha="right")
            for col, b in enumerate(ids):
                face = NULL_COLOR if b == 0 else group_color(state.labels[g], g)
                table_ax.add_patch(
                    Rectangle(
                        (col, y - 0.45),
                        0.92,
                        0.9,
                        facecolor=face,
                        edgecolor="black",
                        lw=0.5,
                        hatch="//" if b == 0 else None,
                    )
                )
                # a cell too narrow for its id shows its colour
                if b != 0 and fits(str(b), pitch_pt):
                    table_ax.text(col + 0.46, y, str(b), ha="center", va="center", fontsize=8)
        table_ax.set_xlim(-_LABEL_COLUMNS, widest)
        table_ax.set_ylim(-len(lines) + 0.5, 0.6)
        table_ax.axis("off")
    fig.tight_layout()
    return fig


def allocator_stepper(
    frames: list[Frame[AllocatorState]], ncols: int = 16
) -> Stepper[AllocatorState]:
    """A `Stepper` over allocator frames: the pool grid and tables as picture, the state as
    text."""
    return Stepper(
        frames, lambda state: draw_allocator_state(state, ncols), allocator_state_text
    )
