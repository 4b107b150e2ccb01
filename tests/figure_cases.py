"""Every drawing function of refimpl.viz, called as the chapters call it (same props, same
sizes).

`CASES` maps a case name to (the draw function it exercises, a zero-argument builder returning
the Figure a chapter shows). Steppers' pictures are built through `Stepper.figure`, which adds
the step caption, because that is the picture a reader sees. tests/test_viz_figure_sizes.py
renders each case as the notebook's inline backend does and checks its width and its smallest
text.

    # write each case's PNG as a notebook shows it
    python -m tests.figure_cases OUT_DIR [CASE...]
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from pathlib import Path

import refimpl.viz.allocator as allocator
import refimpl.viz.course_map as course_map
import refimpl.viz.engine as engine
import refimpl.viz.hybrid_layout as hybrid_layout
import refimpl.viz.hybrid_stepper as hybrid_stepper
import refimpl.viz.kernels as kernels
import refimpl.viz.paged as paged
import refimpl.viz.pipeline_glossary as pipeline_glossary
import refimpl.viz.request_plan as request_plan
import refimpl.viz.scheduler_stepper as scheduler_stepper
import refimpl.viz.softmax_stepper as softmax_stepper
import refimpl.viz.split_kv as split_kv
import refimpl.viz.timeline as timeline
import refimpl.viz.traffic as traffic
import refimpl.viz.v4_engine as v4_engine
import refimpl.viz.v4_layer as layer_viz
from refimpl.viz.stepper import Frame, Stepper, record_frames

Builder = Callable[[], object]


def _stepper_figures(stepper: Stepper) -> list:
    """Every frame's picture, as the widget and the static strip show it."""
    return [stepper.figure(i) for i in range(len(stepper))]


# --- Part I
# -------------------------------------------------------------------------------------


def course_map_plain():
    return course_map.draw_course_map()


def course_map_route():
    return course_map.draw_course_map(
        "The route to chapter 12, the hybrid allocator", route=course_map.route_to("12")
    )


def pool_snapshot_00():
    """Chapter 00's stepper: two requests in a pool of 6 two-token blocks."""
    from refimpl.course.paged_steps import decode_step, prefill
    from refimpl.paged import BlockManager, Sequence

    bm = BlockManager(num_blocks=6, block_size=2)
    seqs = {"A": Sequence([1, 2, 3], block_size=2), "B": Sequence([7, 8], block_size=2)}
    a, b = seqs["A"], seqs["B"]
    actions = [
        ("prefill(A): 3 tokens", lambda: prefill(bm, a)),
        ("prefill(B): 2 tokens", lambda: prefill(bm, b)),
        ("A decodes token 4", lambda: decode_step(bm, a, 4)),
        ("B decodes token 9", lambda: decode_step(bm, b, 9)),
        ("A decodes token 5", lambda: decode_step(bm, a, 5)),
    ]
    frames = record_frames(lambda: paged.pool_snapshot(bm, seqs), actions)
    return _stepper_figures(
        Stepper(frames, paged.draw_pool_snapshot, paged.pool_snapshot_text)
    )


def fragmentation():
    from refimpl.course.fragmentation import compare_allocation, sample_request_lengths

    lengths = sample_request_lengths(1000, max_len=2048, seed=0)
    return paged.draw_fragmentation(
        lengths, compare_allocation(lengths.total_lens, 2048, block_sizes=[1, 16, 256])
    )


def _running_example_pool():
    from refimpl.course import running_example
    from refimpl.paged import BlockManager

    bm = BlockManager(num_blocks=8, block_size=4)
    seqs = running_example.requests(block_size=4)
    return bm, seqs


def block_pool_scattered():
    """Chapter 02: fillers scatter the free blocks, then A's 11 tokens land in #5, #2, #6."""
    from refimpl.paged import Sequence

    bm, seqs = _running_example_pool()
    fillers = {f"f{i}": Sequence([900 + i], block_size=4) for i in range(8)}
    for f in fillers.values():
        bm.allocate(f, bm.can_allocate(f))
    for name in ("f5", "f2", "f6"):
        bm.deallocate(fillers[name])
    a = seqs["A"]
    bm.allocate(a, bm.can_allocate(a))
    others = {name: f for name, f in fillers.items() if f.block_table}
    return paged.draw_block_pool(
        bm,
        {**others, "A": a},
        muted=others,
        title="A's 11 tokens in blocks #5, #2, #6 (fillers in grey)",
    )


