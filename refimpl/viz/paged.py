"""Pictures of Part I's paged KV cache, each with a text twin that prints the same state.

- `draw_block_pool` / `block_pool_text`: physical blocks (ref count, short hash, fill),
  the free-queue order, and every sequence's logical -> physical block table.
- `pool_snapshot`, `draw_pool_snapshot` / `pool_snapshot_text`: the same picture of a frozen
  copy of that state, which `draw_block_pool` draws and the steppers of chapters 03-04 record.
- `draw_prefix_lookup` / `prefix_lookup_text`: chapter 04's lookup flow (hash ->
  hash_to_block_id
  -> token check -> in use / pulled from the free queue / miss) above the pool and free queue.
- `draw_prefix_match` / `prefix_match_text`: what prefix matching does with each logical
  block of one request (from `refimpl.course.prefix_match.explain_prefix_match`).
- `draw_fragmentation` / `fragmentation_text`: notebook 01's reserve-max vs paged memory.
- `draw_reusable_tokens` / `reusable_tokens_text`: cached-prefix reuse against block size.

Figures are built with `matplotlib.figure.Figure` (not pyplot) so nothing leaks or shows twice.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from refimpl.course import running_example
from refimpl.course.fragmentation import MemoryUse, RequestLengths, format_memory_table
from refimpl.course.paged_scenarios import reusable_prefix_tokens
from refimpl.course.prefix_match import MatchOutcome, PrefixMatch
from refimpl.paged.block_manager import BlockManager
from refimpl.paged.sequence import Sequence
from refimpl.viz.palette import EMPTY, MAX_WIDTH, SEQ_COLORS, fits

FREE_CACHED = "#b7e4c7"
#: Background requests in a picture about one subject: drawn quietly.
MUTED = "#d9d9d9"
OUTCOME_COLORS = {
    MatchOutcome.HIT_IN_USE: "#4c72b0",
    MatchOutcome.HIT_FREE: "#55a868",
    MatchOutcome.MISS: "#c44e52",
    MatchOutcome.NOT_LOOKED_UP: "#bbbbbb",
    MatchOutcome.LAST_BLOCK: "#dd8452",
}


def short_hash(h: int | None, digits: int = 4) -> str:
    """The first hex digits of a 64-bit block hash, or '-' for no hash."""
    if h is None or h == -1:
        return "-"
    return f"{h:016x}"[:digits]


def _named(seqs: Mapping[str, Sequence] | Iterable[Sequence]) -> list[tuple[str, Sequence]]:
    if isinstance(seqs, Mapping):
        return list(seqs.items())
    return [(f"seq {s.seq_id}", s) for s in seqs]


def _pool_rows(bm: BlockManager, named: list[tuple[str, Sequence]]):
    """Per physical block: (holders, tokens held) derived from the block tables."""
    holders: dict[int, list[str]] = {b.block_id: [] for b in bm.blocks}
    filled: dict[int, int] = {}
    for name, seq in named:
        for i, block_id in enumerate(seq.block_table):
            holders[block_id].append(name)
            filled[block_id] = max(0, min(bm.block_size, len(seq) - i * bm.block_size))
    queue_pos = {b: i for i, b in enumerate(bm.free_block_ids)}
    return holders, filled, queue_pos


def block_pool_text(
    bm: BlockManager, seqs: Mapping[str, Sequence] | Iterable[Sequence]
) -> str:
    """Text twin of `draw_block_pool`: one line per block, the free queue, and each block
    table."""
    named = _named(seqs)
    holders, filled, queue_pos = _pool_rows(bm, named)
    lines = [
        f"pool: {bm.num_blocks} blocks x {bm.block_size} tokens | used "
        f"{len(bm.used_block_ids)}, "
        f"free {len(bm.free_block_ids)}, cached hashes {len(bm.hash_to_block_id)}",
        "block  ref  hash  tokens  state",
    ]
    for block in bm.blocks:
        b = block.block_id
        if b in queue_pos:
            state = (
                "free, cached" if block.hash != -1 else "free"
            ) + f" (queue position {queue_pos[b]})"
            tokens = f"{len(block.token_ids)}/{bm.block_size}" if block.hash != -1 else "-"
        else:
            state = "in use by " + ", ".join(holders[b]) if holders[b] else "in use"
            tokens = f"{filled[b]}/{bm.block_size}" if b in filled else "?"
        lines.append(
            f"{'#' + str(b):>5} {block.ref_count:>4}  {short_hash(block.hash):<4}  "
            f"{tokens:<6}  {state}"
        )
    lines.append(
        "free queue (head -> tail): "
        + (" ".join(f"#{b}" for b in bm.free_block_ids) or "empty")
    )
    for name, seq in named:
        table = " ".join(f"L{i}->#{b}" for i, b in enumerate(seq.block_table)) or "no blocks"
        lines.append(f"{name}: {table}  (len {len(seq)}, cached {seq.num_cached_tokens})")
    return "\n".join(lines)


def draw_block_pool(
    bm: BlockManager,
    seqs: Mapping[str, Sequence] | Iterable[Sequence],
    *,
    title: str | None = None,
    muted: Iterable[str] = (),
) -> Figure:
    """The picture of `draw_pool_snapshot` for the pool as it is now (`block_pool_text` is its
    twin)."""
    return draw_pool_snapshot(pool_snapshot(bm, dict(_named(seqs))), title=title, muted=muted)


# --- snapshots of the pool (pictures of one moment, and the frames of the steppers)
@dataclass(frozen=True)
class BlockSnapshot:
    """One physical block after a call: who references it and what the prefix cache knows of
    it."""

    block_id: int
    ref_count: int
    hash: int  # -1: not registered
    # the registered tokens (empty until the block is full and hashed)
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class PoolSnapshot:
    """The BlockManager and its sequences' block tables, frozen after one call."""

    block_size: int
    blocks: tuple[BlockSnapshot, ...]
    tables: tuple[tuple[str, tuple[int, ...]], ...]  # (name, block table), in name order given
    lengths: tuple[tuple[str, int], ...]  # (name, len(seq))
    free_queue: tuple[int, ...]  # head first
    cached: int  # entries in hash_to_block_id

    def holders(self, block_id: int) -> list[str]:
        """The names whose block tables point at `block_id`."""
        return [name for name, table in self.tables if block_id in table]

    def filled(self, block_id: int) -> int:
        """How many of the block's slots its holders' tokens occupy (0 for a block no one
        holds)."""
        lengths = dict(self.lengths)
        return max(
            [
                min(self.block_size, lengths[name] - table.index(block_id) * self.block_size)
                for name, table in self.tables
                if block_id in table
            ]
            + [0]
        )


