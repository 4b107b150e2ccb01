"""The course map says what is on disk, its picture reads at a notebook's width, and its tables
name real code."""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from refimpl.hybrid import BlockPool
from refimpl.hybrid.kv_cache_utils import make_block_hash_with_group_id
from refimpl.paged import BlockManager, SamplingParams, Sequence
from refimpl.viz import course_map
from refimpl.viz.course_map import (
    CHAPTERS,
    GLOSSARY,
    PART_PAIRS,
    all_needs,
    chapter,
    chapters_markdown,
    course_map_text,
    draw_course_map,
    glossary_markdown,
    missing_api_names,
    part_table_markdown,
    resolve,
    route_to,
    total_minutes,
)

matplotlib.use("Agg")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
ON_DISK = sorted(path.name for path in NOTEBOOKS.glob("[0-9]*.ipynb"))


def title_line(path: Path) -> str:
    return "".join(
        json.loads(path.read_text(encoding="utf-8"))["cells"][0]["source"]
    ).splitlines()[0]


# --- the list against the notebooks


def test_chapter_list_is_exactly_the_notebooks_on_disk():
    """Passes once every chapter exists (after the 05b and 13 chapters are merged)."""
    assert [c.file for c in CHAPTERS] == ON_DISK


def test_every_notebook_on_disk_is_listed():
    listed = {c.file for c in CHAPTERS}
    assert [name for name in ON_DISK if name not in listed] == []
    assert len(ON_DISK) >= 12  # the glob found the notebooks (not an empty, vacuous list)


def test_readme_links_every_chapter():
    readme = (NOTEBOOKS.parent / "README.md").read_text(encoding="utf-8")
    assert [c.file for c in CHAPTERS if f"[{c.title}](notebooks/{c.file})" not in readme] == []


def title_matches(listed: str, on_disk: str) -> bool:
    """The notebook's title starts with the listed one ("The BlockManager: allocate, append,
    free" for "The BlockManager"), or, for a chapter being retitled, the listed title starts
    with the part of the notebook's title before its colon ("The scheduler" of "The scheduler:
    prefill, ...")."""
    return on_disk.startswith(listed) or listed.startswith(on_disk.split(":")[0])


def test_title_rule_tells_chapters_apart():
    assert title_matches("The BlockManager", "The BlockManager: allocate, append, free")
    assert title_matches(
        "The scheduler loop", "The scheduler: prefill, decode, chunks and preemption"
    )
    assert title_matches("The scheduler loop", "The scheduler loop")
    assert not title_matches(
        "Kernels", "The engine: from text to tokens to blocks to attention"
    )
    assert not title_matches("The prefix cache", "The BlockManager: allocate, append, free")


def test_listed_titles_match_the_notebooks_that_exist():
    checked = []
    for c in CHAPTERS:
        path = NOTEBOOKS / c.file
        if not path.exists():
            continue
        line = title_line(path)
        prefix = f"# {c.number} · "
        assert line.startswith(prefix), (
            f"{c.file}: title line {line!r} does not start with {prefix!r}"
        )
        assert title_matches(c.title, line[len(prefix) :]), (
            f"{c.file}: {line!r} is not {c.title!r}"
        )
        checked.append(c.number)
    # Everything but the chapters written in parallel (05b, 13) exists in every branch.
    assert set(checked) >= {c.number for c in CHAPTERS} - {"05b", "13"}


def test_numbers_files_and_order_agree():
    numbers = [c.number for c in CHAPTERS]
    assert numbers == [
        "00",
        "01",
        "02",
        "03",
        "04",
        "05",
        "05b",
        "06",
        "07",
        "08a",
        "08b",
        "09",
        "10",
        "11",
        "12",
        "13",
        "14",
    ]
    assert all(
        c.file.startswith(c.number + "_") and c.file.endswith(".ipynb") for c in CHAPTERS
    )
    # file order is reading order
    assert [c.file for c in CHAPTERS] == sorted(c.file for c in CHAPTERS)


