"""The map of the course: which chapters there are, how long each takes, and which needs which.

`CHAPTERS` is the chapter list as data (number, notebook file, title, minutes, direct needs);
`draw_course_map()` draws it as a graph coloured by part (optionally with one `route` picked
out) and `course_map_text()` is its text twin. Chapter 00 also prints a glossary (`GLOSSARY`)
and a Part I <-> Part II table (`PART_PAIRS`) from here. Every entry that names a package API
keeps the dotted path, and `missing_api_names()` lists the paths that no longer resolve, so a
rename in the package shows up as a failing check instead of a glossary that quietly points at
nothing.
"""

from __future__ import annotations

import importlib
import re
import textwrap
from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

from refimpl.viz.palette import MAX_WIDTH


@dataclass(frozen=True)
class Chapter:
    """One notebook of the course. `needs`: the chapters to read first (direct needs only)."""

    number: str  # "05b": the file name's prefix, also the title's number
    file: str  # file name under notebooks/
    # the notebook's title line is "# {number} · {title}" (possibly with a subtitle)
    title: str
    short: str  # the label in the map picture
    minutes: int  # time to read, build and run it, with the self-check, without the exercises
    needs: tuple[str, ...]

    @property
    def part(self) -> str:
        """ "Start", "Part I" (nano-vllm), "Part II" (vLLM's hybrid cache: DeepSeek V4 in
        08a-12, any model's plan in 14, which needs only 12) or "Part III" (a V4 model)."""
        major = int(self.number[:2])
        if major == 0:
            return "Start"
        if major <= 7:
            return "Part I"
        if major == 13:
            return "Part III"
        return "Part II"


CHAPTERS: tuple[Chapter, ...] = (
    Chapter("00", "00_start_here.ipynb", "Start here", "Start here", 15, ()),
    Chapter("01", "01_why_paging.ipynb", "Why paging?", "Why paging?", 25, ("00",)),
    Chapter(
        "02",
        "02_blocks_and_sequences.ipynb",
        "Blocks and sequences",
        "Blocks and sequences",
        30,
        ("01",),
    ),
    Chapter("03", "03_block_manager.ipynb", "The BlockManager", "BlockManager", 50, ("02",)),
    Chapter("04", "04_prefix_cache.ipynb", "The prefix cache", "Prefix cache", 50, ("03",)),
    Chapter("05", "05_scheduler.ipynb", "The scheduler loop", "Scheduler loop", 45, ("04",)),
    Chapter(
        "05b",
        "05b_scheduler_corner_cases.ipynb",
        "Scheduler corner cases",
        "Scheduler corner cases",
        45,
        ("05",),
    ),
    Chapter("06", "06_engine.ipynb", "The engine", "Engine", 50, ("05",)),
    Chapter("07", "07_kernels.ipynb", "Kernels", "Kernels", 55, ("06",)),
    Chapter(
        "08a",
        "08a_v4_layer.ipynb",
        "DeepSeek V4: what one layer computes and keeps",
        "Inside a V4 layer",
        40,
        ("04",),
    ),
    Chapter(
        "08b",
        "08b_v4_specs.ipynb",
        "DeepSeek V4: the caches of a layer",
        "V4 caches and pages",
        35,
        ("08a",),
    ),
    Chapter(
        "09", "09_v4_grouping.ipynb", "DeepSeek V4: grouping", "V4 grouping", 45, ("08b",)
    ),
    Chapter(
        "10",
        "10_v4_memory_slab.ipynb",
        "DeepSeek V4: the packed memory slab",
        "V4 memory slab",
        35,
        ("09",),
    ),
    Chapter(
        "11",
        "11_v4_addressing.ipynb",
        "DeepSeek V4: from token position to cache slot",
        "V4 addressing",
        40,
        ("10", "07"),
    ),
    Chapter(
        "12",
        "12_hybrid_allocator.ipynb",
        "The hybrid allocator",
        "Hybrid allocator",
        50,
        ("11",),
    ),
    Chapter(
        "13",
        "13_v4_engine.ipynb",
        "A tiny DeepSeek V4 on the hybrid cache",
        "Tiny V4 on hybrid cache",
        45,
        ("12", "07"),
    ),
    Chapter(
        "14",
        "14_size_your_own_model.ipynb",
        "Size your own model",
        "Size your own model",
        35,
        ("12",),
    ),
    Chapter("15", "15_your_traffic.ipynb", "Your traffic", "Your traffic", 30, ("14",)),
)

