"""Pictures of one engine step: packed tokens, their cache slots, and the blocks attention
reads.

`draw_step_inputs` / `step_inputs_text` take the scheduled sequences and the step's
`Context` (after `ModelRunner.prepare_prefill` or `prepare_decode`) and show
  - the packed batch: every token this step computes, in order, with its position and slot;
  - the physical KV cache as a grid (one row per block, one column per offset): cells written
    this step (solid), cells of the context only read through the block table (grey, dashed
    border), untouched cells (grey).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from refimpl.engine.context import Context
from refimpl.paged.sequence import Sequence
from refimpl.viz.palette import EMPTY, SEQ_COLORS


def _default_label(token_id: int) -> str:
    return str(token_id)


def byte_label(token_id: int) -> str:
    """A short label for a byte-level token: the printable character, else its number."""
    if 33 <= token_id < 127:
        return chr(token_id)
    if token_id == 32:
        return "␣"
    return str(token_id)


def _step_rows(seqs: list[Sequence], ctx: Context, names: Mapping[int, str] | None):
    """Per new token: (name, seq index, position, token id, slot); per cached token: (seq
    index, position, token id, slot), the slot derived from the block table as the model runner
    does."""
    if ctx.slot_mapping is None or ctx.block_tables is None:
        raise ValueError("the context is empty: call prepare_prefill or prepare_decode first")
    slots = ctx.slot_mapping.tolist()
    new, cached = [], []
    for i, seq in enumerate(seqs):
        name = (names or {}).get(seq.seq_id, f"seq {seq.seq_id}")
        for pos in range(seq.num_cached_tokens):
            slot = (
                seq.block_table[pos // seq.block_size] * seq.block_size + pos % seq.block_size
            )
            cached.append((i, pos, seq.token_ids[pos], slot))
        for pos in range(
            seq.num_cached_tokens, seq.num_cached_tokens + seq.num_scheduled_tokens
        ):
            new.append((name, i, pos, seq.token_ids[pos]))
    if len(new) != len(slots):
        raise ValueError(
            f"the context maps {len(slots)} tokens but the sequences schedule {len(new)}"
        )
    return [(*row, slot) for row, slot in zip(new, slots)], cached


def step_inputs_text(
    seqs: list[Sequence],
    ctx: Context,
    names: Mapping[int, str] | None = None,
    label: Callable[[int], str] = _default_label,
) -> str:
    """Text twin of `draw_step_inputs`: the step's tensors and one line per computed token."""
    new, cached = _step_rows(seqs, ctx, names)
    kind = "prefill" if ctx.is_prefill else "decode"
    lines = [f"{kind} step: {len(seqs)} sequences, {len(new)} tokens computed"]
    if ctx.is_prefill:
        lines.append(
            f"cu_seqlens_q = {ctx.cu_seqlens_q.tolist()}   max_seqlen_q = {ctx.max_seqlen_q}"
        )
        lines.append(
            f"cu_seqlens_k = {ctx.cu_seqlens_k.tolist()}   max_seqlen_k = {ctx.max_seqlen_k}"
        )
    else:
        lines.append(f"context_lens = {ctx.context_lens.tolist()}")
    lines.append(f"slot_mapping = {ctx.slot_mapping.tolist()}")
    lines.append(f"block_tables = {ctx.block_tables.tolist()}")
    lines.append("seq      cached  computes positions")
    for seq in seqs:
        name = (names or {}).get(seq.seq_id, f"seq {seq.seq_id}")
        first, last = (
            seq.num_cached_tokens,
            seq.num_cached_tokens + seq.num_scheduled_tokens - 1,
        )
        lines.append(f"{name:<8} {seq.num_cached_tokens:>6}  {first}..{last}")
    lines.append("token  seq      pos  block  offset  slot")
    for name, i, pos, token, slot in new:
        block_size = seqs[i].block_size
        lines.append(
            f"{label(token):<6} {name:<8} {pos:>3}  {slot // block_size:>5}  "
            f"{slot % block_size:>6}  {slot:>4}"
        )
    return "\n".join(lines)


CACHED_COLOR = "#d0d0d0"  # a cached slot: read this step, not written


