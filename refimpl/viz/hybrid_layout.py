"""Pictures of the hybrid KV-cache plan, each with a deterministic text twin.

- `draw_pages` / `pages_text`: real bytes and alignment padding of each cache kind's page;
- `draw_grouping` / `grouping_text`: which decoder layers' caches went into which group;
- `draw_groupings` / `groupings_text`: the same for several models on one layer axis;
- `draw_padding_curve` / `padding_curve_text`: the approximate gcd's padding for every d;
- `draw_slab` / `slab_text`: one block of the packed slab, to scale, one row per group
  (`upto=` zooms in on the first bytes, where offsets and padding are visible);
- `draw_blocks_per_budget` / `blocks_per_budget_text`: blocks that fit a budget, per layout;
- `draw_v4_layer` / `v4_layer_text`: the caches one V4 layer writes, with writer and reader;
- `draw_position_strip` / `position_strip_text`: which caches each token position writes;
- `draw_layer_view` / `layer_view_text`: one layer's pages in the slab, a block stride apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter

from refimpl.course.v4_inventory import short_name
from refimpl.hybrid import deepseek_v4
from refimpl.hybrid.kv_cache_interface import KVCacheGroupSpec, KVCacheSpec
from refimpl.hybrid.kv_cache_planning import padding_curve
from refimpl.plan_summary import group_kind
from refimpl.viz.palette import MAX_WIDTH

KIND_COLORS = {
    "c4": "#1f77b4",
    "c128": "#aec7e8",
    "idx": "#ff7f0e",
    "swa": "#2ca02c",
    "idx_state": "#ffbb78",
    "c4_state": "#9467bd",
    "c128_state": "#c5b0d5",
}
PADDING_COLOR = "#d62728"
KIND_LABELS = {
    "c4": "c4a main KV (ratio 4)",
    "c128": "c128a main KV (ratio 128)",
    "idx": "indexer k-cache",
    "swa": "sliding-window KV",
    "idx_state": "indexer compressor state",
    "c4_state": "c4a compressor state",
    "c128_state": "c128a compressor state",
}


def format_table(rows: Sequence[Mapping], columns: Sequence[str] | None = None) -> str:
    """A plain aligned text table; ints get thousands separators."""
    if not rows:
        return "(empty)"
    columns = list(columns or rows[0].keys())

    def cell(v: object) -> str:
        if isinstance(v, bool) or v is None:
            return str(v)
        return f"{v:,}" if isinstance(v, int) else str(v)

    table = [[str(c) for c in columns]] + [[cell(r[c]) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    lines = [
        "  ".join(
            v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(line, widths))
        )
        for line in table
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _kind(name: str, spec: KVCacheSpec) -> str:
    short = short_name(name, spec)
    return (
        short.split(".", 1)[1]
        if short.startswith("L") and "." in short
        else type(spec).__name__
    )


def _layer_index(name: str) -> int | None:
    try:
        return deepseek_v4.parse_layer_name(name)[0]
    except ValueError:
        return None


# --- pages


def pages_text(rows: Sequence[Mapping]) -> str:
    """The page table (rows from `v4_inventory.page_size_rows`)."""
    return format_table(
        rows,
        [
            "kind",
            "block_size",
            "storage_block_size",
            "entry_bytes",
            "real_page",
            "page",
            "padding",
        ],
    )


def draw_pages(rows: Sequence[Mapping], title: str = "One page per cache kind") -> Figure:
    """Horizontal bars: real bytes of each kind's page, with its alignment padding hatched."""
    fig = Figure(figsize=(MAX_WIDTH, 3.2))
    ax = fig.add_subplot()
    for i, row in enumerate(rows):
        color = KIND_COLORS.get(row["kind"], "#888888")
        ax.barh(i, row["real_page"], color=color)
        ax.barh(
            i,
            row["padding"],
            left=row["real_page"],
            color="white",
            edgecolor=color,
            hatch="////",
        )
        ax.text(
            row["page"] * 1.01 + 300,
            i,
            f"{row['real_page']:,} + {row['padding']:,} = {row['page']:,} B",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(
        range(len(rows)), [KIND_LABELS.get(r["kind"], r["kind"]) for r in rows], fontsize=8
    )
    ax.invert_yaxis()
    ax.set_xlim(0, max(r["page"] for r in rows) * 1.45)
    ax.set_xlabel("bytes per block (hatched: padding up to the alignment)")
    ax.set_title(title)
    fig.tight_layout()
    return fig


# --- grouping


def _ranges(indices: Sequence[int]) -> str:
    """Compact list: [0, 1, 3, 5, 7] -> '0,1..7 step 2'; [4, 5, 6] -> '4-6'."""
    xs = sorted(indices)
    if not xs:
        return "-"
    parts, i = [], 0
    while i < len(xs):
        j = i + 1
        if j < len(xs):
            step = xs[j] - xs[i]
            while j + 1 < len(xs) and xs[j + 1] - xs[j] == step:
                j += 1
        if j < len(xs) and j - i >= 2:
            parts.append(f"{xs[i]}-{xs[j]}" if step == 1 else f"{xs[i]}..{xs[j]} step {step}")
            i = j + 1
        else:
            parts.append(str(xs[i]))
            i += 1
    return ",".join(parts)


def grouping_text(specs: Mapping[str, KVCacheSpec], groups: Sequence[KVCacheGroupSpec]) -> str:
    """Per group: kind, block size, and for each cache kind the decoder layers it covers."""
    lines = []
    for i, g in enumerate(groups):
        by_kind: dict[str, list[int]] = {}
        for name in g.layer_names:
            by_kind.setdefault(_kind(name, specs[name]), []).append(_layer_index(name))
        kinds = [
            f"{k} x{len(v)} at layers {_ranges([x for x in v if x is not None])}"
            for k, v in by_kind.items()
        ]
        eagle = " [eagle]" if g.is_eagle_group else ""
        head = (
            f"G{i} {group_kind(g)} (block {g.block_size}, {len(g.layer_names)} caches){eagle}:"
        )
        one_line = f"{head} {'; '.join(kinds)}"
        # a group with several kinds lists one per line when one line would not fit 95 columns
        lines += [one_line] if len(one_line) <= 95 else [head] + [f"    {k}" for k in kinds]
    return "\n".join(lines)


def _plot_grouping(
    ax, specs: Mapping[str, KVCacheSpec], groups: Sequence[KVCacheGroupSpec]
) -> set[str]:
    """Draw one row per group on `ax`; return the cache kinds that were drawn (for the
    legend)."""
    seen: set[str] = set()
    for row, g in enumerate(groups):
        kinds = list(dict.fromkeys(_kind(name, specs[name]) for name in g.layer_names))
        for name in g.layer_names:
            kind = _kind(name, specs[name])
            x = _layer_index(name)
            if x is None:
                continue
            dy = (kinds.index(kind) - (len(kinds) - 1) / 2) * 0.25
            ax.add_patch(
                Rectangle(
                    (x - 0.4, row + dy - 0.11),
                    0.8,
                    0.22,
                    color=KIND_COLORS.get(kind, "#888888"),
                )
            )
            seen.add(kind)
    ax.set_ylim(len(groups) - 0.5, -0.5)
    ax.set_yticks(
        range(len(groups)),
        [
            f"G{i} {group_kind(g)}\n{len(g.layer_names)} caches, bs {g.block_size}"
            for i, g in enumerate(groups)
        ],
        fontsize=8,
    )
    return seen


def _num_layers(specs: Mapping[str, KVCacheSpec]) -> int:
    return max((_layer_index(n) or 0) for n in specs) + 1


def _legend_below(fig: Figure, handles: list) -> None:
    """The legend under the axes, in columns, inside the figure's width (needs a constrained
    layout)."""
    fig.legend(
        handles=handles,
        fontsize=8,
        loc="outside lower center",
        ncol=min(len(handles), 3),
        frameon=False,
    )


def _kind_legend(fig: Figure, seen: set[str]) -> None:
    _legend_below(
        fig,
        [Patch(color=KIND_COLORS[k], label=KIND_LABELS[k]) for k in KIND_COLORS if k in seen],
    )


def draw_grouping(
    specs: Mapping[str, KVCacheSpec],
    groups: Sequence[KVCacheGroupSpec],
    title: str = "Which layers' caches share a block table",
) -> Figure:
    """One row per group; a mark at each decoder layer whose cache is in the group."""
    fig = Figure(figsize=(MAX_WIDTH, 0.55 * len(groups) + 2.2), layout="constrained")
    ax = fig.add_subplot()
    seen = _plot_grouping(ax, specs, groups)
    ax.set_xlim(-1, _num_layers(specs))
    ax.set_xlabel("decoder layer index")
    _kind_legend(fig, seen)
    ax.set_title(title)
    return fig


def groupings_text(
    models: Mapping[str, tuple[Mapping[str, KVCacheSpec], Sequence[KVCacheGroupSpec]]],
) -> str:
    """`grouping_text` for several models, one titled block each (twin of `draw_groupings`)."""
    return "\n\n".join(
        f"{label}:\n{grouping_text(specs, groups)}"
        for label, (specs, groups) in models.items()
    )


def draw_groupings(
    models: Mapping[str, tuple[Mapping[str, KVCacheSpec], Sequence[KVCacheGroupSpec]]],
    title: str = "Groups of each model, on one layer axis",
) -> Figure:
    """Several models' groupings stacked on a shared layer axis, so their groups can be
    compared."""
    fig = Figure(
        figsize=(
            MAX_WIDTH,
            sum(0.55 * len(groups) + 0.8 for _, groups in models.values()) + 1.6,
        ),
        layout="constrained",
    )
    axes = fig.subplots(
        len(models),
        1,
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": [len(groups) for _, groups in models.values()]},
    )[:, 0]
    seen: set[str] = set()
    for ax, (label, (specs, groups)) in zip(axes, models.items()):
        seen |= _plot_grouping(ax, specs, groups)
        ax.set_title(
            f"{label} ({_num_layers(specs)} layers, {len(specs)} caches)", fontsize=10
        )
    axes[0].set_xlim(-1, max(_num_layers(specs) for specs, _ in models.values()))
    axes[-1].set_xlabel("decoder layer index")
    _kind_legend(fig, seen)
    fig.suptitle(title)
    return fig


# --- approximate gcd


def padding_curve_text(
    values: Sequence[int], lower_bound: int | None = None, show: int = 6
) -> str:
    curve = padding_curve(values, lower_bound)
    best = min(curve, key=lambda d: (curve[d], -d))
    ranked = sorted(curve, key=lambda d: (curve[d], -d))[:show]
    lines = [
        f"values {list(values)}, search d in [{min(curve)}, {max(curve)}]; best d = {best} "
        f"(padding {curve[best]})"
    ]
    lines += [
        f"  d={d:>3}: padding {curve[d]:>3}, groups per value {[-(-x // d) for x in values]}"
        for d in ranked
    ]
    return "\n".join(lines)


def draw_padding_curve(
    values: Sequence[int], lower_bound: int | None = None, title: str | None = None
) -> Figure:
    """Padding (layer slots added by rounding each value up to a multiple of d) against d."""
    curve = padding_curve(values, lower_bound)
    best = min(curve, key=lambda d: (curve[d], -d))
    fig = Figure(figsize=(7, 3))
    ax = fig.add_subplot()
    ax.plot(list(curve), list(curve.values()), marker=".", lw=1)
    ax.scatter(
        [best],
        [curve[best]],
        s=80,
        color="red",
        zorder=3,
        label=f"chosen d = {best}, padding {curve[best]}",
    )
    ax.set_xlabel("d (layer tuples per group)")
    ax.set_ylabel("total padding")
    ax.set_title(title or f"approximate gcd of {list(values)}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --- the packed slab


def _group_pages(
    specs: Mapping[str, KVCacheSpec], group: KVCacheGroupSpec
) -> list[tuple[str, str, int, int, int]]:
    """(name, kind, offset, real bytes, padded page) for each layer of the group."""
    out, offset = [], 0
    for name in group.layer_names:
        spec = group.layer_spec(name)
        out.append(
            (
                name,
                _kind(name, specs.get(name, spec)),
                offset,
                spec.real_page_size_bytes,
                spec.page_size_bytes,
            )
        )
        offset += spec.page_size_bytes
    return out


def _wrap_items(items: Sequence[str], indent: str, width: int = 95) -> list[str]:
    """`items` joined by ", " in lines of at most `width` columns, broken between items."""
    lines: list[str] = []
    line = indent
    for item in items:
        piece = item if line == indent else f", {item}"
        if line != indent and len(line) + len(piece) > width:
            lines.append(line + ",")
            line, piece = indent, item
        line += piece
    if line != indent:
        lines.append(line)
    return lines


def slab_text(
    specs: Mapping[str, KVCacheSpec],
    groups: Sequence[KVCacheGroupSpec],
    first: int = 4,
    upto: int | None = None,
) -> str:
    """One block of the slab: per group its width, padding, unused tail and its first offsets.

    With `upto`, every page that starts below byte `upto` is listed instead, with its padding
    (the text twin of `draw_slab(..., upto=...)`).
    """
    stride = max(g.width_bytes for g in groups)
    lines = [
        f"block stride {stride:,} B (widest group); every group starts at byte 0 of the block"
    ]
    if upto is not None:
        lines.append(f"pages starting below byte {upto:,}:")
    for i, g in enumerate(groups):
        pages = _group_pages(specs, g)
        if upto is None:
            shown = pages[:first]
            items = [f"{short_name(n, specs.get(n))}@{o:,}" for n, _, o, _, _ in shown]
        else:
            shown = [p for p in pages if p[2] < upto]
            items = [
                f"{short_name(n, specs.get(n))}@{o:,} ({r:,} + {p - r} pad)"
                for n, _, o, r, p in shown
            ]
        if len(pages) > len(shown):
            items.append("...")
        padding = sum(p - r for *_, r, p in pages)
        lines.append(
            f"G{i} {group_kind(g):<17} width {g.width_bytes:>9,}  padding {padding:>6,}  "
            f"unused tail {stride - g.width_bytes:>7,}"
        )
        lines += _wrap_items(items, indent="    ")
    return "\n".join(lines)


#: At full scale a page narrower than this fraction of the axis (under 2 px in a notebook
# column) is merged with its same-kind neighbours into one outlined run: drawn one by one, the
# 31 c128a pages of V4-Pro (1,728 B each) were only their black borders, a dark bar no legend
# explained.
THIN_PAGE = 1 / 400


def _page_runs(
    pages: Sequence[tuple[str, str, int, int, int]], end: int, thin: float
) -> list[tuple[str, int, int, int, int]]:
    """(kind, offset, real bytes, drawn bytes, pages) per box to draw: one page, or a run of
    consecutive same-kind pages each narrower than `thin` bytes."""
    runs: list[tuple[str, int, int, int, int]] = []
    for _name, kind, offset, real, page in pages:
        if offset >= end:
            break
        last = runs[-1] if runs else None
        if (
            last is not None
            and page < thin
            and last[0] == kind
            and last[4] > 0
            and last[1] + last[3] == offset
        ):
            runs[-1] = (kind, last[1], last[2] + real, last[3] + page, last[4] + 1)
        else:
            # a wide page is a run of one that nothing joins (marked by a count of 0)
            runs.append((kind, offset, real, page, 1 if page < thin else 0))
    return runs


def draw_slab(
    specs: Mapping[str, KVCacheSpec],
    groups: Sequence[KVCacheGroupSpec],
    title: str | None = None,
    upto: int | None = None,
) -> Figure:
    """One block of the packed slab drawn to scale: a row per group, a box per layer page.

    Solid: bytes a layer really uses (page borders drawn); grey hatch: bytes of the block that
    this group never touches (the block stride is set by the widest group). At full scale the
    alignment padding (at most 560 B of 1.4 MB) is thinner than a pixel, so each page is drawn
    at its reserved (padded) size with no padding mark, the axis counts MB (10^6 B), and
    consecutive pages too thin to draw apart (`THIN_PAGE`) are one outlined box labelled with
    their count. `upto` zooms in on bytes [0, upto), draws the padding in red and labels wide
    pages with their start offset.
    """
    stride = max(g.width_bytes for g in groups)
    end = stride if upto is None else min(upto, stride)
    fig = Figure(figsize=(MAX_WIDTH, 0.6 * len(groups) + 2.4), layout="constrained")
    ax = fig.add_subplot()
    xmax = end * (1.12 if upto is None else 1.0)
    thin = xmax * THIN_PAGE if upto is None else 0
    seen = set()
    for row, g in enumerate(groups):
        for kind, offset, real, page, count in _page_runs(_group_pages(specs, g), end, thin):
            color = KIND_COLORS.get(kind, "#888888")
            # Full width is drawn as the padded page without anti-aliasing, so sub-pixel seams
            # between neighbouring pages do not show up as stray light lines.
            width = real if upto is not None else page
            ax.add_patch(
                Rectangle(
                    (offset, row - 0.35),
                    width,
                    0.7,
                    facecolor=color,
                    edgecolor="black",
                    lw=0.15,
                    antialiased=upto is not None,
                )
            )
            if count > 1:
                short = KIND_LABELS.get(kind, kind).split(" ", 1)[0]
                ax.text(offset, row - 0.37, f"{count} {short} pages", fontsize=8, va="bottom")
            # at full scale padding is under a pixel: not drawn
            if page > real and upto is not None:
                ax.add_patch(
                    Rectangle(
                        (offset + real, row - 0.35),
                        min(page, end - offset) - real,
                        0.7,
                        facecolor=PADDING_COLOR,
                        lw=0,
                    )
                )
            if upto is not None and real > 0.06 * end and offset + 0.1 * end < end:
                ax.text(
                    offset + 0.005 * end, row - 0.42, f"{offset:,}", fontsize=8, va="bottom"
                )
            seen.add(kind)
        if g.width_bytes < end:
            ax.add_patch(
                Rectangle(
                    (g.width_bytes, row - 0.35),
                    stride - g.width_bytes,
                    0.7,
                    facecolor="#eeeeee",
                    edgecolor="#999999",
                    hatch="xx",
                    lw=0.5,
                )
            )
        if upto is None:
            ax.text(stride * 1.005, row, f"{g.width_bytes:,} B", va="center", fontsize=8)
    ax.set_xlim(0, xmax)
    ax.set_ylim(len(groups) - 0.5, -0.75)
    ax.set_yticks(
        range(len(groups)), [f"G{i} {group_kind(g)}" for i, g in enumerate(groups)], fontsize=8
    )
    if upto is None:
        # tick labels in MB rather than matplotlib's "1e6" offset in the corner
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1e6:g}"))
        ax.set_xlabel("byte offset inside one block, in MB (1 MB = 1,000,000 B)")
    else:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
        ax.set_xlabel(f"byte offset inside one block (first {end:,} B only)")
    handles = [
        Patch(color=KIND_COLORS[k], label=KIND_LABELS[k]) for k in KIND_COLORS if k in seen
    ]
    if upto is not None:
        handles.append(Patch(color=PADDING_COLOR, label="alignment padding"))
    if any(g.width_bytes < end for g in groups):
        handles.append(
            Patch(
                facecolor="#eeeeee",
                edgecolor="#999999",
                hatch="xx",
                label="unused by this group",
            )
        )
    _legend_below(fig, handles)
    ax.set_title(title or f"one block of the packed slab, stride {stride:,} B")
    return fig


# --- blocks per budget


def blocks_per_budget_text(bytes_per_block: Mapping[str, int], memory: int) -> str:
    rows = [
        {
            "layout": name,
            "bytes per block": b,
            "blocks": memory // b,
            "usable": max(memory // b - 1, 0),
        }
        for name, b in bytes_per_block.items()
    ]
    return f"budget {memory:,} B\n" + format_table(rows)


def draw_blocks_per_budget(
    bytes_per_block: Mapping[str, int], memory: int, title: str | None = None
) -> Figure:
    """Bar chart: how many blocks each layout fits in the same memory budget."""
    names = list(bytes_per_block)
    blocks = [memory // bytes_per_block[n] for n in names]
    fig = Figure(figsize=(MAX_WIDTH, 0.5 * len(names) + 1.4))
    ax = fig.add_subplot()
    ax.barh(range(len(names)), blocks, color="#4c72b0")
    for i, (n, b) in enumerate(zip(names, blocks)):
        ax.text(
            b, i, f" {b:,} blocks ({bytes_per_block[n]:,} B each)", va="center", fontsize=8
        )
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(blocks) * 1.6)
    ax.set_xlabel("blocks that fit")
    ax.set_title(title or f"blocks in {memory / (1 << 30):g} GiB")
    fig.tight_layout()
    return fig


# --- the Part II primer: one V4 layer, and which caches each token position writes

#: The caches one V4 layer writes, in registration order: (cache kind, who writes it, who reads
# it).
V4_LAYER_CACHES: dict[int, tuple[tuple[str, str, str], ...]] = {
    4: (
        (
            "idx",
            "indexer compressor",
            "indexer: scores every complete c4 entry, keeps the top-k",
        ),
        (
            "idx_state",
            "indexer compressor",
            "the indexer compressor, while its window is open",
        ),
        ("swa", "KV projection (every token)", "attention: the last 128 tokens"),
        ("c4", "compressor (ratio 4)", "attention: only the top-k entries the indexer chose"),
        ("c4_state", "compressor (ratio 4)", "the compressor, while its window is open"),
    ),
    128: (
        ("swa", "KV projection (every token)", "attention: the last 128 tokens"),
        ("c128", "compressor (ratio 128)", "attention: every entry (no indexer)"),
        ("c128_state", "compressor (ratio 128)", "the compressor, while its window is open"),
    ),
    0: (("swa", "KV projection (every token)", "attention: the last 128 tokens"),),
}
_LAYER_NAMES = {
    4: "ratio-4 layer (CSA)",
    128: "ratio-128 layer (HCA)",
    0: "sliding-window-only layer",
}


def _check_ratios(ratios: Sequence[int]) -> None:
    unknown = [r for r in ratios if r not in V4_LAYER_CACHES]
    if not ratios or unknown:
        raise ValueError(
            f"ratios must be a non-empty selection of {sorted(V4_LAYER_CACHES)}, got "
            f"{list(ratios)}"
        )


def v4_layer_text(ratios: Sequence[int] = (4, 128)) -> str:
    """The caches each kind of V4 layer writes, in registration order, with writer and
    reader."""
    _check_ratios(ratios)
    lines = []
    for ratio in ratios:
        lines.append(f"{_LAYER_NAMES[ratio]}: {len(V4_LAYER_CACHES[ratio])} caches")
        for i, (kind, writer, reader) in enumerate(V4_LAYER_CACHES[ratio], start=1):
            lines.append(f"  {i}. {kind:<10} written by {writer}")
            lines.append(f"{'':<16}read by {reader}")  # a second line: listings fit 95 columns
    return "\n".join(lines)


def draw_v4_layer(
    ratios: Sequence[int] = (4, 128), title: str = "What one DeepSeek V4 layer writes"
) -> Figure:
    """One panel per layer kind: writer -> cache (coloured by kind) -> reader, in registration
    order."""
    _check_ratios(ratios)
    heights = [len(V4_LAYER_CACHES[r]) + 1.2 for r in ratios]
    fig = Figure(figsize=(MAX_WIDTH, 0.55 * sum(heights) + 0.9))
    axes = fig.subplots(len(ratios), 1, gridspec_kw={"height_ratios": heights}, squeeze=False)[
        :, 0
    ]
    for ax, ratio in zip(axes, ratios):
        rows = V4_LAYER_CACHES[ratio]
        for i, (kind, writer, reader) in enumerate(rows):
            y = -i
            ax.add_patch(
                Rectangle((0.0, y - 0.38), 3.0, 0.76, facecolor="white", edgecolor="#555555")
            )
            ax.text(1.5, y, writer, ha="center", va="center", fontsize=8)
            ax.annotate(
                "", xy=(3.5, y), xytext=(3.02, y), arrowprops={"arrowstyle": "->", "lw": 1}
            )
            ax.add_patch(
                Rectangle(
                    (3.5, y - 0.38), 2.0, 0.76, facecolor=KIND_COLORS[kind], edgecolor="black"
                )
            )
            ax.text(
                4.5,
                y,
                f"{i + 1}. {kind}",
                ha="center",
                va="center",
                fontsize=9,
                fontweight="bold",
            )
            ax.annotate(
                "", xy=(6.0, y), xytext=(5.52, y), arrowprops={"arrowstyle": "->", "lw": 1}
            )
            ax.text(6.05, y, reader, ha="left", va="center", fontsize=8)
        ax.text(
            0.0,
            0.75,
            _LAYER_NAMES[ratio]
            + "  (writer  ->  cache, numbered in registration order  ->  reader)",
            fontsize=9,
            fontweight="bold",
            va="center",
        )
        ax.set_xlim(0, 12.5)
        ax.set_ylim(-len(rows) + 0.4, 1.1)
        ax.axis("off")
    kinds = [k for r in ratios for k, _, _ in V4_LAYER_CACHES[r]]
    handles = [
        Patch(color=KIND_COLORS[k], label=f"{k}: {KIND_LABELS[k]}")
        for k in dict.fromkeys(kinds)
    ]
    fig.legend(handles=handles, fontsize=8, loc="lower center", ncol=3, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06 + 0.02 * len(handles) / 3, 1, 0.97))
    return fig


def _writes_at(position: int) -> list[tuple[str, str]]:
    """(cache kind, what position `position` writes there) for the caches of a ratio-4 and a
    ratio-128 layer."""
    out = [("swa", f"row {position}"), ("c4_state", "state row"), ("idx_state", "state row")]
    if (position + 1) % 4 == 0:
        j = position // 4
        span = f"tokens {max(0, 4 * j - 4)}..{4 * j + 3}"
        out += [("c4", f"entry {j} ({span})"), ("idx", f"key {j} ({span})")]
    out.append(("c128_state", "state row"))
    if (position + 1) % 128 == 0:
        j = position // 128
        out.append(("c128", f"entry {j} (tokens {128 * j}..{128 * j + 127})"))
    return out


STRIP_ROWS = ("swa", "c4_state", "idx_state", "c4", "idx", "c128_state", "c128")


def position_strip_text(num_positions: int = 16) -> str:
    """For each token position 0..n-1: the caches it writes (ratio-4 and ratio-128 layers):
    its window row and a row of every compressor state, then the entries it closes."""
    if num_positions < 1:
        raise ValueError(f"num_positions must be >= 1, got {num_positions}")
    lines = []
    for p in range(num_positions):
        writes = _writes_at(p)
        states = [kind.removesuffix("_state") for kind, what in writes if what == "state row"]
        line = f"pos {p:>3}: swa {writes[0][1]}, state rows of {', '.join(states)}"
        entries = [
            f"{kind} {what}" if kind != "idx" else f"{kind} {what.split(' (')[0]}"
            for kind, what in writes[1:]
            if what != "state row"
        ]
        lines.append(line + (" | " + ", ".join(entries) if entries else ""))
    return "\n".join(lines)


def draw_position_strip(num_positions: int = 16, title: str | None = None) -> Figure:
    """Token positions left to right, one row per cache: a filled cell where the position
    writes.

    An extra row under the c4 row draws, for each ratio-4 entry, the 8-token window it
    summarises (consecutive windows overlap by 4 tokens, so they alternate between two lines).
    """
    if num_positions < 1:
        raise ValueError(f"num_positions must be >= 1, got {num_positions}")
    n = num_positions
    rows = list(STRIP_ROWS)
    rows.insert(rows.index("c4") + 1, "window")
    fig = Figure(figsize=(min(0.45 * n + 2.4, MAX_WIDTH), 0.5 * len(rows) + 1.7))
    ax = fig.add_subplot()
    for row, kind in enumerate(rows):
        y = -row
        if kind == "window":
            for p in range(3, n, 4):
                j = p // 4
                lo = max(0, 4 * j - 4)
                level = y + 0.22 - 0.44 * (j % 2)
                ax.plot([lo + 0.08, p + 0.92], [level, level], color="black", lw=1.5)
                ax.text(lo + 0.1, level + 0.04, f"entry {j}", fontsize=8, va="bottom")
            continue
        for p in range(n):
            what = dict(_writes_at(p)).get(kind)
            face = KIND_COLORS[kind] if what else "white"
            ax.add_patch(
                Rectangle((p, y - 0.4), 1, 0.8, facecolor=face, edgecolor="#999999", lw=0.5)
            )
            if what and kind in ("c4", "idx", "c128"):
                ax.text(
                    p + 0.5,
                    y,
                    what.split(" (")[0].split()[-1],
                    ha="center",
                    va="center",
                    fontsize=8,
                )
        if kind == "c128" and n < 128:
            ax.text(
                0.2,
                y,
                "nothing yet: entry 0 is written by position 127 (tokens 0..127)",
                va="center",
                fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
            )
    for p in range(n):
        ax.text(p + 0.5, 0.55, str(p), ha="center", va="bottom", fontsize=8)
    labels = [
        KIND_LABELS[k] if k != "window" else "tokens each c4 entry summarises" for k in rows
    ]
    ax.set_yticks([-r for r in range(len(rows))], labels, fontsize=8)
    ax.tick_params(axis="y", length=0)
    ax.set_xticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.set_xlim(0, n)
    ax.set_ylim(-len(rows) + 0.5, 1.1)
    ax.set_title(
        title or "token positions (top): a coloured cell where a position writes that cache",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


# --- one layer's view of the slab


def layer_view_text(name: str, offset: int, page: int, stride: int, num_blocks: int) -> str:
    """Where one layer's page lies in each block: a block stride apart, at the same offset."""
    if offset < 0 or page <= 0 or offset + page > stride:
        raise ValueError(
            f"a page at offset {offset} of {page} B does not fit a {stride} B block"
        )
    if num_blocks < 1:
        raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
    lines = [
        f"{name}: a {page:,} B page per block at offset {offset:,}; blocks {stride:,} B apart"
    ]
    for b in range(num_blocks):
        start = b * stride + offset
        lines.append(f"  block {b}: bytes {start:,}..{start + page - 1:,} of the slab")
    return "\n".join(lines)


def draw_layer_view(
    name: str, offset: int, page: int, stride: int, num_blocks: int, title: str | None = None
) -> Figure:
    """The slab as `num_blocks` consecutive blocks; the layer's page is drawn inside each one.

    Widths are to scale, except that a page narrower than 2 % of a block is widened to stay
    visible (the label gives its true size).
    """
    layer_view_text(name, offset, page, stride, num_blocks)  # validates
    fig = Figure(figsize=(MAX_WIDTH, 2.4))
    ax = fig.add_subplot()
    shown = max(page, 0.02 * stride)
    for b in range(num_blocks):
        ax.add_patch(
            Rectangle((b * stride, 0), stride, 1, facecolor="#eeeeee", edgecolor="black", lw=1)
        )
        ax.text(b * stride + stride / 2, 1.12, f"block {b}", ha="center", fontsize=8)
        ax.add_patch(
            Rectangle(
                (b * stride + offset, 0),
                shown,
                1,
                facecolor="#2ca02c",
                edgecolor="black",
                lw=0.6,
            )
        )
        ax.text(
            b * stride + offset + shown / 2,
            -0.12,
            f"{b * stride + offset:,}",
            ha="center",
            va="top",
            fontsize=8,
        )
    for b in range(num_blocks - 1):
        ax.annotate(
            "",
            xy=((b + 1) * stride + offset, 0.5),
            xytext=(b * stride + offset, 0.5),
            arrowprops={"arrowstyle": "->", "lw": 1},
        )
        ax.text(
            b * stride + offset + stride / 2,
            0.58,
            f"+{stride:,} B (block stride)",
            ha="center",
            fontsize=8,
        )
    ax.set_xlim(0, num_blocks * stride)
    ax.set_ylim(-0.5, 1.4)
    ax.axis("off")
    handles = [
        Patch(color="#2ca02c", label=f"{name}: its page ({page:,} B)"),
        Patch(
            facecolor="#eeeeee",
            edgecolor="black",
            label="the rest of each block (other layers)",
        ),
    ]
    ax.legend(
        handles=handles,
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.25),
        ncol=2,
        frameon=False,
    )
    ax.set_title(
        title or f"one layer's view: {name}, byte offsets of its page in each block",
        fontsize=9,
    )
    fig.tight_layout()
    return fig
