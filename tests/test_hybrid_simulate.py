"""DeepSeek V4 Pro requests through KVCacheManager on the planner's real layout (10 GiB unless
stated): blocks per group per step, window nulling, peaks, admission and prefix hits."""

import pytest

from refimpl.course import hybrid_simulate as S
from refimpl.hybrid.invariants import check_pool_invariants


def test_pro_manager_has_five_groups_in_one_pool():
    m = S.pro_kv_cache_manager()
    assert m.num_gpu_blocks == 7477 and m.block_pool.get_num_free_blocks() == 7476
    specs = [mgr.kv_cache_spec for mgr in m.coordinator.single_type_managers]
    # planner C
    assert S.group_labels(specs) == ["SWA-a", "SWA-b", "MLA", "C128 state", "C4 state"]
    assert [mgr.block_size for mgr in m.coordinator.single_type_managers] == [
        64,
        64,
        256,
        8,
        4,
    ]
    assert m.scheduler_block_size == 256 and m.hash_block_size == 4
    # full attention is looked up first; the two SWA groups have equal specs, so they go
    # together
    assert [g.group_ids for g in m.coordinator.attention_groups] == [[2], [0, 1], [3], [4]]


def test_one_8192_token_chunk_needs_3360_blocks():
    peak, run = S.peak_blocks_chunked_prefill(8192)
    assert peak.live_blocks == (128, 128, 32, 1024, 2048)
    assert peak.total_live == 3360 == sum(S.transient_blocks_one_chunk(8192).values())
    assert peak.free_blocks == 7476 - 3360


def test_chunked_prefill_timeline_and_window_nulling():
    peak, run = S.peak_blocks_chunked_prefill(4 * 8192)
    rows = [(r.num_computed_tokens, r.live_blocks, r.null_blocks) for r in run.records]
    assert rows == [
        (8192, (128, 128, 32, 1024, 2048), (0, 0, 0, 0, 0)),
        # before chunk 2 the windows drop all but their last 127 (C4 state: 7) tokens
        (16384, (130, 130, 64, 1040, 2050), (126, 126, 0, 1008, 2046)),
        (24576, (130, 130, 96, 1040, 2050), (254, 254, 0, 2032, 4094)),
        (32768, (130, 130, 128, 1040, 2050), (382, 382, 0, 3056, 6142)),
    ]
    assert peak.step == 3 and peak.total_live == 3478
    # the request was freed at the end: every block is back
    assert run.request.num_computed_tokens == 32768


def test_long_prompt_then_decode_drops_to_the_windows():
    peak, run = S.peak_blocks_chunked_prefill(65536, decode_tokens=2)
    assert [r.phase for r in run.records] == ["prefill"] * 8 + ["decode"] * 2
    assert peak.step == 7 and peak.total_live == 3606
    # the first decode token opens MLA block 257; each window keeps what its last 127 (7)
    # tokens need
    assert (
        run.records[8].live_blocks == (3, 3, 257, 17, 3) and run.records[8].total_live == 283
    )
    assert run.records[8].null_blocks == (1022, 1022, 0, 8176, 16382)


def test_decode_frees_the_last_chunk_windows():
    m = S.pro_kv_cache_manager()
    r = m.make_request("r", S.prompt_tokens(5000))
    run = S.run_request(m, r, chunk_size=8192, decode_tokens=3, free_at_end=False)
    assert [rec.phase for rec in run.records] == ["prefill", "decode", "decode", "decode"]
    assert run.records[0].live_blocks == (79, 79, 20, 625, 1250)
    # after the first decode step only the windows remain: 127 tokens (3 SWA blocks of 64 ...)
    assert run.records[1].live_blocks == (3, 3, 20, 17, 3)
    check_pool_invariants(m.block_pool, m.get_blocks("r").blocks)
    m.free(r)
    assert m.block_pool.get_num_free_blocks() == 7476


def test_requests_that_fit_in_a_budget():
    n, m = S.requests_that_fit(16384, chunk_size=2048, available_memory=2 * S.GIB)
    assert m.num_gpu_blocks == 1495
    assert n == 7
    per_request = [m.get_blocks(f"r{i}").num_blocks() for i in range(n)]
    assert per_request == [91] * 7  # 65 MLA + 3 + 3 + 17 + 3 window blocks
    assert m.block_pool.get_num_free_blocks() == 1494 - 7 * 91
    assert m.block_pool.get_num_free_blocks() >= sum(
        S.transient_blocks_one_chunk(2048).values()
    )
    check_pool_invariants(
        m.block_pool, [t for i in range(n) for t in m.get_blocks(f"r{i}").blocks]
    )