def pool_snapshot(bm: BlockManager, seqs: Mapping[str, Sequence]) -> PoolSnapshot:
    """Copy the state of `bm` and the named sequences (names, not global seq ids) into frozen
    tuples, so a recorded frame keeps its state while the objects move on."""
    blocks = tuple(
        BlockSnapshot(b.block_id, b.ref_count, b.hash, tuple(b.token_ids)) for b in bm.blocks
    )
    tables = tuple((name, tuple(seq.block_table)) for name, seq in seqs.items())
    lengths = tuple((name, len(seq)) for name, seq in seqs.items())
    return PoolSnapshot(
        bm.block_size,
        blocks,
        tables,
        lengths,
        tuple(bm.free_block_ids),
        len(bm.hash_to_block_id),
    )


def pool_snapshot_text(state: PoolSnapshot) -> str:
    """Text twin of `draw_pool_snapshot`: one line per block, the free queue, each block
    table."""
    queue_pos = {b: i for i, b in enumerate(state.free_queue)}
    lines = [
        f"pool: {len(state.blocks)} blocks x {state.block_size} tokens | free "
        f"{len(state.free_queue)}, "
        f"cached hashes {state.cached}",
        "block  ref  hash  registered tokens  state",
    ]
    for block in state.blocks:
        b = block.block_id
        tokens = " ".join(map(str, block.token_ids)) or "-"
        if b in queue_pos:
            state_text = (
                "free, cached" if block.hash != -1 else "free"
            ) + f" (queue position {queue_pos[b]})"
        else:
            state_text = "in use by " + ", ".join(state.holders(b))
        lines.append(
            f"{'#' + str(b):>5} {block.ref_count:>4}  {short_hash(block.hash):<4}  "
            f"{tokens:<17}  {state_text}"
        )
    lines.append(
        "free queue (head -> tail): "
        + (" ".join(f"#{b}" for b in state.free_queue) or "empty")
    )
    lengths = dict(state.lengths)
    for name, table in state.tables:
        shown = " ".join(f"L{i}->#{b}" for i, b in enumerate(table)) or "no blocks"
        lines.append(f"{name}: {shown}  (len {lengths[name]})")
    return "\n".join(lines)


