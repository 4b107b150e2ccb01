"""Pictures of the tiny DeepSeek V4 engine's cache, each with a deterministic text twin.

- `slot_table_text`: the slot each position writes in each cache of one layer;
- `draw_hit_reads` / `hit_reads_text`: which rows of the blocks a 256-token prefix hit reused
  were read again while the new request ran;
- `engine_snapshot`, `draw_engine_state` / `engine_state_text`: one step of the engine (tokens
  computed and blocks held per request), the frames of the chapter's stepper.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from refimpl.hybrid import deepseek_v4
from refimpl.hybrid.addressing import NO_SLOT, compressed_slot_for_position, slot_for_position
from refimpl.viz.hybrid_layout import format_table
from refimpl.viz.palette import EMPTY, MAX_WIDTH

READ_COLOR = "#4c72b0"
KEPT_COLOR = "#b0b0b0"
KINDS = ("swa", "attn", "attn_state", "idx", "idx_state")


def _label(name: str, ratio: int) -> str:
    layer, kind = deepseek_v4.parse_layer_name(name)
    words = {
        "swa": "window kv",
        "attn": f"c{ratio} entries",
        "idx": "indexer entries",
        "attn_state": "compressor state",
        "idx_state": "indexer state",
    }[kind]
    return f"L{layer} {words}"


def slot_table_text(
    layer_caches, tables: Sequence[Sequence[int]], positions: Sequence[int]
) -> str:
    """For each position: the slot its row takes in every per-token cache of the layer, and the
    compressed-entry slot it writes when it closes a window (`-` when it closes none)."""
    rows = []
    for p in positions:
        row = {"position": p}
        for kind in KINDS:
            ref = getattr(layer_caches, kind)
            if ref is None:
                continue
            table = tables[ref.group]
            if ref.ratio == 1:
                value = slot_for_position(table, p, ref.block_size)
            else:
                slot = compressed_slot_for_position(table, p, ref.block_size, ref.ratio)
                value = f"e{p // ref.ratio}->{slot}" if slot != NO_SLOT else "-"
            row[kind] = value
        rows.append(row)
    return format_table(rows)


def _selected(summary: dict, layers: Sequence[int]) -> list[tuple[str, dict]]:
    out = []
    for name, info in summary["caches"].items():
        if deepseek_v4.parse_layer_name(name)[0] in layers:
            out.append((name, info))
    return out


def hit_reads_text(summary: dict, layers: Sequence[int]) -> str:
    """Per cache: rows reused by the hit, and how many of them the new request read."""
    rows = []
    for name, info in _selected(summary, layers):
        unit = "entries" if info["ratio"] > 1 else "positions"
        reused, read = info["reused"], info["read"]
        span = f"{reused[0]}..{reused[-1]}" if reused else "none"
        read_span = f"{read[0]}..{read[-1]}" if read else "none"
        rows.append(
            {
                "cache": _label(name, info["ratio"]),
                "unit": unit,
                "reused": len(reused),
                "reused span": span,
                "read": len(read),
                "read span": read_span,
            }
        )
    return f"prefix hit: {summary['hit']} tokens\n" + format_table(rows)


def draw_hit_reads(summary: dict, layers: Sequence[int], start: int = 192) -> Figure:
    """One row per cache, token positions start..hit on x: reused rows read again (blue),
    reused but never read (grey); compressed entry j of ratio r drawn over the r positions
    r*j..r*j+r-1 of the window it closes."""
    selected = _selected(summary, layers)
    hit = summary["hit"]
    legend_h = 0.3  # inches under the axes for the legend
    fig = Figure(figsize=(MAX_WIDTH, 0.42 * len(selected) + 1.45 + legend_h))
    ax = fig.add_subplot()
    for y, (_name, info) in enumerate(reversed(selected)):
        ratio = info["ratio"]
        read = set(info["read"])
        ax.add_patch(
            Rectangle((start, y + 0.1), hit - start, 0.8, facecolor=EMPTY, edgecolor="none")
        )
        for index in info["reused"]:
            lo = index * ratio if ratio > 1 else index
            width = ratio if ratio > 1 else 1
            if lo + width <= start:
                continue
            color = READ_COLOR if index in read else KEPT_COLOR
            ax.add_patch(
                Rectangle(
                    (max(lo, start), y + 0.1),
                    lo + width - max(lo, start),
                    0.8,
                    facecolor=color,
                    edgecolor="white",
                    linewidth=0.3,
                )
            )
        block = info["block_size"]
        for b in range(start - start % block, hit + 1, block):
            if b >= start:
                ax.plot([b, b], [y + 0.05, y + 0.95], color="black", linewidth=0.8)
    ax.set_yticks([y + 0.5 for y in range(len(selected))])
    ax.set_yticklabels([_label(n, i["ratio"]) for n, i in reversed(selected)], fontsize=9)
    ax.set_xlim(start, hit)
    ax.set_ylim(0, len(selected))
    ax.set_xticks(list(range(start, hit + 1, 8)))
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel(
        "token position (entry j of ratio r drawn over positions r*j..r*j+r-1, the window "
        "it closes)\nblack lines: block boundaries",
        fontsize=9,
    )
    ax.set_title(
        f"A {hit}-token prefix hit: which reused rows the new request reads (positions "
        f"{start}..{hit - 1})",
        fontsize=10,
    )
    fig.legend(
        handles=[
            Patch(color=READ_COLOR, label="reused, read again"),
            Patch(color=KEPT_COLOR, label="reused, never read"),
            Patch(color=EMPTY, label="not kept (left the window)"),
        ],
        loc="lower center",
        ncol=3,
        fontsize=9,
        frameon=False,
    )
    fig.tight_layout(rect=(0, legend_h / fig.get_figheight(), 1, 1))
    return fig


def engine_snapshot(llm, requests: Sequence, names: Sequence[str]) -> tuple:
    """An immutable copy of what a step changes: per request (name, status, prompt tokens,
    computed tokens, generated tokens, live blocks per group), then the free block count."""
    manager = llm.scheduler.kv_cache_manager
    rows = []
    for name, req in zip(names, requests):
        r = req.request
        held = manager.get_blocks(r.request_id).blocks if r.status.value == "running" else ()
        live = tuple(sum(1 for b in table if not b.is_null) for table in held)
        rows.append(
            (
                name,
                r.status.value,
                r.num_prompt_tokens,
                r.num_computed_tokens,
                len(r.output_token_ids),
                live,
            )
        )
    return (tuple(rows), manager.block_pool.get_num_free_blocks())


def engine_state_text(state: tuple) -> str:
    rows, free = state
    lines = []
    for name, status, prompt, computed, generated, live in rows:
        blocks = "/".join(map(str, live)) if live else "-"
        lines.append(
            f"{name}: {status:<8} prompt {prompt:>3}, kv computed or cached {computed:>3}, "
            f"generated {generated}, live blocks/group {blocks}"
        )
    lines.append(f"free blocks: {free}")
    return "\n".join(lines)


def draw_engine_state(state: tuple) -> Figure:
    """One bar per request: prompt tokens computed (dark), still to compute (light), generated
    (orange)."""
    rows, free = state
    fig = Figure(figsize=(MAX_WIDTH, 0.5 * len(rows) + 1.0))
    ax = fig.add_subplot()
    longest = max(prompt + generated for _, _, prompt, _, generated, _ in rows) + 1
    for y, (_name, status, prompt, computed, generated, _live) in enumerate(reversed(rows)):
        done = min(computed, prompt)
        ax.barh(y, done, color=READ_COLOR, height=0.6)
        ax.barh(
            y,
            prompt - done,
            left=done,
            color=EMPTY,
            height=0.6,
            edgecolor="#999999",
            linewidth=0.5,
        )
        ax.barh(y, generated, left=prompt, color="#dd8452", height=0.6)
        ax.text(longest, y, f" {status}", va="center", fontsize=9)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in reversed(rows)], fontsize=9)
    ax.set_xlim(0, longest * 1.15)
    ax.set_xlabel(f"tokens (free blocks in the pool: {free})", fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(
        handles=[
            Patch(color=READ_COLOR, label="prompt computed or cached"),
            Patch(facecolor=EMPTY, edgecolor="#999999", label="prompt still to compute"),
            Patch(color="#dd8452", label="generated"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35),
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout()
    return fig
