"""Pictures of what one DeepSeek V4 layer computes and keeps (chapters 08a and 08b), with text
twins.

- `draw_overlapping_windows` / `overlapping_windows_text`: how a ratio-4 compressor folds
  tokens
  into entries, each entry a softmax over the previous window's first series and its own
  window's second series, and which rows still wait in the compressor state;
- `draw_indexer_picks` / `indexer_picks_text`: the Lightning Indexer's scores of the compressed
  entries for each query position, the entries a query may not see yet, and its top-k picks;
- `draw_fp8_ds_mla_page` / `fp8_ds_mla_page_text`: the bytes of one `fp8_ds_mla` page (data of
  every row, then every row's UE8M0 scales, then the alignment padding).
"""

from __future__ import annotations

import math

import torch
from matplotlib import colormaps
from matplotlib.colorbar import ColorbarBase
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from refimpl.course.fp8_ds_mla import page_regions
from refimpl.viz.palette import EMPTY, MAX_WIDTH

SERIES_COLORS = {"a": "#f2b27f", "b": "#8fb0dc"}  # light fills: black 8 pt text stays readable
SERIES_LABELS = {
    "a": "series a (first half of kv_proj / gate_proj)",
    "b": "series b (second half)",
}
WAITING_HATCH = "//"
PICK_MARKER = {
    "marker": "o",
    "markersize": 6,
    "markerfacecolor": "white",
    "markeredgecolor": "black",
    "markeredgewidth": 1.2,
}


# --- the ratio-4 compressor's two overlapping series


def _check_weights(weights: torch.Tensor) -> tuple[int, int]:
    if not isinstance(weights, torch.Tensor) or weights.dim() != 2 or weights.shape[1] % 2:
        raise ValueError(
            "weights must be a 2-d tensor (entries, 2 x ratio): each entry's softmax weights "
            "over its window, the previous window's series a first, then its own series b"
        )
    return weights.shape[0], weights.shape[1] // 2


def _window_cells(weights: torch.Tensor) -> dict[tuple[int, int], tuple[str, float]]:
    """{(entry, token): (series, weight)} for every token that feeds an entry."""
    num_entries, ratio = _check_weights(weights)
    cells = {}
    for j in range(num_entries):
        for k in range(2 * ratio):
            token = (j - 1) * ratio + k
            if token >= 0:
                cells[(j, token)] = ("a" if k < ratio else "b", float(weights[j, k]))
    return cells


def overlapping_windows_text(weights: torch.Tensor) -> str:
    """One line per entry: which series of which token it weighs, and how much (one number of
    the row).

    The last line lists the rows the compressor state must keep for the next entry: series a of
    the last window's tokens.
    """
    num_entries, ratio = _check_weights(weights)
    cells = _window_cells(weights)
    tokens = num_entries * ratio
    label_width = len(f"state (entry {num_entries})")
    lines = [f"{'token':<{label_width}}" + "".join(f"{t:>7}" for t in range(tokens))]
    for j in range(num_entries):
        row = []
        for t in range(tokens):
            series, weight = cells.get((j, t), ("", None))
            row.append(f"{series} {weight:.2f}" if weight is not None and weight > 0 else "-")
        lines.append(f"{f'entry {j}':<{label_width}}" + "".join(f"{cell:>7}" for cell in row))
    waiting = ["a wait" if t >= tokens - ratio else "-" for t in range(tokens)]
    lines.append(
        f"{f'state (entry {num_entries})':<{label_width}}"
        + "".join(f"{c:>7}" for c in waiting)
    )
    return "\n".join(lines)


