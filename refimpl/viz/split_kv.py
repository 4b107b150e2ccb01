"""Split-KV (flash-decoding) for notebook 07: why a decode step can leave a GPU idle, and the
merge.

- `draw_sm_occupancy` / `sm_occupancy_text`: how many decode programs each SM of a GPU gets
  when
  every (sequence, KV head) is one program, and when each context is cut into chunks. A model
  (programs dealt to SMs in turn), not a measurement.
- `merge_frames`, `merge_drawer`, `merge_state_text`: a `Stepper` over the merge of the chunks'
  partial results, from a real `refimpl.kernels.online_softmax.PartialMerge`: the chunks'
  maxima with the running max, and the merged output so far next to the full softmax's answer.
- `draw_decode_timings` / `decode_timings_text`: what `benchmarks/kernels_gpu.py` recorded on a
  GPU
  (SDPA on pre-gathered K/V, the kernel with one chunk and split), from its JSON record.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from refimpl.kernels.online_softmax import MergeState, PartialMerge
from refimpl.viz.palette import EMPTY, MAX_WIDTH
from refimpl.viz.softmax_stepper import (
    FINAL_COLOR,
    READ_COLOR,
    TILE_COLOR,
    UNREAD_COLOR,
    draw_outputs,
    legend_below,
    signed_values,
)
from refimpl.viz.stepper import Frame, record_frames

BUSY_COLORS = ["#c6dbef", "#6baed6", "#2171b5", "#08306b"]  # 1, 2, 3, 4+ programs on one SM


# --- programs and SMs


def programs_per_sm(batch: int, num_kv_heads: int, num_splits: int, num_sms: int) -> list[int]:
    """How many of the step's `batch * num_kv_heads * num_splits` programs each SM runs, dealt
    in turn."""
    for name, value in (
        ("batch", batch),
        ("num_kv_heads", num_kv_heads),
        ("num_splits", num_splits),
        ("num_sms", num_sms),
    ):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    programs = batch * num_kv_heads * num_splits
    return [
        programs // num_sms + (1 if sm < programs % num_sms else 0) for sm in range(num_sms)
    ]


def sm_occupancy_text(
    batch: int, num_kv_heads: int, splits: Sequence[int], num_sms: int
) -> str:
    """Text twin of `draw_sm_occupancy`: programs, idle SMs and programs per busy SM, one line
    per split count."""
    lines = []
    for num_splits in splits:
        counts = programs_per_sm(batch, num_kv_heads, num_splits, num_sms)
        idle = counts.count(0)
        chunk = "chunk" if num_splits == 1 else "chunks"
        most = max(counts)
        lines.append(
            f"{batch} seqs x {num_kv_heads} KV heads x {num_splits} {chunk} = {sum(counts)} "
            "programs "
            f"on {num_sms} SMs: {idle} SMs idle, up to {most} "
            f"program{'s' if most > 1 else ''} per SM"
        )
    return "\n".join(lines)


def draw_sm_occupancy(
    batch: int, num_kv_heads: int, splits: Sequence[int], num_sms: int, columns: int = 12
) -> Figure:
    """One panel per split count: the GPU's SMs as a grid of squares, shaded by the programs
    each runs."""
    fig = Figure(figsize=(3.4 * len(splits), 3.3), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(splits)))
    rows = -(-num_sms // columns)
    for ax, num_splits in zip(axes, splits):
        counts = programs_per_sm(batch, num_kv_heads, num_splits, num_sms)
        for sm, count in enumerate(counts):  # SM 0 top left, row by row
            colour = EMPTY if count == 0 else BUSY_COLORS[min(count, len(BUSY_COLORS)) - 1]
            x, y = sm % columns, rows - 1 - sm // columns
            ax.add_patch(
                Rectangle((x + 0.05, y + 0.05), 0.9, 0.9, facecolor=colour, edgecolor="white")
            )
        ax.set_xlim(0, columns)
        ax.set_ylim(0, rows)
        ax.set_aspect("equal")
        ax.axis("off")
        chunk = "chunk" if num_splits == 1 else "chunks"
        ax.set_title(
            f"{num_splits} {chunk}: {sum(counts)} programs,\n{counts.count(0)} of {num_sms} "
            "SMs idle",
            fontsize=9,
        )
    handles = [Patch(facecolor=EMPTY, edgecolor="#999999", label="idle")]
    handles += [
        Patch(
            facecolor=c,
            label=f"{i + 1}{'+' if i == len(BUSY_COLORS) - 1 else ''} program"
            + ("" if i == 0 else "s"),
        )
        for i, c in enumerate(BUSY_COLORS)
    ]
    fig.legend(
        handles=handles,
        fontsize=8,
        loc="outside lower center",
        ncol=len(handles),
        frameon=False,
    )
    return fig


# --- the merge of partial results


def merge_frames(merge: PartialMerge) -> list[Frame[MergeState]]:
    """Frame 0 with every chunk's partial result ready, then one frame per chunk merged."""
    if merge.state().count:
        raise ValueError("merge_frames needs a fresh PartialMerge (no chunk merged yet)")
    labels = [
        f"merge chunk {i}: positions {p.start}..{p.stop - 1}"
        for i, p in enumerate(merge.partials)
    ]
    return record_frames(
        merge.state,
        [(label, merge.step) for label in labels],
        initial_label=f"{len(merge.partials)} chunks walked in parallel, nothing merged yet",
    )