PARTS: dict[str, str] = {
    "Start": "Start: how the course works",
    "Part I": "Part I: nano-vllm's paged cache",
    "Part II": "Part II: vLLM's hybrid cache (V4, any model)",
    "Part III": "Part III: a tiny DeepSeek V4 runs on it",
}
# Light fills so black 8 pt text stays readable; the edge colour is the same hue, darker.
PART_FILL = {
    "Start": "#e3e3e3",
    "Part I": "#c9d7ef",
    "Part II": "#f6d5b8",
    "Part III": "#dcd3ee",
}
PART_EDGE = {
    "Start": "#6f6f6f",
    "Part I": "#4c72b0",
    "Part II": "#c46a2b",
    "Part III": "#7160a8",
}

# Grid position (column, row) of each chapter: Part I along the top, Part II below it, so every
# arrow is short and none crosses a box it does not connect (11 sits right under 07, which it
# needs; 12 leads up to 13 and down to 14).
_POSITION = {
    "00": (0, 3),
    "01": (1, 3),
    "02": (2, 3),
    "03": (3, 3),
    "04": (4, 3),
    "05": (5, 3),
    "06": (6, 3),
    "07": (7, 3),
    "05b": (5, 2),
    "08a": (4, 2),
    "08b": (4, 1),
    "09": (5, 1),
    "10": (6, 1),
    "11": (7, 2),
    "12": (8, 2),
    "13": (8, 3),
    "14": (8, 1),
    "15": (7, 1),
}


def chapter(number: str) -> Chapter:
    """The chapter with this number ("05b"); ValueError names the numbers that exist."""
    for entry in CHAPTERS:
        if entry.number == number:
            return entry
    raise ValueError(f"no chapter {number!r}; chapters are {[c.number for c in CHAPTERS]}")


def all_needs(number: str) -> list[str]:
    """Every chapter `number` builds on, directly or through another chapter, in course
    order."""
    seen: set[str] = set()
    todo = list(chapter(number).needs)
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(chapter(current).needs)
    return [c.number for c in CHAPTERS if c.number in seen]


def total_minutes(part: str | None = None) -> int:
    """Minutes for the whole course, or for one part ("Part I", ...)."""
    return sum(c.minutes for c in CHAPTERS if part is None or c.part == part)


def route_to(target: str) -> list[str]:
    """The chapters to read for `target`, in course order, ending with `target` itself."""
    return all_needs(target) + [target]


def course_map_text() -> str:
    """The chapter list by part: number, title, minutes, direct needs, and the total time."""
    lines = []
    for part, heading in PARTS.items():
        chapters = [c for c in CHAPTERS if c.part == part]
        lines.append(f"{heading} ({total_minutes(part)} min)")
        for c in chapters:
            needs = ", ".join(c.needs) if c.needs else "-"
            lines.append(f"  {c.number:<3} {c.title:<47} {c.minutes:>3} min  needs {needs}")
    total = total_minutes()
    lines.append(f"total: {total} min, about {total / 60:.1f} hours")
    return "\n".join(lines)


def chapters_markdown() -> str:
    """The chapter list as a Markdown table with links (for chapter 00 and the README)."""
    rows = ["| # | chapter | part | minutes | needs |", "|---|---|---|---|---|"]
    for c in CHAPTERS:
        needs = ", ".join(c.needs) if c.needs else "-"
        rows.append(
            f"| {c.number} | [{c.title}]({c.file}) | {c.part} | {c.minutes} | {needs} |"
        )
    return "\n".join(rows)


def _box_label(short: str) -> str:
    """A chapter's short title in lines of at most 12 characters; a longer single word (a class
    name such as BlockManager) breaks before its inner capitals, so it stays inside the box."""
    lines = []
    for line in textwrap.wrap(short, 12, break_long_words=False):
        lines += re.split(r"(?<=[a-z])(?=[A-Z])", line) if len(line) > 11 else [line]
    return "\n".join(lines)


