"""The scheduler's step timeline: who ran in each step, as prefill or decode, and what it cost.

`draw_timeline` draws one row per sequence and one column per step (prefill, prefill chunk or
decode; preemptions, finishes and prefix-cache hits marked) above the blocks in use after each
step. `timeline_text` is its text twin: one line per step.
"""

from __future__ import annotations

from typing import Sequence as Seq

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from refimpl.paged.runners import StepRecord

PREFILL_COLOR = "#4c72b0"
CHUNK_COLOR = "#a6bddb"
DECODE_COLOR = "#55a868"
PREEMPT_COLOR = "#c44e52"
HIT_COLOR = "#dd8452"
MAX_LABELLED_STEPS = 40  # beyond this, cells are too narrow for numbers


def _check_steps(steps: Seq[StepRecord]) -> list[StepRecord]:
    steps = list(steps)
    if not steps:
        raise ValueError("no steps to show: run the scheduler first (the step list is empty)")
    for record in steps:
        if not isinstance(record, StepRecord):
            raise ValueError(f"steps must be StepRecord objects from refimpl.paged.runners, got {type(record).__name__}")
    return steps


def _cell_text(record: StepRecord, index: int) -> str:
    seq_id, n, hit = record.seq_ids[index], record.num_scheduled_tokens[index], record.prefix_hit_tokens[index]
    text = f"{seq_id}:{n}"
    if seq_id in record.chunked_seq_ids:
        text += "*"
    if hit:
        text += f"(+{hit} cached)"
    return text


def timeline_text(steps: Seq[StepRecord], num_blocks: int | None = None) -> str:
    """One line per step: kind, batch as `seq:tokens`, preempted and finished sequences, blocks in use.

    `*` marks a prefill chunk that leaves part of the prompt for later; `(+n cached)` is the
    number of the sequence's tokens served by the prefix cache when its blocks were allocated.
    """
    steps = _check_steps(steps)
    pool = f"/{num_blocks}" if num_blocks is not None else ""
    rows = [("step", "kind", "batch (seq:tokens)", "preempted", "finished", "blocks")]
    for r in steps:
        rows.append(
            (
                str(r.step),
                r.kind,
                " ".join(_cell_text(r, i) for i in range(len(r.seq_ids))),
                " ".join(map(str, r.preempted_seq_ids)) or "-",
                " ".join(map(str, r.finished_seq_ids)) or "-",
                f"{r.num_blocks_in_use}{pool}",
            )
        )
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    num_prefill = sum(r.is_prefill for r in steps)
    lines.append(
        f"{len(steps)} steps ({num_prefill} prefill, {len(steps) - num_prefill} decode), "
        f"tokens computed: {sum(r.num_batched_tokens for r in steps)}, "
        f"served by the prefix cache: {sum(r.num_prefix_hit_tokens for r in steps)}, "
        f"preemptions: {sum(len(r.preempted_seq_ids) for r in steps)}, "
        f"peak blocks in use: {max(r.num_blocks_in_use for r in steps)}{pool}"
    )
    return "\n".join(lines)


def draw_timeline(steps: Seq[StepRecord], num_blocks: int | None = None, *, title: str | None = None) -> Figure:
    """The step timeline as a figure: sequences by steps on top, blocks in use below."""
    steps = _check_steps(steps)
    seq_ids = sorted({s for r in steps for s in r.seq_ids + r.preempted_seq_ids})
    row = {seq_id: i for i, seq_id in enumerate(seq_ids)}
    first = steps[0].step
    labelled = len(steps) <= MAX_LABELLED_STEPS
    width = min(16.0, max(6.0, 0.45 * len(steps) + 2))
    height = 2.2 + 0.4 * len(seq_ids)
    fig = Figure(figsize=(width, height), layout="constrained")
    grid = fig.add_gridspec(2, 1, height_ratios=[max(1.0, 0.4 * len(seq_ids)), 1.2])
    ax = fig.add_subplot(grid[0])
    ax_blocks = fig.add_subplot(grid[1], sharex=ax)

    for r in steps:
        x = r.step - 0.5
        for i, seq_id in enumerate(r.seq_ids):
            y = row[seq_id] - 0.4
            chunk = seq_id in r.chunked_seq_ids
            color = DECODE_COLOR if not r.is_prefill else CHUNK_COLOR if chunk else PREFILL_COLOR
            ax.add_patch(
                Rectangle((x + 0.05, y), 0.9, 0.8, facecolor=color, edgecolor="black", linewidth=0.5,
                          hatch="//" if chunk else None)
            )
            hit = r.prefix_hit_tokens[i]
            if hit:
                ax.add_patch(Rectangle((x + 0.05, y), 0.9, 0.14, facecolor=HIT_COLOR, edgecolor="none"))
            if labelled and r.is_prefill:
                label = str(r.num_scheduled_tokens[i]) + (f"\n+{hit}" if hit else "")
                box = dict(facecolor="white", edgecolor="none", pad=1.0) if chunk else None  # readable over hatching
                ax.text(r.step, row[seq_id], label, ha="center", va="center", fontsize=7,
                        color="black" if chunk else "white", bbox=box)
            if seq_id in r.finished_seq_ids:
                ax.plot(r.step + 0.45, row[seq_id], marker="o", color="black", markersize=4)
        for seq_id in r.preempted_seq_ids:
            ax.plot(r.step, row[seq_id], marker="X", color=PREEMPT_COLOR, markersize=9)

    last = steps[-1].step
    ax.set_xlim(first - 0.6, last + 0.6)
    ax.set_ylim(len(seq_ids) - 0.5, -0.5)
    ax.set_yticks(range(len(seq_ids)), [f"seq {s}" for s in seq_ids])
    ax.set_title(title or "Scheduler timeline: one column per step")
    ax.tick_params(labelbottom=False)
    handles = [
        Patch(facecolor=PREFILL_COLOR, edgecolor="black", label="prefill (prompt done)"),
        Patch(facecolor=CHUNK_COLOR, edgecolor="black", hatch="//", label="prefill chunk"),
        Patch(facecolor=DECODE_COLOR, edgecolor="black", label="decode (1 token)"),
        Patch(facecolor=HIT_COLOR, label="prefix-cache hit"),
        Line2D([], [], marker="X", color=PREEMPT_COLOR, linestyle="none", label="preempted"),
        Line2D([], [], marker="o", color="black", linestyle="none", markersize=4, label="finished"),
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)

    xs = [r.step for r in steps]
    ax_blocks.bar(xs, [r.num_blocks_in_use for r in steps], width=0.8, color="#8172b3")
    if num_blocks is not None:
        ax_blocks.axhline(num_blocks, color="black", linestyle="--", linewidth=1, label=f"pool = {num_blocks} blocks")
        ax_blocks.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        ax_blocks.set_ylim(0, num_blocks * 1.15)
    ax_blocks.set_ylabel("blocks in use")
    ax_blocks.set_xlabel("step")
    if len(steps) <= MAX_LABELLED_STEPS:
        ax_blocks.set_xticks(xs)
    return fig