def pool_snapshot_stepper():
    """Chapter 03's stepper over the running example (every frame)."""
    from refimpl.viz.paged_stepper import running_example_actions

    bm, seqs = _running_example_pool()
    frames = record_frames(
        lambda: paged.pool_snapshot(bm, seqs), running_example_actions(bm, seqs)
    )
    return _stepper_figures(
        Stepper(frames, paged.draw_pool_snapshot, paged.pool_snapshot_text)
    )


def prefix_cache_stepper():
    """Chapter 04's stepper: A, B, then A's second turn."""
    from refimpl.paged import Sequence
    from refimpl.viz.paged_stepper import prefix_cache_actions, second_turn_prompt

    bm, seqs = _running_example_pool()
    seqs = {name: seqs[name] for name in ("A", "B")}
    seqs["A2"] = Sequence(second_turn_prompt(), block_size=4)
    frames = record_frames(
        lambda: paged.pool_snapshot(bm, seqs), prefix_cache_actions(bm, seqs)
    )
    return _stepper_figures(
        Stepper(frames, paged.draw_pool_snapshot, paged.pool_snapshot_text)
    )


def _second_turn_lookup():
    from refimpl.course.paged_steps import prefill
    from refimpl.course.prefix_match import explain_prefix_match
    from refimpl.paged import Sequence
    from refimpl.viz.paged_stepper import second_turn_prompt

    bm, seqs = _running_example_pool()
    a, b = seqs["A"], seqs["B"]
    prefill(bm, a)
    for token in (211, 212):
        a.append_token(token)
        bm.may_append(a)
        a.num_scheduled_tokens = 1
        bm.hash_blocks(a)
        a.num_cached_tokens += 1
        a.num_scheduled_tokens = 0
    prefill(bm, b)
    bm.deallocate(a)
    return bm, explain_prefix_match(bm, Sequence(second_turn_prompt(), block_size=4)), {"B": b}


def prefix_lookup():
    bm, match, holders = _second_turn_lookup()
    return paged.draw_prefix_lookup(
        bm,
        match,
        holders,
        title="A's second turn (18 tokens): 3 hits (2 in use, 1 freed), then a miss",
    )


def prefix_lookup_article():
    from refimpl.course.paged_scenarios import prefix_cache_example
    from refimpl.course.prefix_match import explain_prefix_match

    bm, holders, request = prefix_cache_example()
    return paged.draw_prefix_lookup(
        bm,
        explain_prefix_match(bm, request),
        holders,
        title="The article's example: 12 tokens, block_size 4 -> 2 hits, 8 cached tokens",
    )


def prefix_match():
    _, match, _ = _second_turn_lookup()
    return paged.draw_prefix_match(match)


def reusable_tokens():
    return paged.draw_reusable_tokens(600, 700, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512])


def scheduler_stepper_frames():
    """Chapter 05b's stepper: three requests in 7 blocks (preemption)."""
    from refimpl.course import running_example
    from refimpl.course.runners import FakeModelRunner
    from refimpl.paged import Scheduler, SchedulerConfig

    scheduler = Scheduler(SchedulerConfig(num_kvcache_blocks=7, kvcache_block_size=4))
    reqs = running_example.requests(block_size=4, max_tokens=5)
    for name in ("A", "B", "C"):
        scheduler.add(reqs[name])
    frames = scheduler_stepper.scheduler_frames(
        scheduler, FakeModelRunner.for_scheduler(scheduler), reqs
    )
    return _stepper_figures(
        Stepper(
            frames,
            scheduler_stepper.draw_scheduler_state,
            scheduler_stepper.scheduler_state_text,
        )
    )