def test_needs_point_backwards_and_every_chapter_leads_back_to_00():
    position = {c.number: i for i, c in enumerate(CHAPTERS)}
    for c in CHAPTERS:
        assert all(position[n] < position[c.number] for n in c.needs), c.number
        if c.number != "00":
            assert all_needs(c.number)[0] == "00"
    assert all_needs("13") == [
        "00",
        "01",
        "02",
        "03",
        "04",
        "05",
        "06",
        "07",
        "08a",
        "08b",
        "09",
        "10",
        "11",
        "12",
    ]
    assert all_needs("05b") == ["00", "01", "02", "03", "04", "05"]
    assert "05b" not in all_needs("13")  # the corner cases are not needed for Part II or III


def test_parts_and_minutes():
    assert [c.number for c in CHAPTERS if c.part == "Part I"] == [
        "01",
        "02",
        "03",
        "04",
        "05",
        "05b",
        "06",
        "07",
    ]
    # 14 plans any model with Part II's planner and needs only 12: the README's three parts
    assert [c.number for c in CHAPTERS if c.part == "Part II"] == [
        "08a",
        "08b",
        "09",
        "10",
        "11",
        "12",
        "14",
    ]
    assert [c.number for c in CHAPTERS if c.part == "Part III"] == ["13"]
    assert {c.part for c in CHAPTERS} == {"Start", "Part I", "Part II", "Part III"}
    assert total_minutes() == sum(c.minutes for c in CHAPTERS) == 690
    assert total_minutes("Part II") == 280
    with pytest.raises(ValueError, match="no chapter '15'"):
        chapter("15")


def test_text_twin():
    lines = course_map_text().splitlines()
    assert lines[0] == "Start: how the course works (15 min)"
    assert lines[1] == "  00  Start here" + " " * 38 + " 15 min  needs -"
    assert "  05b Scheduler corner cases" + " " * 26 + " 45 min  needs 05" in lines
    assert lines[-1] == "total: 690 min, about 11.5 hours"
    assert sum(1 for line in lines if line.startswith("  ")) == len(CHAPTERS)


def test_markdown_table_links_every_chapter():
    rows = chapters_markdown().splitlines()[2:]
    assert len(rows) == len(CHAPTERS)
    assert (
        rows[6]
        == "| 05b | [Scheduler corner cases](05b_scheduler_corner_cases.ipynb) | Part I | 45 | 05 |"
    )


# --- the picture


@pytest.mark.parametrize(
    "route", [None, ("00", "01", "02", "03", "04", "08a")], ids=["map", "route"]
)
def test_picture_reads_at_notebook_width(route):
    fig = draw_course_map(route=route)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    width, _ = fig.get_size_inches()
    # shown at its own size in a notebook, so point sizes are what the reader sees
    assert width <= 9.0
    ax = fig.axes[0]
    texts = [t for t in ax.texts if t.get_text()]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()][:4] == [
        "Start: how the course works (15 min)",
        "Part I: nano-vllm's paged cache (350 min)",
        "Part II: vLLM's hybrid cache (V4, any model) (280 min)",
        "Part III: a tiny DeepSeek V4 runs on it (45 min)",
    ]
    every_text = texts + list(legend.get_texts()) + [legend.get_title(), fig._suptitle]
    assert min(t.get_fontsize() for t in every_text) >= 8
    # One number per chapter, in a box of its part's colour.
    numbers = [t.get_text() for t in texts if re.fullmatch(r"\d\d[ab]?", t.get_text())]
    assert sorted(numbers) == sorted(c.number for c in CHAPTERS)
    # Nothing overprinted: no two labels' boxes overlap, and no label leaves the figure.
    boxes = [t.get_window_extent(renderer) for t in every_text]
    for i, a in enumerate(boxes):
        assert (
            a.x0 >= 0 and a.y0 >= 0 and a.x1 <= fig.bbox.width and a.y1 <= fig.bbox.height
        ), every_text[i].get_text()
        for j in range(i + 1, len(boxes)):
            assert not a.overlaps(boxes[j]), (
                every_text[i].get_text(),
                every_text[j].get_text(),
            )
    # Legend and chapter boxes do not overlap either.
    legend_box = legend.get_window_extent(renderer)
    for patch in ax.patches:
        if type(patch).__name__ == "FancyBboxPatch":
            assert not legend_box.overlaps(patch.get_window_extent(renderer))