def draw_course_map(
    title: str = "The course: an arrow goes from a chapter to one that needs it",
    route: list[str] | tuple[str, ...] | None = None,
) -> Figure:
    """Every chapter as a box coloured by part, with an arrow from each chapter to those
    needing it.

    `route`: the chapters of one route (`route_to("12")`), its goal last; the chapters off the
    route are drawn white and dashed, the goal is outlined in black. Nine columns on a figure a
    notebook column shows at full size, so every label stays at 8 pt or more.
    """
    if route is not None:
        for number in route:
            chapter(number)  # ValueError for an unknown number
    fig = Figure(figsize=(MAX_WIDTH, 3.9))
    ax = fig.add_axes((0.0, 0.0, 1.0, 0.9))
    ax.set_xlim(-0.46, 8.46)
    ax.set_ylim(0.45, 3.55)
    ax.set_axis_off()
    width, height = 0.9, 0.78
    boxes = {}
    for c in CHAPTERS:
        x, y = _POSITION[c.number]
        off_route = route is not None and c.number not in route
        goal = route is not None and len(route) > 0 and c.number == route[-1]
        box = FancyBboxPatch(
            (x - width / 2, y - height / 2),
            width,
            height,
            boxstyle="round,pad=0,rounding_size=0.08",
            facecolor="white" if off_route else PART_FILL[c.part],
            edgecolor="black" if goal else PART_EDGE[c.part],
            linewidth=3.0 if goal else 1.4,
            linestyle="--" if off_route else "-",
            zorder=2,
        )
        ax.add_patch(box)
        boxes[c.number] = box
        label = _box_label(c.short)
        ax.text(
            x,
            y + 0.2,
            c.number,
            ha="center",
            va="center",
            fontsize=10,
            weight="bold",
            zorder=3,
        )
        ax.text(
            x, y - 0.06, label, ha="center", va="center", fontsize=8, linespacing=1.1, zorder=3
        )
        ax.text(
            x,
            y - 0.3,
            f"{c.minutes} min",
            ha="center",
            va="center",
            fontsize=8,
            color="#444444",
            zorder=3,
        )
    for c in CHAPTERS:
        for need in c.needs:
            ax.add_patch(
                FancyArrowPatch(
                    _POSITION[need],
                    _POSITION[c.number],
                    patchA=boxes[need],
                    patchB=boxes[c.number],
                    arrowstyle="-|>",
                    mutation_scale=11,
                    color="#333333",
                    linewidth=1.1,
                    shrinkA=1,
                    shrinkB=1,
                    zorder=1,
                )
            )
    handles = [
        Patch(
            facecolor=PART_FILL[p],
            edgecolor=PART_EDGE[p],
            label=f"{heading} ({total_minutes(p)} min)",
        )
        for p, heading in PARTS.items()
    ]
    if route is not None:
        handles += [
            Patch(
                facecolor="white",
                edgecolor="#6f6f6f",
                linestyle="--",
                label="not on this route",
            ),
            Patch(
                facecolor="white", edgecolor="black", linewidth=3.0, label="the route's goal"
            ),
        ]
    ax.legend(
        handles=handles,
        loc="lower left",
        bbox_to_anchor=(0.0, 0.02),
        fontsize=8,
        frameon=False,
        title=f"whole course: {total_minutes()} min, about {total_minutes() / 60:.1f} hours",
        title_fontsize=8,
        alignment="left",
        # short handles and no outer pad, so the widest line stays clear of chapter 08b's box
        borderaxespad=0.2,
        handlelength=1.4,
        handletextpad=0.5,
    )
    fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    return fig


# --- glossary and the Part I <-> Part II table


@dataclass(frozen=True)
class Term:
    """A word the course uses, defined in a sentence or two; `api`: dotted paths it names, if
    any."""

    term: str
    definition: str
    api: tuple[str, ...] = ()
    chapter: str = ""  # where it is taught first