def scheduler_stepper_frames_05():
    """Chapter 05's stepper: A, then B and C arriving at step 1, in 12 blocks."""
    from refimpl.course import running_example
    from refimpl.course.runners import FakeModelRunner
    from refimpl.paged import Scheduler, SchedulerConfig

    scheduler = Scheduler(SchedulerConfig(num_kvcache_blocks=12, kvcache_block_size=4))
    reqs = running_example.requests(block_size=4, max_tokens=3)
    scheduler.add(reqs["A"])
    frames = scheduler_stepper.scheduler_frames(
        scheduler, FakeModelRunner.for_scheduler(scheduler), reqs, arrivals={1: ["B", "C"]}
    )
    return _stepper_figures(
        Stepper(
            frames,
            scheduler_stepper.draw_scheduler_state,
            scheduler_stepper.scheduler_state_text,
        )
    )


def _timeline(num_blocks: int, max_tokens: int, late: int, **config):
    from refimpl.course import running_example
    from refimpl.course.runners import SchedulerDriver
    from refimpl.paged import Scheduler, SchedulerConfig

    driver = SchedulerDriver(
        Scheduler(
            SchedulerConfig(num_kvcache_blocks=num_blocks, kvcache_block_size=4, **config)
        )
    )
    reqs = running_example.requests(block_size=4, max_tokens=max_tokens)
    names = running_example.names_by_seq_id(reqs)
    early, later = (
        [reqs[n] for n in running_example.NAMES[: 3 - late]],
        [reqs[n] for n in running_example.NAMES[3 - late :]],
    )
    driver.add(early)
    driver.step()
    if late == 1:
        driver.step()
    driver.add(later)
    driver.run()
    return timeline.draw_timeline(
        driver.steps, num_blocks=num_blocks, names=names, title="the running example"
    )


def timeline_05():
    return _timeline(12, 4, late=2)


def timeline_05b():
    return _timeline(6, 6, late=1, max_num_batched_tokens=8)


def step_inputs():
    """Chapter 06: one prefill step with a cached prefix, on a tiny model."""
    import tempfile

    from refimpl.engine import LLM, SamplingParams, get_context, make_tiny_model, reset_context

    with tempfile.TemporaryDirectory() as tmp:
        llm = LLM(make_tiny_model(tmp, seed=0), kvcache_block_size=4, num_kvcache_blocks=10)
        sp = SamplingParams(temperature=0, max_tokens=2)
        llm.generate([[10, 11, 12, 13, 14, 15, 16, 17, 18]], sp, use_tqdm=False)
        b = llm.add_request([10, 11, 12, 13, 14, 15, 16, 17, 40, 41], sp)
        c = llm.add_request([65, 66, 67], sp)
        seqs, _ = llm.scheduler.schedule()
        llm.model_runner.prepare_prefill(seqs)
        try:
            return engine.draw_step_inputs(
                seqs,
                get_context(),
                10,
                {b.seq_id: "B", c.seq_id: "C"},
                label=engine.byte_label,
            )
        finally:
            reset_context()


def paged_layout():
    return kernels.draw_paged_layout([[5, 2, 7], [1, 3]], [10, 6], 4, 8)


def _decode_case():
    """Chapter 07's decode example: (q, k_cache, v_cache, block_table, seqlens, the twin's
    output)."""
    import torch

    from refimpl.kernels import reference

    generator = torch.Generator().manual_seed(0)
    k = torch.randn(8, 4, 2, 8, generator=generator)
    v = torch.randn(8, 4, 2, 8, generator=generator)
    q = torch.randn(1, 4, 8, generator=generator)
    table = torch.tensor([[5, 2, 7]], dtype=torch.int32)
    lens = torch.tensor([10], dtype=torch.int32)
    return q, k, v, table, lens, reference.paged_decode_attention(q, k, v, lens, table)[0, 0]


def softmax_frames():
    from refimpl.kernels import reference
    from refimpl.kernels.online_softmax import OnlineSoftmax

    q, k, v, table, lens, out = _decode_case()
    walk = OnlineSoftmax(q[0, 0], k, v, seqlen=10, block_table=table[0], kv_head=0, block_n=3)
    frames = softmax_stepper.softmax_frames(walk)
    keys = reference.gather_kv(k, table, lens, 10)[0, :, 0]
    drawer = softmax_stepper.softmax_drawer(keys @ q[0, 0] / math.sqrt(8), out)
    return _stepper_figures(Stepper(frames, drawer, softmax_stepper.softmax_state_text))


