"""Step through the BlockManager: snapshots of the pool, the block tables and the free queue.

`pool_snapshot(bm, seqs)` copies what a reader needs to see after one call (each block's
ref_count, hash and tokens, every named block table, the free-queue order) into frozen tuples,
so frames recorded with `refimpl.viz.record_frames` keep their state while the objects move on.
`draw_pool_snapshot` pictures one snapshot and `pool_snapshot_text` is its text twin; together
they make the `Stepper`s of chapters 03 and 04. `running_example_actions` (chapter 03) and
`prefix_cache_actions` (chapter 04) are the lists of real calls those chapters step through, on
users A, B and C of `refimpl.paged.running_example` (and A's second turn, `A2`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from refimpl.paged import running_example
from refimpl.paged.block_manager import BlockManager
from refimpl.paged.sequence import Sequence
from refimpl.paged.steps import compute_tokens, decode_step
from refimpl.viz.paged import FREE_CACHED, short_hash
from refimpl.viz.palette import EMPTY, SEQ_COLORS

#: Tokens generated in the running example's decode steps (2xx/3xx like the users' questions).
DECODE_TOKENS = {"A": [211, 212], "B": [311, 312]}
#: A's second turn (chapter 04): A's prompt, A's answer, then a new 5-token question.
SECOND_TURN_QUESTION = [221, 222, 223, 224, 225]


def second_turn_prompt() -> list[int]:
    """The 18 tokens of A's second turn: the system prompt, A's question, A's answer, a new question."""
    return running_example.prompt("A") + DECODE_TOKENS["A"] + SECOND_TURN_QUESTION


@dataclass(frozen=True)
class BlockSnapshot:
    """One physical block after a call: who references it and what the prefix cache knows of it."""

    block_id: int
    ref_count: int
    hash: int  # -1: not registered
    token_ids: tuple[int, ...]  # the registered tokens (empty until the block is full and hashed)


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


def pool_snapshot(bm: BlockManager, seqs: Mapping[str, Sequence]) -> PoolSnapshot:
    """Copy the state of `bm` and the named sequences (names, not global seq ids)."""
    blocks = tuple(BlockSnapshot(b.block_id, b.ref_count, b.hash, tuple(b.token_ids)) for b in bm.blocks)
    tables = tuple((name, tuple(seq.block_table)) for name, seq in seqs.items())
    lengths = tuple((name, len(seq)) for name, seq in seqs.items())
    return PoolSnapshot(bm.block_size, blocks, tables, lengths, tuple(bm.free_block_ids), len(bm.hash_to_block_id))


def running_example_actions(bm: BlockManager, seqs: Mapping[str, Sequence]) -> list[tuple[str, Callable[[], object]]]:
    """The calls chapter 03 steps through, in order, on the running example's A, B and C.

    A arrives and is prefilled; B arrives and shares the system prompt's two registered blocks;
    A decodes two tokens (the second starts a new block), B one; A finishes; C (A's prompt
    again) arrives and shares the system prompt blocks B still holds; then B and C finish.
    """
    a, b, c = seqs["A"], seqs["B"], seqs["C"]

    def admit(seq: Sequence) -> None:
        bm.allocate(seq, bm.can_allocate(seq))

    def computed(seq: Sequence) -> None:
        compute_tokens(bm, seq, len(seq) - seq.num_cached_tokens)  # postprocess: hash_blocks

    return [
        ("A: allocate(A, can_allocate(A))", lambda: admit(a)),
        ("A's prompt computed: hash_blocks(A)", lambda: computed(a)),
        ("B: allocate(B, can_allocate(B))", lambda: admit(b)),
        ("B's prompt computed: hash_blocks(B)", lambda: computed(b)),
        (f"A decodes token {DECODE_TOKENS['A'][0]} (may_append)", lambda: decode_step(bm, a, DECODE_TOKENS["A"][0])),
        (f"A decodes token {DECODE_TOKENS['A'][1]} (may_append)", lambda: decode_step(bm, a, DECODE_TOKENS["A"][1])),
        (f"B decodes token {DECODE_TOKENS['B'][0]} (may_append)", lambda: decode_step(bm, b, DECODE_TOKENS["B"][0])),
        ("A finishes: deallocate(A)", lambda: bm.deallocate(a)),
        ("C: allocate(C, can_allocate(C))", lambda: admit(c)),
        ("B finishes: deallocate(B)", lambda: bm.deallocate(b)),
        ("C finishes: deallocate(C)", lambda: bm.deallocate(c)),
    ]