@pytest.mark.parametrize("route", [None, ("00", "01", "02", "03", "04", "08a")])
def test_no_arrow_runs_through_a_box(route):
    """An arrow is clipped at the two boxes it joins, so none of its drawn points may lie
    inside any chapter box: an arrow behind a third box reads as a path through that chapter
    (07 -> 11 once ran behind 14 and read as 07 -> 14 -> 11)."""
    fig = draw_course_map(route=route)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    ax = fig.axes[0]
    renderer = canvas.get_renderer()
    inset = 3.0  # px: the arrow head stops 1 pt short of its target's edge
    boxes = {
        number: p.get_window_extent(renderer).padded(-inset)
        for number, p in zip(
            [c.number for c in CHAPTERS],
            [p for p in ax.patches if type(p).__name__ == "FancyBboxPatch"],
        )
    }
    arrows = [p for p in ax.patches if type(p).__name__ == "FancyArrowPatch"]
    assert len(arrows) == sum(len(c.needs) for c in CHAPTERS)
    for arrow in arrows:
        points = arrow.get_transform().transform_path(arrow.get_path()).interpolated(40)
        inside = sorted(
            number
            for number, box in boxes.items()
            if any(box.contains(x, y) for x, y in points.vertices)
        )
        assert not inside, f"an arrow runs through chapter box(es) {inside}"


def test_every_label_stays_inside_its_chapter_box():
    """A box's number, title and minutes lie inside the box with a margin, at the width a
    reader sees (a long title such as BlockManager wraps instead of running over the edge)."""
    fig = draw_course_map()
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    ax = fig.axes[0]
    boxes = [
        p.get_window_extent(renderer)
        for p in ax.patches
        if type(p).__name__ == "FancyBboxPatch"
    ]
    assert len(boxes) == len(CHAPTERS)
    margin = 2 * fig.dpi / 72  # 2 pt
    for text in (t for t in ax.texts if t.get_text()):
        extent = text.get_window_extent(renderer)
        x, y = (extent.x0 + extent.x1) / 2, (extent.y0 + extent.y1) / 2
        box = next(b for b in boxes if b.contains(x, y))
        assert box.x0 + margin <= extent.x0 and extent.x1 <= box.x1 - margin, text.get_text()


def test_route_is_every_need_then_the_goal():
    # no 05-07
    assert route_to("10") == ["00", "01", "02", "03", "04", "08a", "08b", "09", "10"]
    assert route_to("12") == [
        "00",
        "01",
        "02",
        "03",
        "04",
        "05",
        "06",
        "07",
        "08a",
        "08b",
        "09",
        "10",
        "11",
        "12",
    ]
    assert route_to("00") == ["00"]
    with pytest.raises(ValueError, match="no chapter '99'"):
        route_to("99")


def test_route_picture_marks_the_route_and_its_goal():
    fig = draw_course_map(route=route_to("02"))
    ax = fig.axes[0]
    boxes = [p for p in ax.patches if type(p).__name__ == "FancyBboxPatch"]
    assert [p.get_linestyle() for p in boxes].count("-") == 3  # 00, 01, 02 on the route
    goal = [i for i, p in enumerate(boxes) if p.get_linewidth() == 3.0]
    assert goal == [2] and boxes[2].get_edgecolor()[:3] == (0.0, 0.0, 0.0)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[-2:] == ["not on this route", "the route's goal"]
    assert min(t.get_fontsize() for t in ax.get_legend().get_texts()) >= 8
    with pytest.raises(ValueError, match="no chapter '99'"):
        draw_course_map(route=["99"])


def test_one_arrow_per_need():
    fig = draw_course_map()
    arrows = [p for p in fig.axes[0].patches if type(p).__name__ == "FancyArrowPatch"]
    assert len(arrows) == sum(len(c.needs) for c in CHAPTERS)