def sm_occupancy():
    return split_kv.draw_sm_occupancy(4, 8, [1, 8], 132)


def merge_frames():
    """Chapter 07's merge stepper: sequence 0, query head 0, chunks of 4 positions."""
    from refimpl.kernels.online_softmax import PartialMerge, chunk_partials

    q, k, v, table, _, out = _decode_case()
    parts = chunk_partials(
        q[0, 0], k, v, 10, table[0], kv_head=0, tokens_per_split=4, block_n=3
    )
    stepper = Stepper(
        split_kv.merge_frames(PartialMerge(parts)),
        split_kv.merge_drawer(out),
        split_kv.merge_state_text,
    )
    return _stepper_figures(stepper)


def decode_timings():
    """A record in the format benchmarks/kernels_gpu.py writes, three decode shapes (made-up
    numbers)."""
    shapes = [
        dict(
            batch=b,
            context=c,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            dtype="float16",
            block_size=16,
            kv_bytes=2 * b * c * 8 * 128 * 2,
            sdpa_ms=0.1 * b * c / 65536,
            unsplit_ms=0.5 * b * c / 65536,
            split_ms=0.2 * b * c / 65536,
            auto_splits=3,
        )
        for b, c in ((32, 2048), (64, 512), (4, 8192))
    ]
    return split_kv.draw_decode_timings(
        dict(machine="A GPU", torch="2", triton="3", copy_gbps=4000.0, decode=shapes)
    )


def prefill_mask():
    return kernels.draw_prefill_mask(q_len=3, k_len=10)


def reuse_by_block_size():
    return kernels.draw_reuse_by_block_size([100, 300, 600, 1000, 2000], 40, [16, 256])


# --- Part II
# ------------------------------------------------------------------------------------


def _pro():
    from refimpl.hybrid import deepseek_v4 as v4
    from refimpl.hybrid.kv_cache_planning import get_kv_cache_groups

    specs = v4.kv_cache_specs("pro")
    return specs, get_kv_cache_groups(specs)


def _pro_b():
    from refimpl.hybrid import deepseek_v4 as v4
    from refimpl.hybrid.older_planners import get_kv_cache_groups_b

    specs = v4.kv_cache_specs("pro")
    return specs, get_kv_cache_groups_b(specs)


def overlapping_windows():
    """Chapter 08a: the weights two ratio-4 entries give their 8 window rows."""
    import torch

    scores = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    scores[0, :4] = -float("inf")  # entry 0 has no previous window
    return layer_viz.draw_overlapping_windows(scores.softmax(dim=1))


def indexer_picks():
    """Chapter 08a: 24 query positions scoring 6 compressed entries, top-2, -1 where fewer are
    visible."""
    import torch

    from refimpl.v4.topk import stable_topk

    visible = (torch.arange(24) + 1) // 4
    scores = torch.randn(24, 6, generator=torch.Generator().manual_seed(7))
    scores = scores.masked_fill(torch.arange(6)[None] >= visible[:, None], float("-inf"))
    top = stable_topk(scores, 2)
    return layer_viz.draw_indexer_picks(scores, torch.where(top >= visible[:, None], -1, top))


def fp8_ds_mla_page():
    return [
        layer_viz.draw_fp8_ds_mla_page(
            2,
            alignment=576,
            title="one c128a page: 2 entries of 584 bytes, padded to a multiple of 576",
        ),
        layer_viz.draw_fp8_ds_mla_page(64, alignment=576),
    ]


def v4_layer():
    return hybrid_layout.draw_v4_layer(
        (4, 128),
        title="What one DeepSeek V4 layer writes: a ratio-4 layer and a ratio-128 layer",
    )


def position_strip():
    return hybrid_layout.draw_position_strip(16)


def pages():
    from refimpl.course.v4_inventory import page_size_rows
    from refimpl.hybrid import deepseek_v4 as v4

    return hybrid_layout.draw_pages(
        page_size_rows(v4.kv_cache_specs("pro")),
        title="DeepSeek V4-Pro, fp8_ds_mla: one page of each cache kind",
    )


