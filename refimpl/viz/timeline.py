"""The scheduler's step timeline: who ran in each step, as prefill or decode, and what it cost.

`draw_timeline` draws one row per sequence and one column per step (prefill, prefill chunk or
decode; preemptions, finishes and prefix-cache hits marked) above the blocks in use after each
step. `timeline_text` is its text twin: one line per step.

Both take `names` (seq_id -> name, e.g. from `running_example.names_by_seq_id`) so that a row
reads "A" instead of a global counter value that depends on how many sequences ran before.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as Seq

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from refimpl.course.runners import StepRecord
from refimpl.viz.palette import MAX_WIDTH

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
            raise ValueError(
                "steps must be StepRecord objects from refimpl.course.runners, got "
                f"{type(record).__name__}"
            )
    return steps


def _namer(names: Mapping[int, str] | None):
    """seq_id -> its display name (the id itself where no name is given)."""
    names = dict(names or {})
    return lambda seq_id: names.get(seq_id, str(seq_id))


def _cell_text(record: StepRecord, index: int, name=str) -> str:
    seq_id, n, hit = (
        record.seq_ids[index],
        record.num_scheduled_tokens[index],
        record.prefix_hit_tokens[index],
    )
    text = f"{name(seq_id)}:{n}"
    if seq_id in record.chunked_seq_ids:
        text += "*"
    if hit:
        text += f"(+{hit} cached)"
    return text


def timeline_text(
    steps: Seq[StepRecord],
    num_blocks: int | None = None,
    names: Mapping[int, str] | None = None,
) -> str:
    """One line per step: kind, batch as `seq:tokens`, preempted and finished sequences, blocks
    in use.

    `*` marks a prefill chunk that leaves part of the prompt for later; `(+n cached)` is the
    number of the sequence's tokens served by the prefix cache when its blocks were allocated.
    """
    steps = _check_steps(steps)
    name = _namer(names)
    pool = f"/{num_blocks}" if num_blocks is not None else ""
    rows = [("step", "kind", "batch (seq:tokens)", "preempted", "finished", "blocks")]
    for r in steps:
        rows.append(
            (
                str(r.step),
                r.kind,
                " ".join(_cell_text(r, i, name) for i in range(len(r.seq_ids))),
                " ".join(map(name, r.preempted_seq_ids)) or "-",
                " ".join(map(name, r.finished_seq_ids)) or "-",
                f"{r.num_blocks_in_use}{pool}",
            )
        )
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    num_prefill = sum(r.is_prefill for r in steps)
    lines.append(
        f"{len(steps)} steps ({num_prefill} prefill, {len(steps) - num_prefill} decode), "
        f"tokens computed: {sum(r.num_batched_tokens for r in steps)}, "
        f"served by the prefix cache: {sum(r.num_prefix_hit_tokens for r in steps)},\n"
        f"preemptions: {sum(len(r.preempted_seq_ids) for r in steps)}, "
        f"peak blocks in use: {max(r.num_blocks_in_use for r in steps)}{pool}"
    )
    return "\n".join(lines)


def draw_timeline(
    steps: Seq[StepRecord],
    num_blocks: int | None = None,
    *,
    title: str | None = None,
    names: Mapping[int, str] | None = None,
) -> Figure:
    """The step timeline as a figure: sequences by steps on top, blocks in use below.

    A prefill chunk is a light cell with a dashed border (no hatching, so its label stays
    readable); the legend lists only what the picture shows.
    """
    steps = _check_steps(steps)
    name = _namer(names)
    seq_ids = sorted({s for r in steps for s in r.seq_ids + r.preempted_seq_ids})
    row = {seq_id: i for i, seq_id in enumerate(seq_ids)}
    first = steps[0].step
    width = min(MAX_WIDTH, max(7.0, 0.45 * len(steps) + 3))
    # a label fits a cell
    labelled = len(steps) <= MAX_LABELLED_STEPS and (width - 3) * 72 / len(steps) >= 18
    height = 2.2 + 0.4 * len(seq_ids)
    fig = Figure(figsize=(width, height), layout="constrained")
    grid = fig.add_gridspec(2, 1, height_ratios=[max(1.0, 0.4 * len(seq_ids)), 1.2])
    ax = fig.add_subplot(grid[0])
    ax_blocks = fig.add_subplot(grid[1], sharex=ax)

    shown: set[str] = set()  # what the picture holds, so the legend lists nothing else
    for r in steps:
        x = r.step - 0.5
        for i, seq_id in enumerate(r.seq_ids):
            y = row[seq_id] - 0.4
            chunk = seq_id in r.chunked_seq_ids
            color = (
                DECODE_COLOR if not r.is_prefill else CHUNK_COLOR if chunk else PREFILL_COLOR
            )
            cell = Rectangle(
                (x + 0.05, y),
                0.9,
                0.8,
                facecolor=color,
                edgecolor="black",
                linewidth=1.0 if chunk else 0.5,
                linestyle="--" if chunk else "-",
            )
            cell.set_gid("chunk" if chunk else "decode" if not r.is_prefill else "prefill")
            ax.add_patch(cell)
            shown.add(cell.get_gid())
            hit = r.prefix_hit_tokens[i]
            if hit:
                ax.add_patch(
                    Rectangle((x + 0.05, y), 0.9, 0.14, facecolor=HIT_COLOR, edgecolor="none")
                )
                shown.add("hit")
            if labelled and r.is_prefill:
                label = str(r.num_scheduled_tokens[i]) + (f"\n+{hit}" if hit else "")
                ax.text(
                    r.step,
                    row[seq_id],
                    label,
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="black" if chunk else "white",
                )
            if seq_id in r.finished_seq_ids:
                ax.plot(r.step + 0.45, row[seq_id], marker="o", color="black", markersize=4)
                shown.add("finished")
        for seq_id in r.preempted_seq_ids:
            ax.plot(r.step, row[seq_id], marker="X", color=PREEMPT_COLOR, markersize=9)
            shown.add("preempted")

    last = steps[-1].step
    ax.set_xlim(first - 0.6, last + 0.6)
    ax.set_ylim(len(seq_ids) - 0.5, -0.5)
    ax.set_yticks(range(len(seq_ids)), [name(s) if names else f"seq {s}" for s in seq_ids])
    ax.set_title(title or "Scheduler timeline: one column per step")
    ax.tick_params(labelbottom=False)
    legend = {
        "prefill": Patch(
            facecolor=PREFILL_COLOR, edgecolor="black", label="prefill (prompt done)"
        ),
        "chunk": Patch(
            facecolor=CHUNK_COLOR,
            edgecolor="black",
            linestyle="--",
            label="prefill chunk (prompt not done)",
        ),
        "decode": Patch(facecolor=DECODE_COLOR, edgecolor="black", label="decode (1 token)"),
        "hit": Patch(facecolor=HIT_COLOR, label="prefix-cache hit (+n cached)"),
        "preempted": Line2D(
            [], [], marker="X", color=PREEMPT_COLOR, linestyle="none", label="preempted"
        ),
        "finished": Line2D(
            [], [], marker="o", color="black", linestyle="none", markersize=4, label="finished"
        ),
    }
    handles = [handle for key, handle in legend.items() if key in shown]
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
    )

    xs = [r.step for r in steps]
    ax_blocks.bar(xs, [r.num_blocks_in_use for r in steps], width=0.8, color="#8172b3")
    if num_blocks is not None:
        ax_blocks.axhline(
            num_blocks,
            color="black",
            linestyle="--",
            linewidth=1,
            label=f"pool = {num_blocks} blocks",
        )
        ax_blocks.legend(
            loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False
        )
        ax_blocks.set_ylim(0, num_blocks * 1.15)
    ax_blocks.set_ylabel("blocks in use")
    ax_blocks.set_xlabel("step")
    if len(steps) <= MAX_LABELLED_STEPS:
        ax_blocks.set_xticks(xs)
    return fig