def prefix_cache_actions(bm: BlockManager, seqs: Mapping[str, Sequence]) -> list[tuple[str, Callable[[], object]]]:
    """The calls chapter 04 steps through: registration chunk by chunk, then lookups that hit.

    A is prefilled in two chunks (6, then 5 tokens) and decodes two tokens, each step registering
    the blocks it filled; B shares the two system-prompt blocks; A finishes; A's second turn
    (`seqs["A2"]`, built from `second_turn_prompt()`) hits two blocks in use, pulls A's freed
    third block out of the free queue, and misses on the fourth.
    """
    a, b, a2 = seqs["A"], seqs["B"], seqs["A2"]

    def admit(seq: Sequence) -> None:
        bm.allocate(seq, bm.can_allocate(seq))

    def decode(seq: Sequence, token: int) -> None:
        seq.append_token(token)
        bm.may_append(seq)
        compute_tokens(bm, seq, 1)

    return [
        ("A: allocate(A, can_allocate(A))", lambda: admit(a)),
        ("A, chunk 1: 6 tokens computed, hash_blocks(A)", lambda: compute_tokens(bm, a, 6)),
        ("A, chunk 2: 5 tokens computed, hash_blocks(A)", lambda: compute_tokens(bm, a, 5)),
        (f"A decodes {DECODE_TOKENS['A'][0]}: block L2 is full", lambda: decode(a, DECODE_TOKENS["A"][0])),
        (f"A decodes {DECODE_TOKENS['A'][1]}: a new block L3", lambda: decode(a, DECODE_TOKENS["A"][1])),
        ("B: allocate, 2 hits in use", lambda: admit(b)),
        ("B's prompt computed: hash_blocks(B)", lambda: compute_tokens(bm, b, len(b) - b.num_cached_tokens)),
        ("A finishes: deallocate(A)", lambda: bm.deallocate(a)),
        ("A2: allocate, 2 hits in use + 1 freed hit", lambda: admit(a2)),
        ("A2's prompt computed: hash_blocks(A2)", lambda: compute_tokens(bm, a2, len(a2) - a2.num_cached_tokens)),
    ]


def pool_snapshot_text(state: PoolSnapshot) -> str:
    """Text twin of `draw_pool_snapshot`: one line per block, the free queue, each block table."""
    queue_pos = {b: i for i, b in enumerate(state.free_queue)}
    lines = [f"pool: {len(state.blocks)} blocks x {state.block_size} tokens | free {len(state.free_queue)}, "
             f"cached hashes {state.cached}", "block  ref  hash  registered tokens  state"]
    for block in state.blocks:
        b = block.block_id
        tokens = " ".join(map(str, block.token_ids)) or "-"
        if b in queue_pos:
            state_text = ("free, cached" if block.hash != -1 else "free") + f" (queue position {queue_pos[b]})"
        else:
            state_text = "in use by " + ", ".join(state.holders(b))
        lines.append(f"{'#' + str(b):>5} {block.ref_count:>4}  {short_hash(block.hash):<4}  {tokens:<17}  {state_text}")
    lines.append("free queue (head -> tail): " + (" ".join(f"#{b}" for b in state.free_queue) or "empty"))
    lengths = dict(state.lengths)
    for name, table in state.tables:
        shown = " ".join(f"L{i}->#{b}" for i, b in enumerate(table)) or "no blocks"
        lines.append(f"{name}: {shown}  (len {lengths[name]})")
    return "\n".join(lines)