def padding_curve():
    """Chapter 09 (planner C's balanced buckets) and planner B's four buckets."""
    return [
        hybrid_layout.draw_padding_curve(
            [61, 31, 30], lower_bound=30, title="Pro: padding against d (search from 30 to 61)"
        ),
        hybrid_layout.draw_padding_curve(
            [31, 61, 31, 30],
            lower_bound=31,
            title="Pro: padding against d (search from 31 to 61)",
        ),
    ]


def grouping():
    return [
        hybrid_layout.draw_grouping(
            *planned, title="DeepSeek V4-Pro: caches of each decoder layer, by group"
        )
        for planned in (_pro(), _pro_b())
    ]


def groupings():
    from refimpl.hybrid import deepseek_v4 as v4
    from refimpl.hybrid.kv_cache_planning import get_kv_cache_groups

    flash = v4.kv_cache_specs("flash")
    models = {
        "DeepSeek V4-Pro": _pro(),
        "DeepSeek V4-Flash": (flash, get_kv_cache_groups(flash)),
    }
    return hybrid_layout.draw_groupings(
        models, title="Pro and Flash: caches of each decoder layer, by group"
    )


def slab():
    """Chapter 10 draws planner C's groups in layout order (spec runs); B's groups as they
    are."""
    from refimpl.course.layout_summary import groups_in_layout_order
    from refimpl.hybrid.kv_cache_planning import GIB, get_kv_cache_config

    specs, groups = _pro()
    laid_out = groups_in_layout_order(get_kv_cache_config(groups, 10 * GIB))
    figures = []
    for groups in (laid_out, _pro_b()[1]):
        figures.append(
            hybrid_layout.draw_slab(
                specs, groups, title="DeepSeek V4-Pro: one block, drawn to scale"
            )
        )
        for upto in (60_000, 100_000):
            figures.append(
                hybrid_layout.draw_slab(
                    specs,
                    groups,
                    upto=upto,
                    title=f"DeepSeek V4-Pro: the first {upto:,} bytes of a block",
                )
            )
    return figures


def blocks_per_budget():
    from refimpl.hybrid.kv_cache_planning import GIB, get_kv_cache_bytes_per_block
    from refimpl.hybrid.older_planners import (
        bytes_per_block_b,
        bytes_per_block_slots,
        bytes_per_block_v0,
    )

    _, groups_b = _pro_b()
    layouts = {
        "5 groups (planner C)": get_kv_cache_bytes_per_block(_pro()[1]),
        "5 groups (planner B)": bytes_per_block_b(groups_b),
        "older V0 (3 page sizes)": bytes_per_block_v0(groups_b),
        "older A (slots)": bytes_per_block_slots(groups_b),
        "article: MLA + unsplit SWA": 2_300_000,
    }
    return hybrid_layout.draw_blocks_per_budget(
        layouts, 10 * GIB, title="Blocks that fit in 10 GiB (DeepSeek V4-Pro, fp8)"
    )


def layer_view():
    return hybrid_layout.draw_layer_view("layers.2.swa_cache", 37_440, 37_440, 1_435_968, 3)


def swa_window():
    return allocator.draw_swa_window([5, 9, 3], block_size=4, position=10, window=6)


def topk():
    return allocator.draw_topk(
        [7, 3], block_size=16, compress_ratio=4, position=27, local_topk=[0, 2, 5, -1]
    )


def _toy_manager():
    """Chapter 12's running example: the five groups at their real sizes, 160 blocks."""
    from refimpl.course import hybrid_simulate

    manager = hybrid_simulate.toy_kv_cache_manager(num_blocks=160)
    labels = hybrid_simulate.group_labels(
        [m.kv_cache_spec for m in manager.coordinator.single_type_managers]
    )
    return manager, labels


def _toy_life():
    """Chapter 12's section 2: A runs 256 + 256 + 88 tokens and one decode step, then B hits
    256 of them."""
    from refimpl.course import hybrid_simulate as simulate

    toy, labels = _toy_manager()
    a = toy.make_request("A", simulate.prompt_tokens(600, seed=1))
    for n in (256, 256, 88):
        simulate.schedule_step(toy, a, n)
    a.append_output_token_ids([5])
    simulate.schedule_step(toy, a, 1)
    b = toy.make_request(
        "B", simulate.prompt_tokens(400, seed=2, shared_prefix=a.prompt_token_ids[:300])
    )
    hits, hit_tokens, b.shared_prefix_boundary = toy.get_computed_blocks(b)
    simulate.schedule_step(
        toy,
        b,
        b.num_tokens - hit_tokens,
        num_new_computed_tokens=hit_tokens,
        new_computed_blocks=hits,
    )
    return toy, labels, a