def test_prefix_hits_are_multiples_of_256():
    hits = S.prefix_hit_lengths(
        [100, 256, 1000, 5000, 11999], prompt_len=12_000, prefix_cache_retention_interval=None
    )
    assert hits == {100: 0, 256: 256, 1000: 768, 5000: 4864, 11999: 11776}
    # vLLM's default retention keeps A's windows only at A's replay boundary (11,999 -> 11,776)
    hits = S.prefix_hit_lengths([1000, 5000, 11999], prompt_len=12_000)
    assert hits == {1000: 0, 5000: 0, 11999: 11776}
    # a positive interval keeps one tail per 4096 tokens too
    hits = S.prefix_hit_lengths(
        [1000, 5000, 9000], prompt_len=12_000, prefix_cache_retention_interval=4096
    )
    assert hits == {1000: 0, 5000: 4096, 9000: 8192}


def test_mini_v4_life_pictures_and_text_twins():
    from matplotlib.figure import Figure

    from refimpl.hybrid.kv_cache_manager import KVCacheManager
    from refimpl.viz import allocator as V

    m = KVCacheManager(S.mini_v4_groups(), 120, 256, prefix_cache_retention_interval=None)
    labels = S.group_labels(S.mini_v4_groups())
    assert (
        labels == S.MINI_V4_LABELS and m.scheduler_block_size == 16 and m.hash_block_size == 1
    )
    r = m.make_request("a", S.prompt_tokens(40))
    run = S.run_request(m, r, chunk_size=16, decode_tokens=2, free_at_end=False)
    assert [rec.live_blocks for rec in run.records] == [
        (4, 4, 1, 8, 16),
        (6, 6, 2, 12, 17),
        (4, 4, 3, 8, 9),
        (3, 3, 3, 5, 2),
        (3, 3, 3, 4, 2),
    ]
    text = V.tables_text(m, "a", labels)
    assert text.splitlines()[0] == "SWA-a      | . . . . . . . . 42 41 20"
    assert text.splitlines()[2] == "MLA        | 9 24 38"
    assert V.pool_text(m, labels, ["a"]).startswith(
        "120 blocks: SWA-a=3, SWA-b=3, MLA=3, C128 state=4, C4 state=2,"
    )
    assert all(len(line) <= 95 for line in V.pool_text(m, labels, ["a"]).splitlines())
    assert V.wrap_cells("G | ", [str(i) for i in range(40)], width=20) == [
        "G | 0 1 2 3 4 5 6 7",
        "    8 9 10 11 12 13",
        "    14 15 16 17 18",
        "    19 20 21 22 23",
        "    24 25 26 27 28",
        "    29 30 31 32 33",
        "    34 35 36 37 38",
        "    39",
    ]
    assert V.blocks_over_time_text(run).splitlines()[1].split() == [
        "0",
        "prefill",
        "16",
        "4",
        "4",
        "1",
        "8",
        "16",
        "33",
        "86",
    ]
    for fig in (
        V.draw_tables(m, "a", labels),
        V.draw_pool(m, labels, ["a"]),
        V.draw_blocks_over_time(run),
    ):
        assert isinstance(fig, Figure) and fig.axes


def test_second_request_runs_from_its_prefix_hit():
    m = S.pro_kv_cache_manager(prefix_cache_retention_interval=None)
    a = m.make_request("A", S.prompt_tokens(3000, seed=1))
    S.run_request(m, a, chunk_size=8192)
    b = m.make_request(
        "B", S.prompt_tokens(3000, seed=2, shared_prefix=a.prompt_token_ids[:1000])
    )
    run = S.run_request(m, b, chunk_size=2048, free_at_end=False)
    assert run.hit_tokens == 768
    # 768 + 2048, then the rest
    assert [r.num_computed_tokens for r in run.records] == [2816, 3000]
    mla = m.get_block_ids("B")[2]
    # A's first three MLA blocks, reused: A's one chunk took 47 + 47 SWA blocks (ids 1-94)
    # first
    assert mla[:3] == [95, 96, 97] and len(mla) == 12
    # the hit put null blocks in front of what each window needs before token 768
    assert run.records[0].null_blocks == (10, 10, 0, 80, 190)
    check_pool_invariants(m.block_pool, m.get_blocks("B").blocks)


