"""Part II's words on one picture: spec -> bucket -> layer tuple -> group -> block table ->
slab, each shown on one cache of the running example.

Chapters 09-12 use six words for the steps from a layer's cache to its bytes in memory.
`follow_cache(specs, layer)` runs the package's planner, layout and allocator on `specs` and
returns, for each word, what it is for `layer` (a `GlossaryStep`); `draw_pipeline_glossary`
draws the steps as a chain of boxes, and `pipeline_glossary_text` is its text twin.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from refimpl.course.v4_buckets import by_page_size, find_buckets
from refimpl.course.v4_inventory import short_name
from refimpl.hybrid.kv_cache_interface import KVCacheSpec, UniformTypeKVCacheSpecs
from refimpl.hybrid.kv_cache_manager import KVCacheManager
from refimpl.hybrid.kv_cache_planning import GIB, get_kv_cache_config, get_kv_cache_groups
from refimpl.viz.palette import EMPTY, MAX_WIDTH

#: The six words, in the order the planner and the allocator use them.
TERMS = ("spec", "bucket", "layer tuple", "group", "block table", "slab")
#: Characters per line of the text twin, and of an example in the figure (8-pt monospace
# beside the term boxes).
TEXT_WIDTH = 96
FIGURE_WRAP = 88
MEANING_WRAP = 100


@dataclass(frozen=True)
class GlossaryStep:
    """One word of the chain: what it means in general and what it is for the cache
    followed."""

    term: str
    meaning: str
    example: str


def _names(names, specs) -> str:
    return ", ".join(short_name(n, specs[n]) for n in names)


def follow_cache(
    specs: Mapping[str, KVCacheSpec], layer: str, num_tokens: int = 130
) -> list[GlossaryStep]:
    """The six steps for cache `layer` of `specs`, planned by vLLM's planner, laid out in a
    1 GiB slab, and allocated for one request of `num_tokens` prompt tokens."""
    if layer not in specs:
        raise ValueError(f"layer {layer!r} is not one of the {len(specs)} caches given")
    spec = specs[layer]
    label = short_name(layer, spec)
    window = getattr(spec, "sliding_window", None)
    kind = type(spec).__name__ + (f", window {window}" if window else "")
    steps = [
        GlossaryStep(
            "spec",
            "what one layer's cache needs: its kind, tokens per block, bytes per block (page)",
            f"{label} = {layer}: {kind}, {spec.block_size}-token blocks, "
            f"page {spec.page_size_bytes:,} B",
        )
    ]

    buckets = find_buckets(specs)
    b = next(i for i, bucket in enumerate(buckets) if layer in bucket)
    bucket = buckets[b]
    merged = UniformTypeKVCacheSpecs.from_specs(bucket)
    counts = merged.page_size_counts()
    steps.append(
        GlossaryStep(
            "bucket",
            "the caches that can share a block table: same kind, block size and window, "
            "in registration order",
            f"bucket {b} of {len(buckets)}: {len(bucket)} caches ({_names(bucket, specs)}), "
            "pages " + " + ".join(f"{n} x {size:,} B" for size, n in counts.items()),
        )
    )

    by_page = by_page_size(bucket)
    position = by_page[spec.page_size_bytes].index(layer)
    tup = [names[position] for names in by_page.values() if position < len(names)]
    balanced = len(set(counts.values())) == 1
    mixed = next((by_page_size(o) for o in buckets if _balanced_mix(o)), None)
    other = ""
    if mixed and len(by_page) == 1:
        first = [names[0] for names in mixed.values()]
        other = f"; with two page sizes a tuple is a pair: ({_names(first, specs)})"
    steps.append(
        GlossaryStep(
            "layer tuple",
            "one cache of each page size of a bucket; a bucket whose page sizes all have the "
            "same count is balanced",
            f"tuple {position} of {merged.get_num_layer_tuples()}: ({_names(tup, specs)})"
            f"{', balanced' if balanced else ', not balanced'}{other}",
        )
    )

    groups = get_kv_cache_groups(specs)
    g = next(i for i, group in enumerate(groups) if layer in group.layer_names)
    group = groups[g]
    from_bucket = [grp for grp in groups if set(grp.layer_names) <= set(bucket)]
    steps.append(
        GlossaryStep(
            "group",
            "the caches that share one block table; a balanced bucket is dealt into groups "
            "tuple by tuple",
            f"group {g}: {_names(group.layer_names, specs)} (bucket {b} dealt into "
            f"{len(from_bucket)}), width {group.width_bytes:,} B per block id",
        )
    )

    config = get_kv_cache_config(groups, GIB)
    manager = KVCacheManager.from_config(config, max_model_len=max(num_tokens, 1))
    request = manager.make_request("R", list(range(num_tokens)))
    if manager.allocate_slots(request, num_tokens) is None:
        raise ValueError(f"{num_tokens} tokens do not fit in a 1 GiB slab of these caches")
    ids = manager.get_block_ids("R")
    steps.append(
        GlossaryStep(
            "block table",
            "per request and group: logical block i -> a block id from the one shared pool",
            f"request R, {num_tokens} tokens: group {g} holds block ids {ids[g]} "
            f"({group.kv_cache_spec.block_size}-token blocks); "
            f"{len(groups)} groups, {len(groups)} tables",
        )
    )

    tensor = next(t for t in config.kv_cache_tensors if layer in t.shared_by)
    offset = tensor.layer_offset(layer)
    block_id = ids[g][-1]
    steps.append(
        GlossaryStep(
            "slab",
            "one buffer of num_blocks x stride bytes (stride: the widest group's width); "
            "a page sits at block id x stride + the cache's offset",
            f"{config.num_blocks:,} blocks x {config.block_stride:,} B; {label} of block "
            f"{block_id} at {block_id} x {config.block_stride:,} + {offset:,} = "
            f"{block_id * config.block_stride + offset:,} B",
        )
    )
    return steps


def _balanced_mix(bucket: Mapping[str, KVCacheSpec]) -> bool:
    """Whether a bucket has several page sizes, each with the same count."""
    counts = list(by_page_size(bucket).values())
    return len(counts) > 1 and len({len(names) for names in counts}) == 1


def pipeline_glossary_text(steps: list[GlossaryStep]) -> str:
    """The figure's words as lines of at most 96 characters: each term with its meaning,
    then what it is for the cache followed."""
    lines = []
    for i, step in enumerate(steps, 1):
        lines += textwrap.wrap(
            f"{i}. {step.term}: {step.meaning}", TEXT_WIDTH, subsequent_indent="   "
        )
        lines += textwrap.wrap(
            f"here: {step.example}", TEXT_WIDTH, initial_indent="   ", subsequent_indent="   "
        )
    return "\n".join(lines)


def draw_pipeline_glossary(steps: list[GlossaryStep], title: str) -> Figure:
    """The chain of words top to bottom: a box per term joined by arrows, its meaning beside
    it, and under that what it is for the cache followed."""
    meanings = [textwrap.wrap(step.meaning, MEANING_WRAP) for step in steps]
    wrapped = [textwrap.wrap(step.example, FIGURE_WRAP) for step in steps]
    heights = [len(m) + len(e) for m, e in zip(meanings, wrapped)]  # text lines per row
    line_in = 0.17
    gap_in = 0.22
    total_in = sum(h * line_in for h in heights) + gap_in * (len(steps) - 1) + 0.45
    fig = Figure(figsize=(MAX_WIDTH - 0.2, total_in))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, MAX_WIDTH - 0.2)
    ax.set_ylim(total_in, 0)
    ax.axis("off")
    ax.text(0.05, 0.08, title, fontsize=10, fontweight="bold", va="top")
    y = 0.45
    box_w, text_x = 1.15, 1.4
    centres = []
    for step, meaning, lines, h in zip(steps, meanings, wrapped, heights):
        row_h = h * line_in
        box_h = min(row_h, 0.34)
        top = y + (row_h - box_h) / 2
        ax.add_patch(
            FancyBboxPatch(
                (0.08, top),
                box_w,
                box_h,
                boxstyle="round,pad=0.02",
                facecolor=EMPTY,
                edgecolor="black",
                linewidth=0.8,
            )
        )
        ax.text(
            0.08 + box_w / 2,
            top + box_h / 2,
            step.term,
            ha="center",
            va="center",
            fontsize=9,
            fontweight="bold",
        )
        centres.append((top, top + box_h))
        ax.text(
            text_x,
            y,
            "\n".join(meaning),
            fontsize=8,
            va="top",
            style="italic",
            color="#444444",
            linespacing=1.25,
        )
        ax.text(
            text_x,
            y + len(meaning) * line_in,
            "\n".join(lines),
            fontsize=8,
            va="top",
            family="monospace",
            linespacing=1.25,
        )
        y += row_h + gap_in
    for (_, bottom), (next_top, _) in zip(centres, centres[1:]):
        ax.add_patch(
            FancyArrowPatch(
                (0.08 + box_w / 2, bottom + 0.02),
                (0.08 + box_w / 2, next_top - 0.02),
                arrowstyle="-|>",
                mutation_scale=10,
                color="black",
                linewidth=0.8,
            )
        )
    return fig