def tables():
    toy, labels, _ = _toy_life()
    return [
        allocator.draw_tables(toy, name, labels, title=f"request {name}: its block tables")
        for name in ("A", "B")
    ]


def pool():
    toy, labels, a = _toy_life()
    first = allocator.draw_pool(
        toy, labels, ["A", "B"], title="the toy pool with A and B running", ncols=20
    )
    toy.free(a)
    return [first, allocator.draw_pool(toy, labels, ["B"], title="A is freed", ncols=20)]


def retention():
    """Chapter 12 section 8: A, then B and C sharing its first 40 tokens, at retention None, 0
    and 32."""
    from refimpl.course import hybrid_simulate

    runs = [hybrid_simulate.retention_run(r) for r in (None, 0, 32)]
    return allocator.draw_retention(
        runs,
        title="A runs, then B and C, which share A's first 40 tokens: the window blocks each kept",
    )


def blocks_over_time():
    from refimpl.course import hybrid_simulate

    _, run = hybrid_simulate.peak_blocks_chunked_prefill(65536, decode_tokens=2)
    return allocator.draw_blocks_over_time(
        run,
        title="DeepSeek V4 Pro, 64k-token prompt in 8192-token chunks, then 2 decode steps",
    )


def allocator_frames():
    from refimpl.course import hybrid_simulate as simulate

    live, labels = _toy_manager()
    a = live.make_request("A", simulate.prompt_tokens(600, seed=1))
    b = live.make_request(
        "B", simulate.prompt_tokens(400, seed=2, shared_prefix=a.prompt_token_ids[:300])
    )

    def start_b():
        hit, hit_len, b.shared_prefix_boundary = live.get_computed_blocks(b)
        simulate.schedule_step(
            live,
            b,
            b.num_tokens - hit_len,
            num_new_computed_tokens=hit_len,
            new_computed_blocks=hit,
        )

    def decode_a():
        a.append_output_token_ids([5])
        simulate.schedule_step(live, a, 1)

    frames = hybrid_stepper.record_allocator_frames(
        live,
        labels,
        ["A", "B"],
        [
            ("A: chunk of 256", lambda: simulate.schedule_step(live, a, 256)),
            (
                "A: chunk of 256 (windows free first)",
                lambda: simulate.schedule_step(live, a, 256),
            ),
            ("A: last chunk of 88", lambda: simulate.schedule_step(live, a, 88)),
            ("A: one decode token", decode_a),
            ("B: prefix hit of 256 tokens, then its own blocks", start_b),
            ("A finishes: free(A)", lambda: live.free(a)),
        ],
    )
    return _stepper_figures(hybrid_stepper.allocator_stepper(frames, ncols=20))


# --- Part III
# -----------------------------------------------------------------------------------

HIT_SUMMARY = {
    "hit": 256,
    "caches": {
        "layers.1.swa_cache": {
            "ratio": 1,
            "block_size": 64,
            "reused": list(range(192, 256)),
            "read": list(range(241, 256)),
        },
        "layers.1.compressor.state_cache": {
            "ratio": 1,
            "block_size": 4,
            "reused": list(range(248, 256)),
            "read": [252, 253, 254, 255],
        },
        "layers.2.swa_cache": {
            "ratio": 1,
            "block_size": 64,
            "reused": list(range(192, 256)),
            "read": list(range(241, 256)),
        },
        "layers.2.attn": {"ratio": 128, "block_size": 256, "reused": [0, 1], "read": [0, 1]},
        "layers.2.compressor.state_cache": {
            "ratio": 128,
            "block_size": 4,
            "reused": list(range(248, 256)),
            "read": [],
        },
    },
}


def hit_reads():
    return v4_engine.draw_hit_reads(HIT_SUMMARY, layers=[1, 2])


