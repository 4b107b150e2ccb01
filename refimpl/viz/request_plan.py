"""One model's KV cache plan as a picture: the blocks one request at the maximum length holds
in each group, with its text twin.

`draw_request_plan(plan, title)` / `request_plan_text(plan, title)` take the typed plan
`refimpl.models.plan_model` returns (or the dict of `plan --config ... --json`). One bar per
group, as long as the blocks it reserves for a request at the maximum length and coloured by
the kind of layer; the title gives what the startup line reports (blocks / blocks per request).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from refimpl.viz.palette import MAX_WIDTH

#: The kinds of group a `plan --config` layout has, and how the figure names them.
KIND_STYLE = {
    "FullAttentionSpec": ("#4c72b0", "full attention: every token"),
    "SlidingWindowSpec": ("#dd8452", "sliding window + tokens in flight"),
    "MLAAttentionSpec": ("#8172b3", "MLA: every token, one latent row"),
    "ChunkedLocalAttentionSpec": ("#937860", "chunked local attention"),
    "MambaSpec": ("#55a868", "Mamba: states, not tokens"),
}
_OTHER = ("#8c8c8c", "other")


def _as_dict(plan) -> dict:
    return plan.to_dict() if hasattr(plan, "to_dict") else plan


def _summary(plan: dict) -> str:
    per_request = plan["blocks_per_request"]
    gib = per_request * plan["bytes_per_block"] / (1 << 30)
    return (
        f"{plan['num_blocks']:,} blocks / {per_request:,} per request = "
        f"{plan['max_concurrency']:.2f}x at {plan['max_model_len']:,} tokens "
        f"({gib:.2f} GiB per request)"
    )


def request_plan_text(plan, title: str) -> str:
    """The figure's facts as lines: one per group, then the startup figures."""
    plan = _as_dict(plan)
    lines = [f"{title}: blocks one request at {plan['max_model_len']:,} tokens holds"]
    for i, group in enumerate(plan["groups"]):
        lines.append(
            f"  group {i}  {group['kind']:<20} {group['num_layers']:>3} layers  "
            f"{group['blocks_per_request']:>6,} blocks of {group['block_size']} tokens"
        )
    lines.append(_summary(plan))
    return "\n".join(lines)


def draw_request_plan(plan, title: str) -> Figure:
    """Bars: the blocks each group reserves for one request at the maximum length."""
    plan = _as_dict(plan)
    groups = plan["groups"]
    n = len(groups)
    fig = Figure(figsize=(MAX_WIDTH - 0.4, 1.5 + 0.3 * n))
    ax = fig.add_subplot()
    widest = max(g["blocks_per_request"] for g in groups)
    for i, group in enumerate(groups):
        colour, _ = KIND_STYLE.get(group["kind"], _OTHER)
        blocks = group["blocks_per_request"]
        ax.barh(i, blocks, color=colour, height=0.7)
        ax.text(
            blocks + widest * 0.01,
            i,
            f"{blocks:,} blocks, {group['num_layers']} layers",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(range(n), [f"group {i}" for i in range(n)], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, widest * 1.45)
    ax.set_ylim(n - 0.5, -0.5 - (0.9 if n > 2 else 0.6))
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel(
        f"blocks one request at {plan['max_model_len']:,} tokens holds "
        f"(block = {plan['bytes_per_block'] / (1 << 20):.2f} MiB over all groups)",
        fontsize=9,
    )
    ax.set_title(f"{title}: {_summary(plan)}", fontsize=9, loc="left")
    kinds = list(dict.fromkeys(g["kind"] for g in groups))
    ax.legend(
        handles=[Patch(color=KIND_STYLE.get(k, _OTHER)[0]) for k in kinds],
        labels=[KIND_STYLE.get(k, _OTHER)[1] for k in kinds],
        fontsize=8,
        loc="upper right",
        ncol=len(kinds),
        frameon=False,
    )
    fig.tight_layout()
    return fig