def draw_step_inputs(
    seqs: list[Sequence],
    ctx: Context,
    num_blocks: int,
    names: Mapping[int, str] | None = None,
    label: Callable[[int], str] = _default_label,
) -> Figure:
    """The packed batch on top, the physical cache grid below (see the module docstring)."""
    new, cached = _step_rows(seqs, ctx, names)
    block_size = seqs[0].block_size
    fig = Figure(figsize=(max(7.0, 0.42 * len(new) + 1.5), 2.3 + 0.3 * num_blocks))
    top, grid = fig.subplots(2, 1, gridspec_kw={"height_ratios": [1.1, 0.34 * num_blocks]})

    for x, (_name, i, pos, token, slot) in enumerate(new):
        color = SEQ_COLORS[i % len(SEQ_COLORS)]
        top.add_patch(Rectangle((x, 0), 0.95, 1, facecolor=color, edgecolor="white"))
        top.text(
            x + 0.47,
            0.62,
            label(token),
            ha="center",
            va="center",
            color="white",
            fontsize=9,
            weight="bold",
        )
        top.text(
            x + 0.47, 0.25, f"p{pos}", ha="center", va="center", color="white", fontsize=8
        )
        top.text(x + 0.47, -0.35, str(slot), ha="center", va="center", fontsize=8)
    top.text(-0.2, -0.35, "slot", ha="right", va="center", fontsize=8)
    top.set_xlim(-1.2, max(len(new), 1))
    top.set_ylim(-0.7, 1.1)
    top.axis("off")
    kind = "prefill" if ctx.is_prefill else "decode"
    top.set_title(
        f"{kind} step: {len(new)} packed tokens (token, position) and the slot each K/V row "
        "is written to",
        fontsize=9,
    )
    grid.set_title(
        "physical KV cache (coloured: written this step; grey, dashed: cached, only read)",
        fontsize=8,
    )

    grid.set_xlim(0, block_size)
    grid.set_ylim(num_blocks, 0)
    for b in range(num_blocks):
        for off in range(block_size):
            grid.add_patch(Rectangle((off, b), 0.95, 0.9, facecolor=EMPTY, edgecolor="white"))
    # A cached slot may be read by several sequences (a shared prefix): draw it once, in a
    # neutral grey, with no hatching so its label stays readable.
    readers: dict[int, tuple[int, int]] = {}
    for _i, pos, token, slot in cached:
        readers.setdefault(slot, (pos, token))
    for slot, (pos, token) in sorted(readers.items()):
        b, off = divmod(slot, block_size)
        grid.add_patch(
            Rectangle(
                (off, b),
                0.95,
                0.9,
                facecolor=CACHED_COLOR,
                edgecolor="#555555",
                linestyle="--",
                linewidth=0.8,
            )
        )
        grid.text(
            off + 0.47,
            b + 0.45,
            f"{label(token)}  p{pos}",
            ha="center",
            va="center",
            fontsize=8,
        )
    for _name, i, pos, token, slot in new:
        b, off = divmod(slot, block_size)
        grid.add_patch(
            Rectangle(
                (off, b),
                0.95,
                0.9,
                facecolor=SEQ_COLORS[i % len(SEQ_COLORS)],
                edgecolor="white",
            )
        )
        grid.text(
            off + 0.47,
            b + 0.45,
            f"{label(token)}  p{pos}",
            ha="center",
            va="center",
            color="white",
            fontsize=8,
        )
    grid.set_yticks(
        [b + 0.45 for b in range(num_blocks)],
        [f"block {b}" for b in range(num_blocks)],
        fontsize=8,
    )
    grid.set_xticks(
        [o + 0.47 for o in range(block_size)], [str(o) for o in range(block_size)], fontsize=8
    )
    grid.set_xlabel("offset in block", fontsize=8)
    grid.tick_params(length=0)
    for side in grid.spines.values():
        side.set_visible(False)
    handles = [
        Patch(
            facecolor=SEQ_COLORS[i % len(SEQ_COLORS)],
            label=(names or {}).get(seq.seq_id, f"seq {seq.seq_id}"),
        )
        for i, seq in enumerate(seqs)
    ]
    handles.append(
        Patch(
            facecolor=CACHED_COLOR,
            edgecolor="#555555",
            linestyle="--",
            label="cached context, only read",
        )
    )
    handles.append(Patch(facecolor=EMPTY, label="not in this step"))
    grid.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.09 - 1.0 / num_blocks),
        ncol=len(handles),
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout()
    return fig