def engine_state_frames():
    """Chapter 13's stepper: three requests on the tiny V4 (states as `engine_snapshot` records
    them)."""
    states = [
        (
            (
                ("A", "waiting", 260, 0, 0, ()),
                ("B", "waiting", 40, 0, 0, ()),
                ("C", "waiting", 260, 0, 0, ()),
            ),
            159,
        ),
        (
            (
                ("A", "running", 260, 64, 0, (1, 1, 1, 16, 16)),
                ("B", "waiting", 40, 0, 0, ()),
                ("C", "waiting", 260, 0, 0, ()),
            ),
            100,
        ),
        (
            (
                ("A", "running", 260, 260, 2, (2, 2, 2, 4, 4)),
                ("B", "running", 40, 40, 1, (1, 1, 1, 10, 10)),
                ("C", "running", 260, 260, 0, (2, 2, 2, 4, 4)),
            ),
            80,
        ),
        (
            (
                ("A", "finished", 260, 262, 3, ()),
                ("B", "finished", 40, 42, 3, ()),
                ("C", "finished", 260, 262, 3, ()),
            ),
            159,
        ),
    ]
    frames = [
        Frame("start" if i == 0 else f"step {i}", state) for i, state in enumerate(states)
    ]
    return _stepper_figures(
        Stepper(frames, v4_engine.draw_engine_state, v4_engine.engine_state_text)
    )


def request_plans():
    """Chapter 14's three plans: Llama 3.1 8B, Gemma 3 27B and Granite 4.0-H Tiny at 8,192
    tokens in 20 GiB."""
    from refimpl.models import EngineArgs, plan_model

    configs = Path(__file__).parent / "data" / "configs"
    return [
        request_plan.draw_request_plan(
            plan_model(
                EngineArgs(configs / name, kv_cache_memory_bytes=20 << 30, max_model_len=8192)
            ),
            title,
        )
        for name, title in (
            ("llama-3.1-8b", "Llama 3.1 8B"),
            ("gemma-3-27b-it", "Gemma 3 27B"),
            ("granite-4.0-h-tiny", "Granite 4.0-H Tiny"),
        )
    ]


def pipeline_glossary_08b():
    """Chapter 08b's closing picture: Part II's six words on L2.swa of the running example."""
    from refimpl.course.hybrid_toy import toy_v4_specs

    steps = pipeline_glossary.follow_cache(toy_v4_specs(), "layers.2.swa_cache")
    return pipeline_glossary.draw_pipeline_glossary(
        steps, "From a cache to its bytes: L2.swa of the running example"
    )


@functools.cache
def _traffic_inputs():
    """Chapter 15's inputs on the shipped Mooncake slice: two conversations that share
    blocks, and replays of the requests under 4,000 prompt tokens at 1 and 2 GiB."""
    from refimpl.models import EngineArgs, plan_model
    from refimpl.sched.traces import SLICE_PATH, read_trace
    from refimpl.simulate import simulate

    trace = read_trace(SLICE_PATH)
    few = [r for r in trace if r.hash_ids[1:2] and r.hash_ids[1] in (6760, 56177)]
    short = [r for r in trace if r.input_length < 4000]
    config = Path(__file__).parent / "data" / "configs" / "llama-3.1-8b"
    sims = {
        f"{g} GiB": simulate(
            plan_model(EngineArgs(config, kv_cache_memory_bytes=g << 30, max_model_len=4096)),
            short,
            clock="arrivals",
        )
        for g in (1, 2)
    }
    return few, sims


def traffic_shared_blocks():
    return traffic.draw_shared_blocks(_traffic_inputs()[0])


def traffic_kv_usage():
    return traffic.draw_kv_usage(_traffic_inputs()[1])


def traffic_sweep():
    runs = [(label, sim.summary()) for label, sim in _traffic_inputs()[1].items()]
    return traffic.draw_sweep("KV cache memory", runs, reference=("up to 50%", 0.5))