def test_schedule_step_advances_the_request_or_changes_nothing():
    from refimpl.hybrid.kv_cache_manager import KVCacheManager

    m = KVCacheManager(
        [S.toy_full_spec(4), S.toy_window_spec(4, 8)], num_blocks=5, max_model_len=64
    )
    a = m.make_request("A", S.prompt_tokens(20, seed=1))
    new = S.schedule_step(m, a, 8)
    assert new.get_block_ids() == ([1, 2], [3, 4]) and a.num_computed_tokens == 8
    with pytest.raises(ValueError, match="do not fit"):
        S.schedule_step(m, a, 8)  # two more blocks per group, none free
    assert a.num_computed_tokens == 8 and m.get_block_ids("A") == ([1, 2], [3, 4])
    check_pool_invariants(m.block_pool, m.get_blocks("A").blocks)


def test_retention_run_picture_and_text_twin():
    from matplotlib.figure import Figure

    from refimpl.viz.allocator import draw_retention, retention_text
    from refimpl.viz.palette import MAX_WIDTH

    runs = [S.retention_run(r) for r in (None, 0, 32)]
    assert [(r.hits, r.junctions["B"]) for r in runs] == [
        ({"A": 0, "B": 32, "C": 32}, 0),
        ({"A": 0, "B": 0, "C": 32}, 32),  # 0: B misses, pins the junction, and C hits there
        ({"A": 0, "B": 32, "C": 32}, 0),
    ]
    assert [r.blocks for r in runs] == [
        {"A": "--kk--kk--kk--kk", "B": "......hh--kk--kk"},
        {"A": "----------kk----", "B": "------kk--kk----"},  # A: its replay boundary 48 only
        {"A": "------kk--kk--kk", "B": "......hh--kk--kk"},
    ]
    text = retention_text(runs)
    assert text.splitlines()[5:7] == [
        "  A  ----------kk----  hit  0",
        "  B  ------kk--kk----  hit  0, junction 32",
    ]
    fig = draw_retention(runs)
    assert (
        isinstance(fig, Figure)
        and len(fig.axes) == 3
        and fig.get_size_inches()[0] <= MAX_WIDTH
    )


def test_cached_window_blocks_per_retention_setting():
    dense, sparse, periodic = (S.cached_blocks_per_group(r) for r in (None, 0, 4096))
    assert dense == {"MLA": 46, "SWA-a": 92, "SWA-b": 92, "C128 state": 736, "C4 state": 92}
    # 0: the replay boundary only (11,999 -> 11,776): 2 SWA blocks each, 16 C128 and 2 C4
    # blocks
    assert sparse == {"MLA": 46, "SWA-a": 2, "SWA-b": 2, "C128 state": 16, "C4 state": 2}
    # + 4096, 8192
    assert periodic == {"MLA": 46, "SWA-a": 6, "SWA-b": 6, "C128 state": 48, "C4 state": 6}


def test_toy_kv_cache_manager_runs_the_running_example_at_its_real_sizes():
    """Chapter 12's main line: the running example's five groups, unshrunk, and its request
    life (A: 600 tokens in chunks of 256, one decode token; B shares 300 and hits 256)."""
    from refimpl.course.hybrid_toy import TOY_GROUP_LABELS

    m = S.toy_kv_cache_manager()
    managers = m.coordinator.single_type_managers
    assert S.group_labels([x.kv_cache_spec for x in managers]) == list(TOY_GROUP_LABELS)
    assert [x.block_size for x in managers] == [64, 64, 256, 8, 4]
    assert [getattr(x, "sliding_window", None) for x in managers] == [128, 128, None, 128, 8]
    assert m.scheduler_block_size == 256 and m.block_pool.get_num_free_blocks() == 159
    a = m.make_request("A", S.prompt_tokens(600, seed=1))
    run = S.run_request(m, a, chunk_size=256, decode_tokens=1, free_at_end=False)
    assert [rec.live_blocks for rec in run.records] == [
        (4, 4, 1, 32, 64),
        (6, 6, 2, 48, 66),
        (4, 4, 3, 27, 24),
        (3, 3, 3, 17, 3),
    ]
    b = m.make_request(
        "B", S.prompt_tokens(400, seed=2, shared_prefix=a.prompt_token_ids[:300])
    )
    assert m.get_computed_blocks(b)[1] == 256