def draw_pool_snapshot(
    state: PoolSnapshot, *, title: str | None = None, muted: Iterable[str] = ()
) -> Figure:
    """Block tables (top), the physical pool (middle) and the free queue (bottom) of one
    snapshot.

    A block's colour is its first holder's; a shared block (ref > 1) gets a thick black border
    and its holders written under it; green = freed but still cached; grey = free and empty.
    `muted`: names drawn in light grey (background requests), so the subject stands out. The
    legend lists only what occurs in the picture.
    """
    muted = set(muted)
    names = [name for name, _ in state.tables if name not in muted]
    # The running example's users keep their colours in every chapter; other names follow them.
    order = list(running_example.NAMES) + [
        name for name in names if name not in running_example.NAMES
    ]
    colour_of = {name: SEQ_COLORS[order.index(name) % len(SEQ_COLORS)] for name in names}
    colour_of.update({name: MUTED for name in muted})
    n = len(state.blocks)
    queue_pos = {b: i for i, b in enumerate(state.free_queue)}
    width = max(n, sum(max(len(t), 1) + 0.5 for _, t in state.tables))
    # inches per block: the widest pool still fits a column
    unit = min(0.8, MAX_WIDTH / (width + 1.75))
    box_pt = 0.9 * unit * 72
    fig = Figure(figsize=(max(7.0, unit * (width + 1.75)), 4.4))
    ax = fig.add_subplot()
    ax.set_xlim(-1.6, width + 0.1)
    ax.set_ylim(-2.0, 3.5)
    ax.axis("off")

    ax.text(-0.1, 0.6, "pool", ha="right", va="center", fontsize=9)
    present = set()
    for block in state.blocks:
        b = block.block_id
        owners = state.holders(b)
        if b in queue_pos:
            face, kind = (FREE_CACHED, "cached") if block.hash != -1 else (EMPTY, "empty")
            present.add(kind)
        else:
            face = colour_of[owners[0]] if owners else "#999999"  # held by a request not shown
        shared = block.ref_count > 1
        ax.add_patch(
            Rectangle(
                (b + 0.05, 0),
                0.9,
                1.2,
                facecolor=face,
                edgecolor="black",
                linewidth=3.0 if shared else 1.0,
                zorder=3,
            )
        )
        ink = "white" if face in SEQ_COLORS else "black"
        ax.text(
            b + 0.5,
            1.0,
            f"#{b}",
            ha="center",
            va="center",
            fontsize=10,
            weight="bold",
            color=ink,
            zorder=4,
        )
        ax.text(
            b + 0.5,
            0.74,
            f"ref {block.ref_count}",
            ha="center",
            va="center",
            fontsize=8,
            color=ink,
            zorder=4,
        )
        ax.text(
            b + 0.5,
            0.3,
            _block_content(block, state, box_pt),
            ha="center",
            va="center",
            fontsize=8,
            family="monospace",
            color=ink,
            zorder=4,
            linespacing=1.0,
        )
        if shared:
            present.add("shared")
            ax.text(
                b + 0.5,
                -0.18,
                "+".join(owners),
                ha="center",
                va="center",
                fontsize=8,
                zorder=4,
            )
    # free queue: the ids in order, head first
    ax.text(-0.1, -1.1, "free queue\nhead \u2192 tail", ha="right", va="center", fontsize=8)
    for position, b in enumerate(state.free_queue):
        block = state.blocks[b]
        face = FREE_CACHED if block.hash != -1 else EMPTY
        ax.add_patch(
            Rectangle(
                (position * 0.8 + 0.05, -1.4),
                0.7,
                0.6,
                facecolor=face,
                edgecolor="#2d6a4f",
                zorder=3,
            )
        )
        ax.text(
            position * 0.8 + 0.4, -1.1, f"#{b}", ha="center", va="center", fontsize=8, zorder=4
        )
    if not state.free_queue:
        ax.text(0.05, -1.1, "empty", ha="left", va="center", fontsize=8)

    y, x = 2.2, 0.0
    lengths = dict(state.lengths)
    ax.text(-0.1, y + 0.3, "block\ntables", ha="right", va="center", fontsize=9)
    for name, table in state.tables:
        colour = colour_of[name]
        span = max(len(table), 1)
        quiet = name in muted
        label = f"{name} ({lengths[name]} tok)" if table else f"{name}: no blocks"
        ax.text(
            x + span / 2,
            y + 0.95,
            label,
            ha="center",
            va="center",
            fontsize=8,
            color="#777777" if quiet else colour,
            weight="normal" if quiet else "bold",
        )
        for i, b in enumerate(table):
            ax.add_patch(
                Rectangle(
                    (x + i + 0.1, y),
                    0.8,
                    0.6,
                    facecolor="white",
                    edgecolor=colour,
                    linewidth=1 if quiet else 2,
                    zorder=3,
                )
            )
            ax.text(
                x + i + 0.5,
                y + 0.3,
                f"L{i}\u2192#{b}",
                ha="center",
                va="center",
                fontsize=8,
                zorder=4,
                color="#777777" if quiet else "black",
            )
            ax.add_patch(
                FancyArrowPatch(
                    (x + i + 0.5, y),
                    (b + 0.5, 1.2),
                    arrowstyle="-|>",
                    mutation_scale=9,
                    color=colour,
                    alpha=0.5 if quiet else 0.6,
                    linewidth=0.8 if quiet else 1.1,
                    zorder=2,
                )
            )
        x += span + 0.5
    legend = [
        Patch(facecolor=colour_of[name], label=name)
        for name, table in state.tables
        if table and name not in muted
    ]
    if muted:
        legend.append(Patch(facecolor=MUTED, edgecolor="black", label="other requests"))
    if "shared" in present:
        legend.append(
            Patch(
                facecolor="white", edgecolor="black", linewidth=3.0, label="shared (ref > 1)"
            )
        )
    if "cached" in present:
        legend.append(Patch(facecolor=FREE_CACHED, edgecolor="black", label="free, hash kept"))
    if "empty" in present:
        legend.append(Patch(facecolor=EMPTY, edgecolor="black", label="free, empty"))
    ax.legend(
        handles=legend,
        loc="lower right",
        fontsize=8,
        ncol=3,
        frameon=False,
        bbox_to_anchor=(1.0, -0.02),
    )
    if title:
        ax.set_title(title, fontsize=10)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.9, bottom=0.02)
    return fig