def draw_overlapping_windows(weights: torch.Tensor, title: str | None = None) -> Figure:
    """Tokens left to right, one row per entry: each cell is the weight the entry gives that
    token, coloured by series; a hatched last row marks the series-a rows waiting in the
    compressor state."""
    num_entries, ratio = _check_weights(weights)
    cells = _window_cells(weights)
    tokens = num_entries * ratio
    rows = num_entries + 1
    fig = Figure(figsize=(min(MAX_WIDTH, 2.4 + 0.8 * tokens), 1.5 + 0.5 * rows))
    ax = fig.add_axes((0.2, 0.24, 0.78, 0.62))
    for j in range(num_entries):
        for t in range(tokens):
            series, weight = cells.get((j, t), (None, 0.0))
            filled = series is not None and weight > 0
            ax.add_patch(
                Rectangle(
                    (t, -j - 0.42),
                    1,
                    0.84,
                    facecolor=SERIES_COLORS[series] if filled else "white",
                    edgecolor="#999999",
                    lw=0.6,
                )
            )
            if filled:
                ax.text(
                    t + 0.5, -j, f"{series} {weight:.2f}", ha="center", va="center", fontsize=8
                )
    for t in range(tokens):
        waiting = t >= tokens - ratio
        ax.add_patch(
            Rectangle(
                (t, -num_entries - 0.42),
                1,
                0.84,
                facecolor=SERIES_COLORS["a"] if waiting else "white",
                hatch=WAITING_HATCH if waiting else None,
                edgecolor="#999999",
                lw=0.6,
            )
        )
        ax.text(t + 0.5, 0.62, str(t), ha="center", va="bottom", fontsize=8)
    ax.text(-0.1, 0.62, "token", ha="right", va="bottom", fontsize=8)
    labels = [f"entry {j}" for j in range(num_entries)] + [f"state, for entry {num_entries}"]
    ax.set_yticks([-r for r in range(rows)], labels, fontsize=8)
    ax.tick_params(axis="y", length=0)
    ax.set_xticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.set_xlim(0, tokens)
    ax.set_ylim(-rows + 0.5, 1.1)
    handles = [
        Patch(facecolor=SERIES_COLORS[s], edgecolor="#999999", label=SERIES_LABELS[s])
        for s in "ab"
    ]
    handles.append(
        Patch(
            facecolor=SERIES_COLORS["a"],
            edgecolor="#999999",
            hatch=WAITING_HATCH,
            label="kept in the compressor state (series a, for the next entry)",
        )
    )
    fig.legend(
        handles=handles,
        loc="lower left",
        bbox_to_anchor=(0.01, 0.0),
        fontsize=8,
        frameon=False,
        ncol=2,
    )
    fig.suptitle(
        title
        or f"ratio-{ratio} compressor: each entry's softmax weights "
        f"(one number of the row) over {2 * ratio} tokens",
        fontsize=9,
        x=0.01,
        ha="left",
    )
    return fig


# --- the Lightning Indexer's scores and picks


def _check_scores(scores: torch.Tensor, picks: torch.Tensor) -> None:
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2:
        raise ValueError(
            "scores must be a 2-d tensor (queries, entries), -inf where a query may not look"
        )
    if (
        not isinstance(picks, torch.Tensor)
        or picks.dim() != 2
        or picks.shape[0] != scores.shape[0]
    ):
        raise ValueError(
            "picks must be a 2-d tensor (queries, k) of entry numbers, -1 for none"
        )
    if picks.numel() and int(picks.max()) >= scores.shape[1]:
        raise ValueError(
            f"picks name entry {int(picks.max())}, but there are {scores.shape[1]} entries"
        )


def indexer_picks_text(
    scores: torch.Tensor, picks: torch.Tensor, positions: list[int] | None = None
) -> str:
    """Entries as rows, query positions as columns: `*` picked, `.` visible but not picked,
    blank where the entry is not complete yet for that query."""
    _check_scores(scores, picks)
    queries, entries = scores.shape
    positions = list(range(queries)) if positions is None else list(positions)
    lines = ["query position " + "".join(f"{p:>3}" for p in positions)]
    for e in range(entries):
        marks = []
        for q in range(queries):
            visible = bool(torch.isfinite(scores[q, e]))
            marks.append("*" if e in picks[q].tolist() else ("." if visible else " "))
        lines.append(f"{f'entry {e}':<15}" + "".join(f"{m:>3}" for m in marks).rstrip())
    lines.append("* picked by the top-k   . visible, not picked   (blank) not complete yet")
    return "\n".join(lines)


def draw_indexer_picks(
    scores: torch.Tensor,
    picks: torch.Tensor,
    positions: list[int] | None = None,
    title: str | None = None,
) -> Figure:
    """One cell per (entry, query): its score as a colour, grey where the query may not look, a
    white dot where the top-k picked it."""
    _check_scores(scores, picks)
    queries, entries = scores.shape
    positions = list(range(queries)) if positions is None else list(positions)
    finite = scores[torch.isfinite(scores)]
    norm = Normalize(
        float(finite.min()) if finite.numel() else 0.0,
        float(finite.max()) if finite.numel() else 1.0,
    )
    cmap = colormaps["Blues"]
    fig = Figure(figsize=(min(MAX_WIDTH, 2.6 + 0.27 * queries), 1.9 + 0.36 * entries))
    ax = fig.add_axes((0.1, 0.24, 0.78, 0.64))
    for q in range(queries):
        chosen = set(picks[q].tolist())
        for e in range(entries):
            value = float(scores[q, e])
            if math.isfinite(value):
                face, hatch = cmap(0.15 + 0.85 * norm(value)), None
            else:
                face, hatch = EMPTY, WAITING_HATCH
            ax.add_patch(
                Rectangle(
                    (q, e), 1, 1, facecolor=face, hatch=hatch, edgecolor="#bbbbbb", lw=0.5
                )
            )
            if e in chosen:
                ax.plot(q + 0.5, e + 0.5, **PICK_MARKER)
    step = 1 if queries <= 16 else 2
    ax.set_xticks(
        [q + 0.5 for q in range(0, queries, step)],
        [str(positions[q]) for q in range(0, queries, step)],
        fontsize=8,
    )
    ax.set_yticks(
        [e + 0.5 for e in range(entries)], [f"entry {e}" for e in range(entries)], fontsize=8
    )
    ax.set_xlabel("query position", fontsize=8)
    ax.set_xlim(0, queries)
    ax.set_ylim(entries, 0)
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    bar = ColorbarBase(fig.add_axes((0.9, 0.24, 0.015, 0.64)), cmap=cmap, norm=norm)
    bar.set_label("score", fontsize=8)
    bar.ax.tick_params(labelsize=8)
    handles = [
        Line2D([], [], linestyle="none", label="picked by the top-k", **PICK_MARKER),
        Patch(
            facecolor=EMPTY,
            edgecolor="#bbbbbb",
            hatch=WAITING_HATCH,
            label="entry not complete yet for this query (score -inf)",
        ),
    ]
    fig.legend(
        handles=handles,
        loc="lower left",
        bbox_to_anchor=(0.01, 0.0),
        fontsize=8,
        frameon=False,
        ncol=2,
    )
    fig.suptitle(
        title or "Lightning Indexer: scores of the compressed entries, and each query's top-k",
        fontsize=9,
        x=0.01,
        ha="left",
    )
    return fig