GLOSSARY: tuple[Term, ...] = (
    Term(
        "block",
        "A fixed number of consecutive token positions (`block_size`) whose keys and values "
        "are stored "
        "together; the unit the cache hands out and frees.",
        ("refimpl.paged.Block", "refimpl.hybrid.KVCacheBlock"),
        "02",
    ),
    Term(
        "page",
        "The bytes one block takes in one layer's cache: `block_size` times that layer's "
        "bytes per token. "
        "The same block id names one page in every layer of a group.",
        ("refimpl.hybrid.AttentionSpec.page_size_bytes",),
        "08b",
    ),
    Term(
        "page size",
        "`page_size_bytes` of a cache spec: the real page, or the larger padded page a spec "
        "reserves "
        "(`page_size_padded`) for aligned kernels. In Part II one group's layers may differ "
        "in page size.",
        (
            "refimpl.hybrid.AttentionSpec.page_size_bytes",
            "refimpl.hybrid.AttentionSpec.real_page_size_bytes",
        ),
        "08b",
    ),
    Term(
        "slot",
        "One token's place in a layer's cache: `block_id * block_size + offset`, the offset "
        "counting "
        "positions inside the block.",
        ("refimpl.hybrid.addressing.slot_for_position",),
        "06",
    ),
    Term(
        "slot mapping",
        "For each token computed in a step, the slot its key and value are written to; the "
        "model runner builds it and `store_kvcache` writes through it.",
        ("refimpl.hybrid.addressing.slot_mapping", "refimpl.kernels.store_kvcache"),
        "06",
    ),
    Term(
        "block table",
        "A sequence's list of block ids in token order: entry i holds positions "
        "`i * block_size` to `(i + 1) * block_size - 1`. It is the page table of paged "
        "attention.",
        (),
        "02",
    ),
    Term(
        "block stride",
        "In Part II's packed slab, the bytes from the start of block b to the start of block "
        "b + 1: the widest group's bytes per block, since groups overlay each other.",
        ("refimpl.hybrid.kv_cache_interface.KVCacheConfig",),
        "10",
    ),
    Term(
        "layer tuple",
        "One layer of each page size in a group; a group's layers are counted in tuples, and "
        "grouping splits a bucket into groups of about the same number of tuples.",
        ("refimpl.hybrid.UniformTypeKVCacheSpecs.get_num_layer_tuples",),
        "09",
    ),
    Term(
        "cache group",
        "Layers that share one block table: block id b holds the same tokens in all of them. "
        "Part I has one group; DeepSeek V4 has several.",
        ("refimpl.hybrid.KVCacheGroupSpec",),
        "09",
    ),
    Term(
        "KV cache spec",
        "What one layer stores per token and per block (kind, block size, heads, dtype, "
        "window "
        "or compression ratio); specs decide page sizes and grouping.",
        ("refimpl.hybrid.KVCacheSpec",),
        "08b",
    ),
    Term(
        "null block",
        "Block 0 of the hybrid pool: a placeholder put in a sliding-window group's table "
        "where a "
        "block has left the window. It is never handed out, never hashed, never put back in "
        "the free queue.",
        ("refimpl.hybrid.BlockPool.get_new_blocks",),
        "12",
    ),
    Term(
        "hash block size",
        "How many tokens one prefix hash covers in Part II; by default the gcd of the group "
        "block sizes, so every group's block is a whole number of hashes.",
        ("refimpl.hybrid.KVCacheManager.hash_block_size",),
        "12",
    ),
    Term(
        "lcm alignment",
        "A prefix hit must end on a multiple of the least common multiple of the group block "
        "sizes (256 for DeepSeek V4), so that every group can reuse whole blocks.",
        ("refimpl.hybrid.KVCacheManager.scheduler_block_size",),
        "12",
    ),
    Term(
        "prefix cache hit",
        "A full block whose hash chain (its tokens and every token before it) matches a "
        "block already computed, so its keys and values are reused instead of computed again.",
        (
            "refimpl.paged.BlockManager.can_allocate",
            "refimpl.hybrid.KVCacheManager.get_computed_blocks",
        ),
        "04",
    ),
    Term(
        "free queue",
        "The blocks no sequence holds, in the order they will be handed out (head first). A "
        "free "
        "block may still carry its hash, so a later hit can take it back.",
        ("refimpl.paged.FreeBlockQueue", "refimpl.hybrid.FreeKVCacheBlockQueue"),
        "03",
    ),
    Term(
        "ref count",
        "How many block tables hold a block; shared prefix blocks have more than one. A block "
        "returns to the free queue when its count drops to 0.",
        (),
        "03",
    ),
    Term(
        "chunked prefill",
        "Computing a long prompt over several steps, a token budget's worth at a time, so "
        "one request does not stall the others.",
        ("refimpl.paged.SchedulerConfig",),
        "05b",
    ),
    Term(
        "preemption",
        "Taking a running sequence's blocks back when the pool runs out; the sequence waits "
        "and "
        "is computed again (recompute) when it is scheduled next.",
        ("refimpl.paged.Scheduler.preempt",),
        "05b",
    ),
    Term(
        "MLA",
        "Multi-head latent attention: one small row per token is cached instead of a key and "
        "a value per "
        "head; in DeepSeek V4 every query head reads that row as key and as value.",
        ("refimpl.hybrid.MLAAttentionSpec",),
        "08a",
    ),
    Term(
        "RoPE / NoPE",
        "Rotary position embedding rotates part of each key by its position; NoPE dimensions "
        "carry no position. DeepSeek V4 caches both parts in one entry.",
        (),
        "08a",
    ),
    Term(
        "fp8_ds_mla",
        "DeepSeek V4's fp8 cache format for MLA: one 584-byte row per token (448 fp8 NoPE "
        "bytes, "
        "64 bf16 RoPE values, 8 scale bytes).",
        ("refimpl.hybrid.kv_cache_interface.DSV4_FP8_DS_MLA_TOKEN_BYTES",),
        "08b",
    ),
    Term(
        "UE8M0",
        "An 8-bit scale that stores only an exponent (a power of two); fp8 and fp4 caches "
        "keep one per "
        "group of values.",
        (),
        "08b",
    ),
    Term(
        "SWA",
        "Sliding-window attention: a token attends only to the last W tokens, so blocks that "
        "fall out "
        "of the window can be given back (the null block takes their place).",
        ("refimpl.hybrid.SlidingWindowSpec", "refimpl.hybrid.SlidingWindowManager"),
        "08a",
    ),
    Term(
        "compressor",
        "A DeepSeek V4 module that writes one compressed entry per 4 (or 128) tokens, so long "
        "context costs fewer entries; ratio-4 windows are 8 tokens and overlap. Its running "
        "state is cached too.",
        ("refimpl.hybrid.addressing.compressed_slot_for_position",),
        "08a",
    ),
    Term(
        "compressor state",
        "The rows a compressor keeps until the entries that need them are written (both "
        "series of a token, in float32): a sliding-window cache of 8 tokens (ratio 4) or 128 "
        "(ratio 128).",
        ("refimpl.hybrid.SlidingWindowMLASpec",),
        "08a",
    ),
    Term(
        "indexer",
        "A DeepSeek V4 module that scores the compressed entries and picks the top-k a token "
        "attends to, so attention reads only a few of them.",
        ("refimpl.kernels.compute_global_topk_indices_and_lens",),
        "08a",
    ),
    Term(
        "MTP",
        "Multi-token prediction: an extra layer that drafts the next token for speculative "
        "decoding "
        "(vLLM runs it as an eagle layer); it has its own cache.",
        (),
        "08b",
    ),
    Term(
        "FlashMLA",
        "DeepSeek's attention kernels for MLA; they read the `fp8_ds_mla` pages, whose sizes "
        "vLLM "
        "aligns to 576 bytes.",
        (),
        "08b",
    ),
)