# --- glossary and the Part I <-> Part II table


def test_glossary_has_the_terms_the_course_uses():
    terms = {t.term for t in GLOSSARY}
    required = {
        "block",
        "page",
        "slot",
        "slot mapping",
        "block table",
        "block stride",
        "page size",
        "layer tuple",
        "cache group",
        "KV cache spec",
        "null block",
        "hash block size",
        "lcm alignment",
        "prefix cache hit",
        "free queue",
        "ref count",
        "chunked prefill",
        "preemption",
        "MLA",
        "SWA",
        "compressor",
        "indexer",
        "MTP",
    }
    assert required <= terms
    assert all(t.chapter in {c.number for c in CHAPTERS} for t in GLOSSARY)
    table = glossary_markdown().splitlines()
    assert len(table) == 2 + len(GLOSSARY)
    assert table[2].startswith("| **block** |")


def test_every_named_api_exists():
    assert missing_api_names() == []
    assert resolve("refimpl.paged.BlockManager.allocate") is BlockManager.allocate
    with pytest.raises(ValueError, match="no attribute chain 'BlockManager.allocate_slots'"):
        resolve("refimpl.paged.BlockManager.allocate_slots")


def test_missing_api_names_notices_a_rename(monkeypatch):
    monkeypatch.setattr(
        course_map,
        "GLOSSARY",
        GLOSSARY + (course_map.Term("x", "y", ("refimpl.paged.Nope",)),),
    )
    assert missing_api_names() == ["refimpl.paged.Nope"]


def test_lcm_alignment_and_hash_block_size_are_what_the_glossary_says():
    """256 = lcm of DeepSeek V4's group block sizes; the hash block size is their gcd (4)."""
    from refimpl.hybrid import (
        KVCacheManager,
        deepseek_v4,
        get_kv_cache_config,
        get_kv_cache_groups,
    )

    groups = get_kv_cache_groups(deepseek_v4.kv_cache_specs("flash"))
    config = get_kv_cache_config(groups, 1 << 30)
    manager = KVCacheManager.from_config(config, max_model_len=4096)
    assert manager.scheduler_block_size == 256
    assert manager.hash_block_size == 4


def test_free_order_row_is_what_the_code_does():
    """Part I: freed blocks go to the tail, last block first. Part II: unhashed to the front,
    hashed to the back."""
    bm = BlockManager(num_blocks=6, block_size=2)
    seq = Sequence([1, 2, 3, 4, 5], SamplingParams(max_tokens=1), block_size=2)
    bm.allocate(seq, bm.can_allocate(seq))
    assert seq.block_table == [0, 1, 2]
    bm.deallocate(seq)
    assert list(bm.free_block_ids) == [3, 4, 5, 2, 1, 0]

    pool = BlockPool(6)  # block 0 is the null block
    blocks = pool.get_new_blocks(3)
    assert [b.block_id for b in blocks] == [1, 2, 3]
    pool.cache_full_blocks(
        [b"h" * 16], blocks, num_cached_blocks=0, num_full_blocks=1, kv_cache_group_id=0
    )
    assert blocks[0].block_hash == make_block_hash_with_group_id(b"h" * 16, 0)
    pool.free_blocks(reversed(blocks))  # the table's last block first, as the managers free
    assert [b.block_id for b in pool.free_block_queue] == [3, 2, 4, 5, 1]
    row = next(p for p in PART_PAIRS if p.idea == "free order")
    assert "front" in row.part2 and "back" in row.part2 and "tail" in row.part1


def test_part_table_names_the_upstream_classes():
    table = part_table_markdown()
    for name in (
        "BlockManager",
        "BlockPool",
        "SingleTypeKVCacheManager",
        "KVCacheCoordinator",
        "KVCacheManager",
        "allocate_slots",
        "can_allocate",
        "hash_block_size",
        "make_block_hash_with_group_id",
    ):
        assert f"`{name}" in table, name