def merge_state_text(state: MergeState, dims: int = 4) -> str:
    """Each chunk's (m, l) and, once merging started, the rescale factors and the merged result
    so far."""
    lines = [
        f"chunk {i} ({p.start}..{p.stop - 1}): m = {p.m:+.4f}  l = {p.l:.4f}"
        + ("  merged" if i < state.count else "")
        for i, p in enumerate(state.partials)
    ]
    if state.merged is not None:
        merged = state.merged
        if state.count > 1:
            lines.append(
                f"rescale: merged so far x {state.weights[0]:.4f}, chunk {state.count - 1} x "
                f"{state.weights[1]:.4f}"
            )
        lines.append(f"merged 0..{merged.stop - 1}: m = {merged.m:+.4f}  l = {merged.l:.4f}")
        lines.append(f"acc/l[:{dims}] = {signed_values(merged.output[:dims])}")
    return "\n".join(lines)


def merge_drawer(
    final_output: Sequence[float], dims: int = 8
) -> Callable[[MergeState], Figure]:
    """A `draw(state)` for `Stepper`: `draw_merge_state` with the full softmax's answer
    bound."""
    final = [
        float(v)
        for v in (final_output.tolist() if hasattr(final_output, "tolist") else final_output)
    ]
    return lambda state: draw_merge_state(state, final, dims)