CASES: dict[str, tuple[Callable, Builder]] = {
    "course_map": (course_map.draw_course_map, course_map_plain),
    "course_map_route": (course_map.draw_course_map, course_map_route),
    "pool_snapshot_00": (paged.draw_pool_snapshot, pool_snapshot_00),
    "fragmentation": (paged.draw_fragmentation, fragmentation),
    "block_pool": (paged.draw_block_pool, block_pool_scattered),
    "pool_snapshot_03": (paged.draw_pool_snapshot, pool_snapshot_stepper),
    "pool_snapshot_04": (paged.draw_pool_snapshot, prefix_cache_stepper),
    "prefix_lookup": (paged.draw_prefix_lookup, prefix_lookup),
    "prefix_lookup_article": (paged.draw_prefix_lookup, prefix_lookup_article),
    "prefix_match": (paged.draw_prefix_match, prefix_match),
    "reusable_tokens": (paged.draw_reusable_tokens, reusable_tokens),
    "scheduler_state": (scheduler_stepper.draw_scheduler_state, scheduler_stepper_frames),
    "scheduler_state_05": (
        scheduler_stepper.draw_scheduler_state,
        scheduler_stepper_frames_05,
    ),
    "timeline_05": (timeline.draw_timeline, timeline_05),
    "timeline_05b": (timeline.draw_timeline, timeline_05b),
    "step_inputs": (engine.draw_step_inputs, step_inputs),
    "paged_layout": (kernels.draw_paged_layout, paged_layout),
    "softmax_state": (softmax_stepper.draw_softmax_state, softmax_frames),
    "sm_occupancy": (split_kv.draw_sm_occupancy, sm_occupancy),
    "merge_state": (split_kv.draw_merge_state, merge_frames),
    "decode_timings": (split_kv.draw_decode_timings, decode_timings),
    "prefill_mask": (kernels.draw_prefill_mask, prefill_mask),
    "reuse_by_block_size": (kernels.draw_reuse_by_block_size, reuse_by_block_size),
    "overlapping_windows": (layer_viz.draw_overlapping_windows, overlapping_windows),
    "indexer_picks": (layer_viz.draw_indexer_picks, indexer_picks),
    "fp8_ds_mla_page": (layer_viz.draw_fp8_ds_mla_page, fp8_ds_mla_page),
    "v4_layer": (hybrid_layout.draw_v4_layer, v4_layer),
    "position_strip": (hybrid_layout.draw_position_strip, position_strip),
    "pages": (hybrid_layout.draw_pages, pages),
    "padding_curve": (hybrid_layout.draw_padding_curve, padding_curve),
    "grouping": (hybrid_layout.draw_grouping, grouping),
    "groupings": (hybrid_layout.draw_groupings, groupings),
    "slab": (hybrid_layout.draw_slab, slab),
    "blocks_per_budget": (hybrid_layout.draw_blocks_per_budget, blocks_per_budget),
    "layer_view": (hybrid_layout.draw_layer_view, layer_view),
    "swa_window": (allocator.draw_swa_window, swa_window),
    "topk": (allocator.draw_topk, topk),
    "tables": (allocator.draw_tables, tables),
    "pool": (allocator.draw_pool, pool),
    "blocks_over_time": (allocator.draw_blocks_over_time, blocks_over_time),
    "retention": (allocator.draw_retention, retention),
    "allocator_state": (hybrid_stepper.draw_allocator_state, allocator_frames),
    "hit_reads": (v4_engine.draw_hit_reads, hit_reads),
    "engine_state": (v4_engine.draw_engine_state, engine_state_frames),
    "request_plans": (request_plan.draw_request_plan, request_plans),
    "pipeline_glossary": (pipeline_glossary.draw_pipeline_glossary, pipeline_glossary_08b),
    "traffic_shared_blocks": (traffic.draw_shared_blocks, traffic_shared_blocks),
    "traffic_kv_usage": (traffic.draw_kv_usage, traffic_kv_usage),
    "traffic_sweep": (traffic.draw_sweep, traffic_sweep),
}


def figures(case: str) -> list:
    """The Figure(s) of one case, as a list."""
    built = CASES[case][1]()
    return list(built) if isinstance(built, (list, tuple)) else [built]


def main(argv: list[str]) -> None:
    from tests.figure_size import shown_png

    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for case in argv[1:] or list(CASES):
        for i, fig in enumerate(figures(case)):
            (out / f"{case}_{i}.png").write_bytes(shown_png(fig))


if __name__ == "__main__":
    main(sys.argv[1:])