def _block_content(block: BlockSnapshot, state: PoolSnapshot, box_pt: float) -> str:
    """What a pool block shows inside: its registered tokens in two lines when they fit;
    otherwise, and for a block that is held but not registered yet, how many of its slots are
    filled."""
    tokens = block.token_ids
    if tokens:
        half = (len(tokens) + 1) // 2
        lines = [" ".join(map(str, tokens[:half])), " ".join(map(str, tokens[half:]))]
        if all(fits(line, box_pt) for line in lines):
            return "\n".join(lines)
        return f"{len(tokens)}/{state.block_size}\nfull"
    filled = state.filled(block.block_id)
    return f"{filled}/{state.block_size}\nfilled" if filled else ""


# --- prefix match
def _tokens_text(tokens: Seq[int], limit: int = 6) -> str:
    if len(tokens) <= limit:
        return "[" + " ".join(map(str, tokens)) + "]"
    return f"[{tokens[0]} {tokens[1]} .. {tokens[-1]}] ({len(tokens)} tokens)"


def _effect(b) -> str:
    if b.block_id is None:
        return "does not fit"
    if b.outcome is MatchOutcome.HIT_IN_USE:
        return f"#{b.block_id} shared, ref {b.ref_count_before}->{b.ref_count_after}"
    if b.outcome is MatchOutcome.HIT_FREE:
        return f"#{b.block_id} leaves the free queue, ref 0->1"
    return f"#{b.block_id} from the free-queue head"


