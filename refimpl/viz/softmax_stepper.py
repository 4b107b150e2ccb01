"""Watch the decode kernel's online softmax tile by tile: running max m, sum l and accumulator
acc.

Frames come from a real `refimpl.kernels.online_softmax.OnlineSoftmax` walk (one frame per
tile); `draw_softmax_state` shows the scores read so far (the latest tile highlighted) with the
running max, and the output `acc / l` so far next to the full softmax's answer, which the last
frame reaches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from refimpl.kernels.online_softmax import OnlineSoftmax, SoftmaxState
from refimpl.viz.stepper import Frame, record_frames

READ_COLOR = "#4c72b0"
TILE_COLOR = "#dd8452"
UNREAD_COLOR = "#dddddd"
FINAL_COLOR = "#333333"


def softmax_frames(walk: OnlineSoftmax) -> list[Frame[SoftmaxState]]:
    """Frame 0 before any tile, then one frame per tile, from the walk's own `step()`."""
    if walk.state().tiles_done:
        raise ValueError("softmax_frames needs a fresh OnlineSoftmax (no tile read yet)")
    labels = []
    for index in range(walk.num_tiles):
        start = walk.start + index * walk.block_n
        stop = min(start + walk.block_n, walk.seqlen)
        labels.append(f"tile {index}: positions {start}..{stop - 1}")
    return record_frames(
        walk.state,
        [(label, walk.step) for label in labels],
        initial_label="before the first tile: m = -inf, l = 0, acc = 0",
    )


def signed_values(values, digits: int = 3) -> str:
    return "[" + ", ".join(f"{v:+.{digits}f}" for v in values) + "]"


def softmax_state_text(state: SoftmaxState, dims: int = 4) -> str:
    """m, l, the rescale factor and the first `dims` numbers of acc and acc / l."""
    if state.tile is None:
        return f"m = -inf  l = 0  acc[:{dims}] = {signed_values(state.acc[:dims])}"
    lines = [
        f"read positions {state.tile[0]}..{state.tile[1] - 1}; tile max score "
        f"{max(state.tile_scores):+.3f}",
        f"m = {state.m:+.4f}  alpha = exp(m_old - m_new) = {state.alpha:.4f}  l = "
        f"{state.l:.4f}",
        f"acc[:{dims}] = {signed_values(state.acc[:dims])}",
        f"acc/l[:{dims}] = {signed_values(state.output[:dims])}",
    ]
    return "\n".join(lines)


def softmax_drawer(
    all_scores: torch.Tensor | list[float],
    final_output: torch.Tensor | list[float],
    dims: int = 8,
) -> Callable[[SoftmaxState], Figure]:
    """A `draw(state)` for `Stepper`: `draw_softmax_state` with the whole row of scores and the
    answer bound."""
    scores = [
        float(x) for x in (all_scores.tolist() if torch.is_tensor(all_scores) else all_scores)
    ]
    final = [
        float(v)
        for v in (final_output.tolist() if torch.is_tensor(final_output) else final_output)
    ]
    return lambda state: draw_softmax_state(state, scores, final, dims)


def draw_softmax_state(
    state: SoftmaxState, all_scores: list[float], final_output: list[float], dims: int = 8
) -> Figure:
    """The scores read so far (the latest tile highlighted, unread ones grey) with the running
    max, and `acc / l` so far next to the full softmax's output. Needs every score and the
    answer, which a state alone does not hold."""
    scores = list(all_scores)
    final = list(final_output)[:dims]
    if len(scores) < state.positions_done:
        raise ValueError(
            f"{len(scores)} scores given but the state has read {state.positions_done} "
            "positions"
        )
    fig = Figure(figsize=(7.0, 3.2), layout="constrained")
    ax, out_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.5, 1.0]})
    done = state.positions_done
    tile = state.tile or (done, done)
    colors = [
        TILE_COLOR if tile[0] <= p < tile[1] else READ_COLOR if p < done else UNREAD_COLOR
        for p in range(len(scores))
    ]
    ax.bar(range(len(scores)), scores, color=colors, edgecolor="black", linewidth=0.4)
    if state.tile is not None:
        ax.axhline(state.m, color="black", linestyle="--", linewidth=1)
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_xlabel("context position", fontsize=9)
    ax.set_ylabel("score q·k / sqrt(d)", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.set_title(f"scores read: {done} of {len(scores)}", fontsize=9)
    legend_below(fig, "score read earlier", "score in this tile", "not read yet")
    draw_outputs(
        out_ax, final, state.output if state.tile is not None else None, "acc / l so far"
    )
    return fig


def legend_below(fig: Figure, earlier: str, now: str, waiting: str) -> None:
    """The legend under a stepper's picture: read (or merged) earlier, in this step, not yet,
    and the running max."""
    fig.legend(
        handles=[
            Patch(facecolor=READ_COLOR, label=earlier),
            Patch(facecolor=TILE_COLOR, label=now),
            Patch(facecolor=UNREAD_COLOR, label=waiting),
            Line2D([], [], color="black", linestyle="--", label="running max m"),
        ],
        fontsize=8,
        loc="outside lower center",
        ncol=4,
        frameon=False,
    )


def draw_outputs(ax, final: list[float], so_far: Sequence[float] | None, label: str) -> None:
    """The full softmax's output (circles) and the running `acc / l` (crosses, once there is
    one) on `ax`."""
    xs = range(len(final))
    ax.plot(
        xs,
        final,
        marker="o",
        linestyle="none",
        color=FINAL_COLOR,
        markersize=7,
        fillstyle="none",
        label="full softmax",
    )
    if so_far is not None:
        ax.plot(
            xs,
            so_far[: len(final)],
            marker="x",
            linestyle="none",
            color=TILE_COLOR,
            markersize=7,
            label=label,
        )
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_xticks(list(xs))
    ax.set_xlabel("output dimension", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.set_title(f"output, first {len(final)} dims", fontsize=9)
    ax.legend(fontsize=8, loc="best", frameon=True, framealpha=0.9)