@dataclass(frozen=True)
class PartPair:
    """One idea as Part I (nano-vllm) and Part II (vLLM's hybrid cache) implement it."""

    idea: str
    part1: str
    part2: str
    api: tuple[str, ...] = ()


PART_PAIRS: tuple[PartPair, ...] = (
    PartPair(
        "who hands out blocks",
        "one `BlockManager`",
        "`BlockPool` (the blocks) + one `SingleTypeKVCacheManager` per group "
        "(`FullAttentionManager`, "
        "`SlidingWindowManager`) + `KVCacheCoordinator` (all groups at once) + "
        "`KVCacheManager` (the "
        "scheduler's entry point)",
        (
            "refimpl.paged.BlockManager",
            "refimpl.hybrid.BlockPool",
            "refimpl.hybrid.single_type_kv_cache_manager.SingleTypeKVCacheManager",
            "refimpl.hybrid.FullAttentionManager",
            "refimpl.hybrid.SlidingWindowManager",
            "refimpl.hybrid.KVCacheCoordinator",
            "refimpl.hybrid.KVCacheManager",
        ),
    ),
    PartPair(
        "one block's record",
        "`Block`: `ref_count`, `hash`, `token_ids`",
        "`KVCacheBlock`: `ref_cnt`, `block_hash`, free-queue links; no token ids",
        ("refimpl.paged.Block", "refimpl.hybrid.KVCacheBlock"),
    ),
    PartPair(
        "prefix hash",
        "64-bit xxhash chain over `block_size` tokens and the previous block's hash "
        "(`compute_hash`)",
        "128-bit xxh3 chain over `hash_block_size` tokens (`hash_block_tokens`); the cache "
        "key adds the "
        "group id (`make_block_hash_with_group_id`)",
        (
            "refimpl.paged.compute_hash",
            "refimpl.hybrid.kv_cache_utils.hash_block_tokens",
            "refimpl.hybrid.block_pool.make_block_hash_with_group_id",
        ),
    ),
    PartPair(
        "checking a hit",
        "the hash, then the block's token ids compared one by one",
        "the 128-bit hash alone, per group; the coordinator shrinks the hit until every group "
        "can serve it",
        ("refimpl.hybrid.KVCacheCoordinator.find_longest_cache_hit",),
    ),
    PartPair(
        "free order",
        "`deallocate`: the table's last block first, each appended to the tail of the FIFO "
        "free queue",
        "`free_blocks`: the table's last block first; blocks without a cache key go to the "
        "front of the "
        "queue (reused first), blocks with a key to the back (kept longest for hits)",
        ("refimpl.paged.BlockManager.deallocate", "refimpl.hybrid.BlockPool.free_blocks"),
    ),
    PartPair(
        "free queue",
        "`FreeBlockQueue` of block ids",
        "`FreeKVCacheBlockQueue`: a doubly linked list threaded through the blocks",
        ("refimpl.paged.FreeBlockQueue", "refimpl.hybrid.FreeKVCacheBlockQueue"),
    ),
    PartPair(
        "block tables",
        "one per sequence (`seq.block_table`)",
        "one per group per request (`KVCacheBlocks.get_block_ids()` gives a tuple of lists)",
        ("refimpl.hybrid.KVCacheBlocks.get_block_ids",),
    ),
    PartPair(
        "making room",
        "`can_allocate` / `allocate` at prefill, `can_append` / `may_append` at decode",
        "`allocate_slots` every step (None when the pool cannot hold the new tokens, nothing "
        "changed)",
        (
            "refimpl.paged.BlockManager.can_allocate",
            "refimpl.paged.BlockManager.allocate",
            "refimpl.paged.BlockManager.can_append",
            "refimpl.paged.BlockManager.may_append",
            "refimpl.hybrid.KVCacheManager.allocate_slots",
        ),
    ),
    PartPair(
        "where hits may end",
        "any block boundary (the last block is never looked up)",
        "by default multiples of the lcm of the group block sizes (256 for DeepSeek V4)",
        ("refimpl.hybrid.KVCacheManager.scheduler_block_size",),
    ),
    PartPair(
        "tokens out of a window",
        "none: every layer keeps every token",
        "sliding-window groups put the null block in their tables and free the real block",
        ("refimpl.hybrid.SlidingWindowManager",),
    ),
    PartPair(
        "memory",
        "every layer has the same page size, and block b is the same token range in every "
        "layer",
        "groups of layers with different pages in one packed slab, `block stride` bytes per "
        "block id",
        ("refimpl.hybrid.get_kv_cache_config",),
    ),
)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [
        "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows
    ]
    return "\n".join(lines)