def prefix_match_text(match: PrefixMatch) -> str:
    """Text twin of `draw_prefix_match`: one line per logical block, then the totals."""
    m = match
    lines = [
        f"request: {m.num_tokens} tokens, block_size {m.block_size}, {len(m.blocks)} blocks"
    ]
    for b in m.blocks:
        lines.append(
            f"L{b.index} {_tokens_text(b.token_ids):<22} hash {short_hash(b.hash):<4}  "
            f"{b.outcome.value:<13}  {_effect(b)}"
        )
        if b.outcome is MatchOutcome.MISS or b.outcome is MatchOutcome.LAST_BLOCK:
            lines.append(f"   ({b.reason})")
    verdict = (
        f"fits, can_allocate = {m.can_allocate}"
        if m.fits
        else "does not fit, can_allocate = -1"
    )
    lines.append(
        f"cached blocks: {m.num_cached_blocks} ({m.num_cached_blocks * m.block_size} tokens); "
        f"free blocks needed {m.num_free_blocks_needed} of {m.num_free_blocks} free -> "
        f"{verdict}"
    )
    return "\n".join(lines)


def draw_prefix_match(match: PrefixMatch, *, title: str | None = None) -> Figure:
    """One box per logical block, coloured by what matching does with it, with the chained hash
    under each looked-up block and the physical block it ends up in."""
    m = match
    n = len(m.blocks)
    # inches per x unit (a block's column is 2 units)
    unit = min(1.0, (MAX_WIDTH - 1.0) / (2.0 * n))
    fig = Figure(figsize=(max(6.0, 2.0 * n * unit + 1.0), 3.2))
    ax = fig.add_subplot()
    ax.set_xlim(-0.1, 2.0 * n)
    ax.set_ylim(-1.0, 2.1)
    ax.axis("off")
    for b in m.blocks:
        x = 2.0 * b.index
        colour = OUTCOME_COLORS[b.outcome]
        ax.add_patch(
            Rectangle((x + 0.1, 0), 1.7, 1.2, facecolor=colour, edgecolor="black", alpha=0.9)
        )
        ax.text(
            x + 0.95,
            0.95,
            f"L{b.index}",
            ha="center",
            va="center",
            fontsize=11,
            weight="bold",
            color="white",
        )
        ax.text(
            x + 0.95,
            0.6,
            _tokens_text(b.token_ids, 4),
            ha="center",
            va="center",
            fontsize=8,
            color="white",
        )
        ax.text(
            x + 0.95,
            0.25,
            b.outcome.value,
            ha="center",
            va="center",
            fontsize=8,
            color="white",
        )
        if b.hash is not None:
            ax.text(
                x + 0.95,
                1.45,
                f"h={short_hash(b.hash)}",
                ha="center",
                va="center",
                fontsize=8,
                family="monospace",
            )
            if b.index > 0:
                ax.add_patch(
                    FancyArrowPatch(
                        (x - 0.55, 1.45),
                        (x + 0.45, 1.45),
                        arrowstyle="-|>",
                        mutation_scale=8,
                        color="#555555",
                    )
                )
        effect = textwrap.fill(
            _effect(b).replace(", ", "\n", 1),
            width=max(8, int(2.0 * unit * 72 / 4.4)),
            replace_whitespace=False,
        )
        ax.text(x + 0.95, -0.35, effect, ha="center", va="top", fontsize=8)
    handles = [Patch(facecolor=c, label=o.value) for o, c in OUTCOME_COLORS.items()]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 1.02),
        ncol=5,
        fontsize=8,
        frameon=False,
    )
    summary = (
        f"{m.num_tokens} tokens, block_size {m.block_size}: {m.num_cached_blocks} cached "
        "blocks = "
        f"{m.num_cached_blocks * m.block_size} tokens; needs {m.num_free_blocks_needed} of "
        f"{m.num_free_blocks} free blocks"
    )
    ax.set_title(title or summary, fontsize=9, pad=14)
    fig.tight_layout()
    return fig