# --- the bytes of one fp8_ds_mla page

PAGE_COLORS = {"NoPE": "#4c72b0", "RoPE": "#dd8452", "scales": "#55a868", "padding": "#d62728"}
PAGE_LABELS = {
    "NoPE": "448 NoPE values, fp8 (1 byte each)",
    "RoPE": "64 RoPE values, bf16 (2 bytes each)",
    "scales": "8 scale bytes: 7 UE8M0 exponents + 1 pad",
    "padding": "alignment padding",
}


def _region_kind(what: str) -> str:
    for kind in ("NoPE", "RoPE", "scales", "padding"):
        if kind in what:
            return kind
    raise ValueError(what)  # pragma: no cover - page_regions names every region


def fp8_ds_mla_page_text(num_rows: int, alignment: int | None = None) -> str:
    """Every region of a page of `num_rows` rows with its byte range (rows summarised when
    many)."""
    regions = page_regions(num_rows, alignment)
    if num_rows > 4:
        by_kind: dict[str, list[tuple[int, int]]] = {}
        for what, start, end in regions:
            by_kind.setdefault(_region_kind(what), []).append((start, end))
        lines = []
        for kind, spans in by_kind.items():
            total = sum(end - start for start, end in spans)
            lines.append(
                f"{kind:<8} {len(spans):>3} region(s), {total:>6,} bytes, from byte "
                f"{spans[0][0]:,} "
                f"to {spans[-1][1] - 1:,}"
            )
    else:
        lines = [
            f"bytes {start:>5,}..{end - 1:>5,}  {what} ({end - start} B)"
            for what, start, end in regions
        ]
    end = regions[-1][2]
    lines.append(f"page: {end:,} bytes")
    return "\n".join(lines)


def draw_fp8_ds_mla_page(
    num_rows: int, alignment: int | None = None, title: str | None = None
) -> Figure:
    """The page as one bar, to scale: each row's NoPE and RoPE bytes, the scales, the
    padding."""
    regions = page_regions(num_rows, alignment)
    end = regions[-1][2]
    fig = Figure(figsize=(MAX_WIDTH, 2.3))
    ax = fig.add_axes((0.03, 0.45, 0.93, 0.3))
    for what, start, stop in regions:
        kind = _region_kind(what)
        ax.add_patch(
            Rectangle(
                (start, 0),
                stop - start,
                1,
                facecolor=PAGE_COLORS[kind],
                edgecolor="white",
                lw=0.4,
            )
        )
        if stop - start > 0.09 * end:  # room for a label inside the region
            label = what.split(" (")[0] if kind != "padding" else f"padding, {stop - start} B"
            ax.text(
                (start + stop) / 2,
                0.5,
                label,
                ha="center",
                va="center",
                fontsize=8,
                color="white",
            )
    marks = sorted(
        {0, end}
        | ({s for _, s, _ in regions} if num_rows <= 4 else {num_rows * 576, num_rows * 584})
    )
    shown = []
    for x in marks:  # keep labels at least ~7 % of the bar apart
        if all(abs(x - s) > 0.07 * end for s in shown) or x == end:
            shown = [s for s in shown if abs(x - s) > 0.07 * end] + [x]
    ax.set_xticks(shown, [f"{x:,}" for x in shown], fontsize=8)
    ax.set_yticks([])
    ax.set_xlim(0, end)
    ax.set_ylim(0, 1)
    ax.set_xlabel("byte offset in the page", fontsize=8)
    kinds = list(dict.fromkeys(_region_kind(w) for w, _, _ in regions))
    handles = [Patch(color=PAGE_COLORS[k], label=PAGE_LABELS[k]) for k in kinds]
    fig.legend(
        handles=handles,
        loc="lower left",
        bbox_to_anchor=(0.01, 0.0),
        fontsize=8,
        frameon=False,
        ncol=2,
    )
    fig.suptitle(
        title or f"one fp8_ds_mla page of {num_rows} rows: {end:,} bytes",
        fontsize=9,
        x=0.01,
        ha="left",
    )
    return fig
