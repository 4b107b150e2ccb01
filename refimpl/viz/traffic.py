"""Pictures of replayed traffic (`refimpl.simulate`), each with its text twin.

- `draw_sweep(flag, runs)` / `sweep_text`: prefix-cache hit rate for each value of a swept
  flag, beside the trace's infinite-cache upper bound (`runs`: (value, summary dict)).
- `draw_kv_usage(sims)` / `kv_usage_text`: KV cache usage step by step, one line per run
  (`sims`: {label: Simulation}).
- `draw_shared_blocks(trace)` / `shared_blocks_text`: which requests of a Mooncake trace share
  which 512-token blocks (a block drawn in a colour is shared with an earlier request).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from refimpl.viz.palette import EMPTY, MAX_WIDTH, SEQ_COLORS

HIT = "#55a868"
BOUND = "#8c8c8c"


def sweep_text(flag: str, runs) -> str:
    lines = [f"prefix-cache hits by {flag}"]
    for value, s in runs:
        lines.append(
            f"  {value:>12}: hits {100 * s['hit_rate']:5.1f}% of prompt tokens "
            f"(upper bound {100 * s['upper_bound_rate']:.1f}%), "
            f"{s['preemptions']} preemptions"
        )
    return "\n".join(lines)


def draw_sweep(flag: str, runs, reference: tuple[str, float] | None = None) -> Figure:
    """Bars of hit rate per value; a dashed line at the upper bound (and at `reference`,
    (label, share), when given)."""
    fig = Figure(figsize=(MAX_WIDTH - 0.4, 2.8))
    ax = fig.add_subplot()
    labels = [str(v) for v, _ in runs]
    hits = [100 * s["hit_rate"] for _, s in runs]
    bound = 100 * runs[0][1]["upper_bound_rate"]
    bars = ax.bar(
        range(len(runs)), hits, width=0.5, color=HIT, label="hits in the simulated cache"
    )
    for bar, h in zip(bars, hits, strict=True):
        # inside the bar: the bound's line may run just above it
        ax.text(
            bar.get_x() + bar.get_width() / 2,
            h / 2,
            f"{h:.1f}%",
            ha="center",
            va="center",
            fontsize=8,
            color="white",
        )
    ax.axhline(
        bound,
        color=BOUND,
        linestyle="--",
        label=f"infinite cache: {bound:.1f}% (from the trace)",
    )
    top = max(bound, *hits)
    if reference is not None:
        ax.axhline(100 * reference[1], color="#4c72b0", linestyle=":", label=reference[0])
        top = max(top, 100 * reference[1])
    ax.set_xticks(range(len(runs)), labels, fontsize=8)
    ax.set_xlabel(flag, fontsize=8)
    ax.set_ylabel("prompt tokens served\nby the prefix cache (%)", fontsize=8)
    ax.tick_params(axis="y", labelsize=8)
    ax.set_ylim(0, top * 1.45 + 1)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def kv_usage_text(sims: dict, points: int = 6) -> str:
    lines = ["KV cache usage (share of blocks in use) over the replay"]
    for label, sim in sims.items():
        usage = sim.result.steps.kv_usage
        n = len(usage)
        picks = sorted({min(n - 1, round(i * (n - 1) / (points - 1))) for i in range(points)})
        cells = ", ".join(f"step {i}: {100 * usage[i]:.0f}%" for i in picks)
        lines.append(f"  {label}: {cells}")
    return "\n".join(lines)


def draw_kv_usage(sims: dict) -> Figure:
    """One line per run: usage against step."""
    fig = Figure(figsize=(MAX_WIDTH - 0.4, 2.6))
    ax = fig.add_subplot()
    for i, (label, sim) in enumerate(sims.items()):
        usage = [100 * u for u in sim.result.steps.kv_usage]
        ax.plot(
            range(len(usage)),
            usage,
            color=SEQ_COLORS[i % len(SEQ_COLORS)],
            label=label,
            linewidth=1.2,
        )
    ax.set_xlabel("step", fontsize=8)
    ax.set_ylabel("KV blocks in use (%)", fontsize=8)
    ax.set_ylim(0, 105)
    ax.tick_params(labelsize=8)
    ax.legend(
        fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=len(sims), frameon=False
    )
    fig.tight_layout()
    return fig


def _sharing(trace) -> list[list[int]]:
    """Per request, per block: the position in `trace` of the earliest request that had this
    block id (its own position when the block is new)."""
    first: dict[int, int] = {}
    return [[first.setdefault(h, i) for h in r.hash_ids] for i, r in enumerate(trace)]


def shared_blocks_text(trace) -> str:
    lines = ["512-token blocks each request shares with an earlier one"]
    for i, (r, row) in enumerate(zip(trace, _sharing(trace), strict=True)):
        shared = [j for j in row if j != i]
        if shared:
            owners = sorted(set(shared))
            lines.append(
                f"  {r.request_id}: {len(shared)} of {len(row)} blocks, first seen in "
                + ", ".join(trace[j].request_id for j in owners)
            )
        else:
            lines.append(f"  {r.request_id}: none of {len(row)} blocks")
    return "\n".join(lines)


def draw_shared_blocks(trace) -> Figure:
    """A row per request, a cell per 512-token block: grey when the block is new, in the
    colour of the earlier request that first had it otherwise."""
    rows = _sharing(trace)
    width = max(len(r) for r in rows)
    fig = Figure(figsize=(MAX_WIDTH - 0.4, 1.0 + 0.2 * len(rows)))
    ax = fig.add_subplot()
    owners = sorted({j for i, row in enumerate(rows) for j in row if j != i})
    if len(owners) > len(SEQ_COLORS):
        raise ValueError(
            f"{len(owners)} requests are shared from; the figure has {len(SEQ_COLORS)} "
            "colours "
            "(draw fewer requests)"
        )
    colour = {j: SEQ_COLORS[k] for k, j in enumerate(owners)}
    for i, row in enumerate(rows):
        for b, j in enumerate(row):
            ax.add_patch(_rect(b, i, EMPTY if j == i else colour[j]))
    ax.set_xlim(0, width)
    ax.set_ylim(len(rows), 0)
    ax.set_yticks(
        [i + 0.4 for i in range(len(rows))], [r.request_id for r in trace], fontsize=8
    )
    ax.set_xlabel("512-token block of the prompt", fontsize=8)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.tick_params(axis="x", labelsize=8)
    handles = [Patch(facecolor=EMPTY, label="new block")] + [
        Patch(facecolor=colour[j], label=f"first in {trace[j].request_id}") for j in owners
    ]
    ax.legend(
        handles=handles,
        fontsize=8,
        loc="lower left",
        bbox_to_anchor=(0, 1.0),
        ncol=min(5, len(handles)),
        frameon=False,
    )
    fig.tight_layout()
    return fig


def _rect(x: float, y: float, color: str) -> Rectangle:
    return Rectangle((x, y), 0.9, 0.8, facecolor=color, edgecolor="none")