# --- notebook 01 / 04 plots
def fragmentation_text(rows: Seq[MemoryUse], bytes_per_token: int | None = None) -> str:
    """Text twin of `draw_fragmentation`: the memory table."""
    return format_memory_table(rows, bytes_per_token)


def draw_fragmentation(lengths: RequestLengths, rows: Seq[MemoryUse]) -> Figure:
    """Left: the request-length histogram against max_len. Right: used vs wasted memory per
    scheme."""
    fig = Figure(figsize=(MAX_WIDTH, 3.8))
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.3]})
    totals = lengths.total_lens
    ax1.hist(totals, bins=40, color="#4c72b0")
    ax1.axvline(
        lengths.max_len, color="#c44e52", linestyle="--", label=f"max_len = {lengths.max_len}"
    )
    ax1.axvline(
        float(np.mean(totals)),
        color="black",
        linestyle=":",
        label=f"mean = {np.mean(totals):.0f}",
    )
    ax1.set_xlabel("tokens per request (prompt + output)")
    ax1.set_ylabel("requests")
    ax1.set_title(f"{len(lengths)} simulated requests", fontsize=10)
    ax1.legend(fontsize=8)
    labels = [r.scheme if r.block_size is None else f"paged\nbs={r.block_size}" for r in rows]
    used = [r.used_tokens / 1e3 for r in rows]
    wasted = [r.wasted_tokens / 1e3 for r in rows]
    x = np.arange(len(rows))
    ax2.bar(x, used, color="#4c72b0", label="used (holds K/V)")
    ax2.bar(x, wasted, bottom=used, color="#c44e52", label="reserved but empty")
    for xi, r in zip(x, rows):
        ax2.text(
            xi,
            (r.reserved_tokens / 1e3) * 1.01,
            f"{100 * r.waste_fraction:.1f}%",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    # room for the labels on top
    ax2.set_ylim(0, max(r.reserved_tokens for r in rows) / 1e3 * 1.12)
    ax2.set_xticks(x, labels, fontsize=8)
    ax2.set_ylabel("thousand token slots")
    ax2.set_title("KV memory reserved, and the share wasted", fontsize=10)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def reusable_tokens_text(
    shared_prefix_len: int, prompt_len: int, block_sizes: Seq[int]
) -> str:
    """Text twin of `draw_reusable_tokens`."""
    lines = [
        f"shared prefix {shared_prefix_len} tokens, prompt {prompt_len} tokens",
        "block_size  reused  recomputed-prefix",
    ]
    for bs in block_sizes:
        reused = reusable_prefix_tokens(shared_prefix_len, prompt_len, bs)
        lines.append(f"{bs:>10}  {reused:>6}  {shared_prefix_len - reused:>17}")
    return "\n".join(lines)


def draw_reusable_tokens(
    shared_prefix_len: int, prompt_len: int, block_sizes: Seq[int]
) -> Figure:
    """How many tokens of a cached shared prefix a new prompt reuses, for each block size."""
    reused = [reusable_prefix_tokens(shared_prefix_len, prompt_len, bs) for bs in block_sizes]
    fig = Figure(figsize=(6.5, 3.6))
    ax = fig.add_subplot()
    ax.plot(block_sizes, reused, marker="o", color="#4c72b0", label="reused tokens")
    ax.axhline(
        shared_prefix_len,
        color="#c44e52",
        linestyle="--",
        label=f"shared prefix = {shared_prefix_len}",
    )
    for bs, r in zip(block_sizes, reused):
        ax.annotate(
            str(r),
            (bs, r),
            textcoords="offset points",
            xytext=(0, -13),
            ha="center",
            fontsize=8,
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(block_sizes), [str(b) for b in block_sizes], fontsize=8)
    ax.set_ylim(0, shared_prefix_len * 1.15)
    ax.set_xlabel("block_size (tokens)")
    ax.set_ylabel("prefix tokens reused")
    ax.set_title(
        f"A {prompt_len}-token prompt sharing a cached {shared_prefix_len}-token prefix",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


# --- chapter 04: the lookup flow over the pool and the free queue
def _lookup_steps(b) -> list[str]:
    """The lookup of one logical block as a chain of short steps (what can_allocate does)."""
    if b.outcome is MatchOutcome.LAST_BLOCK:
        return ["last block", "never looked up"]
    if b.outcome is MatchOutcome.NOT_LOOKED_UP:
        return ["after a miss", "not looked up"]
    found = f"#{b.cached_block_id}" if b.cached_block_id is not None else "not found"
    steps = [f"hash {short_hash(b.hash)}", "hash_to_block_id", found]
    if b.cached_block_id is not None:
        steps.append("tokens equal" if b.outcome is not MatchOutcome.MISS else "tokens differ")
    return steps


def _lookup_result(b) -> str:
    if b.block_id is None:
        return "does not fit"
    if b.outcome is MatchOutcome.HIT_IN_USE:
        return (
            f"in use: share #{b.block_id}\nref {b.ref_count_before}\u2192{b.ref_count_after}"
        )
    if b.outcome is MatchOutcome.HIT_FREE:
        return f"freed: pull #{b.block_id}\nfrom the free queue"
    return f"fresh #{b.block_id}\nfrom the queue head"


def prefix_lookup_text(
    bm: BlockManager, match: PrefixMatch, seqs: Mapping[str, Sequence]
) -> str:
    """Text twin of `draw_prefix_lookup`: each block's lookup steps and result, then the
    pool."""
    lines = []
    for b in match.blocks:
        flow = " -> ".join(_lookup_steps(b))
        # the result on a line of its own, so each line fits a 95-column listing
        lines.append(f"L{b.index} {_tokens_text(b.token_ids):<19} {flow}")
        lines.append(f"   => {_lookup_result(b).replace(chr(10), ' ')}")
    lines.append(block_pool_text(bm, seqs))
    return "\n".join(lines)


IN_USE = "#9fb3c8"  # a block some running sequence holds (its holders are written under it)


def draw_prefix_lookup(
    bm: BlockManager,
    match: PrefixMatch,
    seqs: Mapping[str, Sequence],
    *,
    title: str | None = None,
) -> Figure:
    """A new request's lookup, block by block (top), and the pool with its free queue (bottom).

    Each logical block goes hash -> hash_to_block_id -> token check -> result, coloured by
    outcome, with an arrow to the physical block it would get. In the pool, blocks in use carry
    their holders' names; freed blocks that keep a hash are green; the free queue is drawn in
    order.
    """
    named = list(seqs.items())
    holders, filled, queue_pos = _pool_rows(bm, named)
    n_pool, n_req = bm.num_blocks, len(match.blocks)
    col = max(1.9, n_pool / n_req)  # width of one request column, in pool-block units
    width = max(n_pool, col * n_req)
    # the row labels take 1.3 units on the left
    fig = Figure(figsize=(min(0.8, MAX_WIDTH / (width + 1.4)) * (width + 1.4), 6.4))
    ax = fig.add_subplot()
    ax.set_xlim(-1.3, width + 0.1)
    ax.set_ylim(-2.6, 7.3)
    ax.axis("off")
    outcomes_present = []
    for b in match.blocks:
        x = b.index * col + col / 2
        colour = OUTCOME_COLORS[b.outcome]
        if b.outcome not in outcomes_present:
            outcomes_present.append(b.outcome)
        ax.add_patch(
            Rectangle(
                (x - col / 2 + 0.07, 6.3),
                col - 0.14,
                0.8,
                facecolor="white",
                edgecolor="black",
            )
        )
        ax.text(
            x,
            6.7,
            f"L{b.index}\n{_tokens_text(b.token_ids, 4)}",
            ha="center",
            va="center",
            fontsize=8,
        )
        y = 5.85
        for i, step in enumerate(_lookup_steps(b)):
            ax.text(
                x,
                y,
                step if i == 0 else "\u2192 " + step,
                ha="center",
                va="center",
                fontsize=8,
                family="monospace",
            )
            y -= 0.42
        ax.add_patch(
            Rectangle(
                (x - col / 2 + 0.07, 3.0), col - 0.14, 0.9, facecolor=colour, edgecolor="black"
            )
        )
        ax.text(
            x, 3.45, _lookup_result(b), ha="center", va="center", fontsize=8, color="white"
        )
        if b.block_id is not None:
            ax.add_patch(
                FancyArrowPatch(
                    (x, 3.0),
                    (b.block_id + 0.5, 1.25),
                    arrowstyle="-|>",
                    mutation_scale=10,
                    color=colour,
                    linewidth=1.6,
                    zorder=2,
                )
            )
    ax.text(-0.1, 6.7, "request", ha="right", va="center", fontsize=9)
    ax.text(-0.1, 5.2, "lookup", ha="right", va="center", fontsize=9)
    ax.text(-0.1, 3.45, "result", ha="right", va="center", fontsize=9)
    ax.text(-0.1, 0.6, "pool", ha="right", va="center", fontsize=9)
    present = set()
    for block in bm.blocks:
        b = block.block_id
        if b in queue_pos:
            face = FREE_CACHED if block.hash != -1 else EMPTY
            present.add("cached" if block.hash != -1 else "empty")
        else:
            face = IN_USE
            present.add("in use")
            ax.text(b + 0.5, -0.2, "+".join(holders[b]), ha="center", va="center", fontsize=8)
        ax.add_patch(
            Rectangle((b + 0.05, 0), 0.9, 1.2, facecolor=face, edgecolor="black", zorder=3)
        )
        ax.text(
            b + 0.5,
            0.95,
            f"#{b}",
            ha="center",
            va="center",
            fontsize=10,
            weight="bold",
            zorder=4,
        )
        ax.text(
            b + 0.5,
            0.6,
            f"ref {block.ref_count}",
            ha="center",
            va="center",
            fontsize=8,
            zorder=4,
        )
        # a block in use that is not registered yet shows how full it is instead of its
        # (missing) hash
        if block.hash == -1 and b in filled:
            ax.text(
                b + 0.5,
                0.25,
                f"fill {filled[b]}/{bm.block_size}",
                ha="center",
                va="center",
                fontsize=8,
                zorder=4,
            )
        else:
            ax.text(
                b + 0.5,
                0.25,
                short_hash(block.hash),
                ha="center",
                va="center",
                fontsize=8,
                family="monospace",
                zorder=4,
            )
    ax.text(-0.1, -1.05, "free queue\nhead \u2192 tail", ha="right", va="center", fontsize=8)
    for position, b in enumerate(bm.free_block_ids):
        face = FREE_CACHED if bm.blocks[b].hash != -1 else EMPTY
        ax.add_patch(
            Rectangle(
                (position * 0.8 + 0.05, -1.35),
                0.7,
                0.6,
                facecolor=face,
                edgecolor="#2d6a4f",
                zorder=3,
            )
        )
        ax.text(
            position * 0.8 + 0.4,
            -1.05,
            f"#{b}",
            ha="center",
            va="center",
            fontsize=8,
            zorder=4,
        )
    handles = [Patch(facecolor=OUTCOME_COLORS[o], label=o.value) for o in outcomes_present]
    if "in use" in present:
        handles.append(
            Patch(facecolor=IN_USE, edgecolor="black", label="in use (holders under it)")
        )
    if "cached" in present:
        handles.append(
            Patch(facecolor=FREE_CACHED, edgecolor="black", label="free, hash kept")
        )
    if "empty" in present:
        handles.append(Patch(facecolor=EMPTY, edgecolor="black", label="free, empty"))
    ax.legend(
        handles=handles,
        loc="lower center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=min(4, len(handles)),
        fontsize=8,
        frameon=False,
    )
    summary = (
        f"{match.num_tokens} tokens, block_size {match.block_size}: {match.num_cached_blocks} "
        "cached blocks, "
        f"{match.num_free_blocks_needed} of {match.num_free_blocks} free blocks needed -> "
        f"can_allocate = {match.can_allocate}"
    )
    ax.set_title(title or summary, fontsize=10)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.94, bottom=0.01)
    return fig