def draw_merge_state(
    state: MergeState, final_output: Sequence[float], dims: int = 8
) -> Figure:
    """Left: each chunk's max score as a bar over its positions (merged, merging now, waiting)
    with the running max. Right: the merged `acc / l` so far next to the full softmax's
    output."""
    partials = state.partials
    final = list(final_output)[:dims]
    fig = Figure(figsize=(7.0, 3.2), layout="constrained")
    ax, out_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.5, 1.0]})
    for i, p in enumerate(partials):
        colour = (
            TILE_COLOR
            if i == state.count - 1
            else READ_COLOR
            if i < state.count
            else UNREAD_COLOR
        )
        ax.bar(
            p.start,
            p.m,
            width=p.stop - p.start,
            align="edge",
            color=colour,
            edgecolor="black",
            linewidth=0.4,
        )
        ax.text(
            p.start + (p.stop - p.start) / 2,
            p.m,
            f"l={p.l:.2f}",
            ha="center",
            va="bottom" if p.m >= 0 else "top",
            fontsize=8,
        )
    if state.merged is not None:
        ax.axhline(state.merged.m, color="black", linestyle="--", linewidth=1)
    ax.axhline(0, color="black", linewidth=0.5)
    ax.margins(y=0.2)  # room for the l labels
    ax.set_xlim(0, partials[-1].stop)
    ax.set_xlabel("context position (one bar per chunk)", fontsize=9)
    ax.set_ylabel("chunk max score m", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.set_title(f"chunks merged: {state.count} of {len(partials)}", fontsize=9)
    legend_below(fig, "merged earlier", "merged in this step", "waiting")
    draw_outputs(
        out_ax,
        final,
        state.merged.output if state.merged is not None else None,
        "merged acc / l",
    )
    return fig


# --- GPU measurements recorded by benchmarks/kernels_gpu.py


def _goal_line(shape: dict, copy_gbps: float) -> str:
    split_x = shape["split_ms"] / shape["sdpa_ms"]
    gbps = shape["kv_bytes"] / shape["split_ms"] / 1e6
    return (
        f"split {split_x:.1f}x SDPA (goal: within 2x), {gbps:.0f} GB/s = "
        f"{gbps / copy_gbps:.2f} of copy "
        f"bandwidth (goal: at least 0.5)"
    )


def decode_timings_text(record: dict) -> str:
    """Text twin of `draw_decode_timings`: the machine, then per decode shape the times and the
    goals."""
    lines = [
        f"measured on {record['machine']} (torch {record['torch']}, Triton "
        f"{record['triton']}); "
        f"device-to-device copy {record['copy_gbps']:.0f} GB/s"
    ]
    for shape in record["decode"]:
        lines.append(
            f"batch {shape['batch']}, context {shape['context']}, "
            f"{shape['num_heads']}/{shape['num_kv_heads']} "
            f"heads, head_dim {shape['head_dim']}, {shape['dtype']}, block "
            f"{shape['block_size']}:"
        )
        lines.append(
            f"  SDPA on gathered K/V {shape['sdpa_ms']:.3f} ms | Triton, one chunk "
            f"{shape['unsplit_ms']:.3f} ms"
            f" | Triton, {shape['auto_splits']} chunks (automatic) {shape['split_ms']:.3f} ms"
        )
        lines.append("  " + _goal_line(shape, record["copy_gbps"]))
    return "\n".join(lines)


def draw_decode_timings(record: dict) -> Figure:
    """Per decode shape: SDPA on pre-gathered K/V, the Triton kernel with one chunk and with
    the automatic split (left, milliseconds), and the K/V bytes each Triton run reads per
    second against the copy bandwidth (right)."""
    shapes = record["decode"]
    labels = [f"batch {s['batch']}\ncontext {s['context']}" for s in shapes]
    fig = Figure(figsize=(MAX_WIDTH, 3.4), layout="constrained")
    time_ax, bw_ax = fig.subplots(1, 2)
    x = np.arange(len(shapes))
    runs = [
        ("SDPA (gathered K/V)", "sdpa_ms", FINAL_COLOR),
        ("Triton, one chunk", "unsplit_ms", UNREAD_COLOR),
        ("Triton, split", "split_ms", READ_COLOR),
    ]
    for i, (label, key, colour) in enumerate(runs):
        time_ax.bar(
            x + (i - 1) * 0.27,
            [s[key] for s in shapes],
            width=0.27,
            color=colour,
            edgecolor="black",
            linewidth=0.4,
            label=label,
        )
        if key != "sdpa_ms":
            bw_ax.bar(
                x + (i - 1.5) * 0.35,
                [s["kv_bytes"] / s[key] / 1e6 for s in shapes],
                width=0.35,
                color=colour,
                edgecolor="black",
                linewidth=0.4,
            )
    copy = record["copy_gbps"]
    bw_ax.axhline(copy, color="black", linewidth=1, label=f"copy bandwidth ({copy:.0f} GB/s)")
    bw_ax.axhline(
        copy / 2, color="black", linewidth=1, linestyle="--", label="half of it (the goal)"
    )
    for ax, title, unit in (
        (time_ax, "decode step time", "ms"),
        (bw_ax, "K/V read per second", "GB/s"),
    ):
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_ylabel(unit, fontsize=9)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=8)
    time_ax.legend(fontsize=8, frameon=False, loc="best")
    bw_ax.set_ylim(
        0,
        1.4
        * max(
            copy, *(s["kv_bytes"] / min(s["unsplit_ms"], s["split_ms"]) / 1e6 for s in shapes)
        ),
    )
    # above the copy line: the axis leaves room
    bw_ax.legend(fontsize=8, frameon=False, loc="upper right")
    fig.suptitle(f"measured on {record['machine']}", fontsize=9)
    return fig