def glossary_markdown() -> str:
    """The glossary as a Markdown table, in course order (the chapter that teaches each term
    first)."""
    order = {c.number: i for i, c in enumerate(CHAPTERS)}
    terms = sorted(GLOSSARY, key=lambda t: (order.get(t.chapter, len(order)), t.term.lower()))
    return _table(
        ["term", "meaning", "first taught"],
        [[f"**{t.term}**", t.definition, t.chapter] for t in terms],
    )


def part_table_markdown() -> str:
    """The Part I <-> Part II table as Markdown."""
    return _table(
        ["idea", "Part I (nano-vllm)", "Part II (vLLM's hybrid cache)"],
        [[p.idea, p.part1, p.part2] for p in PART_PAIRS],
    )


def resolve(path: str) -> object:
    """The object a dotted path names ("refimpl.paged.BlockManager.allocate"); ValueError if
    none."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            if not hasattr(obj, name):
                raise ValueError(
                    f"{path}: {'.'.join(parts[:split])} has no attribute chain "
                    f"{'.'.join(parts[split:])!r}"
                )
            obj = getattr(obj, name)
        return obj
    raise ValueError(f"{path}: no module of that name")


def missing_api_names() -> list[str]:
    """Dotted paths named by the glossary or the Part I <-> Part II table that do not
    resolve."""
    paths = sorted(
        {p for t in GLOSSARY for p in t.api} | {p for pair in PART_PAIRS for p in pair.api}
    )
    missing = []
    for path in paths:
        try:
            resolve(path)
        except ValueError:
            missing.append(path)
    return missing