def draw_pool_snapshot(state: PoolSnapshot) -> Figure:
    """Block tables (top), the physical pool (middle) and the free queue (bottom) of one snapshot.

    A block's colour is its first holder's; a shared block (ref > 1) gets a thick black border
    and its holders written under it; green = freed but still cached; grey = free and empty.
    """
    names = [name for name, _ in state.tables]
    # The running example's users keep their colours in every chapter; other names follow them.
    order = list(running_example.NAMES) + [name for name in names if name not in running_example.NAMES]
    colour_of = {name: SEQ_COLORS[order.index(name) % len(SEQ_COLORS)] for name in names}
    n = len(state.blocks)
    queue_pos = {b: i for i, b in enumerate(state.free_queue)}
    width = max(n, sum(max(len(t), 1) + 0.5 for _, t in state.tables))
    fig = Figure(figsize=(max(7.0, 0.8 * width + 1.4), 4.4))
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
            face = colour_of[owners[0]]
        shared = block.ref_count > 1
        ax.add_patch(Rectangle((b + 0.05, 0), 0.9, 1.2, facecolor=face, edgecolor="black",
                               linewidth=3.0 if shared else 1.0, zorder=3))
        ink = "white" if face in SEQ_COLORS else "black"
        ax.text(b + 0.5, 1.0, f"#{b}", ha="center", va="center", fontsize=10, weight="bold", color=ink, zorder=4)
        ax.text(b + 0.5, 0.74, f"ref {block.ref_count}", ha="center", va="center", fontsize=8, color=ink, zorder=4)
        tokens = block.token_ids
        if tokens:
            half = (len(tokens) + 1) // 2
            ax.text(b + 0.5, 0.3, " ".join(map(str, tokens[:half])) + "\n" + " ".join(map(str, tokens[half:])),
                    ha="center", va="center", fontsize=8, family="monospace", color=ink, zorder=4, linespacing=1.0)
        if shared:
            present.add("shared")
            ax.text(b + 0.5, -0.18, "+".join(owners), ha="center", va="center", fontsize=8, zorder=4)
    # free queue: the ids in order, head first
    ax.text(-0.1, -1.1, "free queue\nhead \u2192 tail", ha="right", va="center", fontsize=8)
    for position, b in enumerate(state.free_queue):
        block = state.blocks[b]
        face = FREE_CACHED if block.hash != -1 else EMPTY
        ax.add_patch(Rectangle((position * 0.8 + 0.05, -1.4), 0.7, 0.6, facecolor=face, edgecolor="#2d6a4f", zorder=3))
        ax.text(position * 0.8 + 0.4, -1.1, f"#{b}", ha="center", va="center", fontsize=8, zorder=4)
    if not state.free_queue:
        ax.text(0.05, -1.1, "empty", ha="left", va="center", fontsize=8)

    y, x = 2.2, 0.0
    lengths = dict(state.lengths)
    ax.text(-0.1, y + 0.3, "block\ntables", ha="right", va="center", fontsize=9)
    for name, table in state.tables:
        colour = colour_of[name]
        span = max(len(table), 1)
        label = f"{name} ({lengths[name]} tok)" if table else f"{name}: no blocks"
        ax.text(x + span / 2, y + 0.95, label, ha="center", va="center", fontsize=8, color=colour, weight="bold")
        for i, b in enumerate(table):
            ax.add_patch(Rectangle((x + i + 0.1, y), 0.8, 0.6, facecolor="white", edgecolor=colour, linewidth=2, zorder=3))
            ax.text(x + i + 0.5, y + 0.3, f"L{i}\u2192#{b}", ha="center", va="center", fontsize=8, zorder=4)
            ax.add_patch(FancyArrowPatch((x + i + 0.5, y), (b + 0.5, 1.2), arrowstyle="-|>", mutation_scale=9,
                                         color=colour, alpha=0.6, linewidth=1.1, zorder=2))
        x += span + 0.5
    legend = [Patch(facecolor=colour_of[name], label=name) for name, table in state.tables if table]
    if "shared" in present:
        legend.append(Patch(facecolor="white", edgecolor="black", linewidth=3.0, label="shared (ref > 1)"))
    if "cached" in present:
        legend.append(Patch(facecolor=FREE_CACHED, edgecolor="black", label="free, hash kept"))
    if "empty" in present:
        legend.append(Patch(facecolor=EMPTY, edgecolor="black", label="free, empty"))
    ax.legend(handles=legend, loc="lower right", fontsize=8, ncol=3, frameon=False, bbox_to_anchor=(1.0, -0.02))
    fig.subplots_adjust(left=0.01, right=0.99, top=0.9, bottom=0.02)
    return fig
