"""Part II's entry points refuse misuse with a ValueError or TypeError naming the argument,
before anything changes: the listed cases, then random misuse mixed into a random workload,
with the whole allocator state compared before and after every refusal."""

import pytest
import torch
from hybrid_helpers import full, step, swa
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl.hybrid import deepseek_v4
from refimpl.hybrid.invariants import check_pool_invariants
from refimpl.hybrid.kv_cache_manager import KVCacheBlocks, KVCacheManager
from refimpl.hybrid.kv_cache_planning import get_kv_cache_config, get_kv_cache_groups
from refimpl.hybrid.request import Request
from refimpl.kernels import reference_v4


def state(m, requests):
    """Everything a refusal must leave alone."""
    pool = m.block_pool
    return (
        [b.block_id for b in pool.free_block_queue],
        [b.ref_cnt for b in pool.blocks],
        [b.block_hash for b in pool.blocks],
        {k: list(v) for k, v in pool.cached_block_hashes_by_block.items()},
        {
            r.request_id: (m.get_block_ids(r.request_id), r.num_computed_tokens)
            for r in requests
        },
        [dict(mgr.num_cached_block) for mgr in m.coordinator.single_type_managers],
        [sorted(mgr.req_to_blocks) for mgr in m.coordinator.single_type_managers],
    )


def manager():
    return KVCacheManager([full(4), swa(4, 8), swa(2, 4)], 30, 64)


def test_two_requests_with_one_id_do_not_share_blocks():
    m = manager()
    a = m.make_request("a", range(10))
    step(m, a, 10)
    twin = m.make_request("a", range(10))
    before = state(m, [a])
    for call in (
        lambda: m.allocate_slots(twin, 10),
        lambda: m.get_computed_blocks(twin),
        lambda: m.free(twin),
    ):
        with pytest.raises(ValueError, match="request_id 'a'"):
            call()
        assert state(m, [a]) == before
    m.free(a)
    assert m.allocate_slots(twin, 10) is not None  # the id is free again


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        ({"num_new_tokens": 1.5}, ValueError, "num_new_tokens"),
        ({"num_new_tokens": True}, ValueError, "num_new_tokens"),
        (
            {"num_new_tokens": 4, "num_lookahead_tokens": -1},
            ValueError,
            "num_lookahead_tokens",
        ),
        ({"num_new_tokens": 4, "reserved_blocks": 0.5}, ValueError, "reserved_blocks"),
        ({"num_new_tokens": 4, "delay_cache_blocks": "no"}, TypeError, "delay_cache_blocks"),
        ({"num_new_tokens": 4, "has_scheduled_reqs": 1}, TypeError, "has_scheduled_reqs"),
        (
            {"num_new_tokens": 4, "new_computed_blocks": ([], [], [])},
            TypeError,
            "new_computed_blocks",
        ),
        (
            {"num_new_tokens": 4, "num_new_computed_tokens": 4},
            ValueError,
            "new_computed_blocks",
        ),
        ({"num_new_tokens": 11}, ValueError, "cannot schedule"),
    ],
)
def test_allocate_slots_refuses_bad_arguments_without_a_table_entry(kwargs, error, name):
    m = manager()
    r = m.make_request("r", range(10))
    before = state(m, [r])
    with pytest.raises(error, match=name):
        m.allocate_slots(r, **kwargs)
    assert state(m, [r]) == before and m.get_block_ids("r") == ([], [], [])


def test_foreign_blocks_and_requests_are_refused():
    m, other = manager(), manager()
    a = other.make_request("a", range(12))
    step(other, a, 12)
    other.free(a)
    b = other.make_request("b", range(13))
    hits, n, b.shared_prefix_boundary = other.get_computed_blocks(b)
    assert n == 8
    mine = m.make_request("b", range(13))
    before = state(m, [mine])
    with pytest.raises(ValueError, match="not a block of this manager's pool"):
        m.allocate_slots(mine, 5, num_new_computed_tokens=n, new_computed_blocks=hits)
    with pytest.raises(ValueError, match="groups"):
        m.allocate_slots(
            mine,
            5,
            num_new_computed_tokens=n,
            new_computed_blocks=KVCacheBlocks(hits.blocks[:1]),
        )
    with pytest.raises(ValueError, match="hashed every 1 tokens"):
        m.allocate_slots(Request("c", list(range(8)), hash_block_size=1), 8)
    with pytest.raises(TypeError, match="request"):
        m.allocate_slots("c", 8)
    assert state(m, [mine]) == before


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        ({"num_blocks": 1}, ValueError, "num_blocks"),
        ({"num_blocks": 2.0}, ValueError, "num_blocks"),
        ({"enable_caching": "no"}, TypeError, "enable_caching"),
        ({"use_eagle": 1}, TypeError, "use_eagle"),
        ({"max_num_batched_tokens": 0}, ValueError, "max_num_batched_tokens"),
        ({"watermark": "0.1"}, TypeError, "watermark"),
        ({"kv_cache_groups": {"a": full(4)}}, TypeError, "kv_cache_groups"),
        ({"kv_cache_groups": []}, ValueError, "kv_cache_groups"),
    ],
)
def test_the_manager_refuses_bad_construction(kwargs, error, name):
    args = {
        "kv_cache_groups": [full(4), swa(4)],
        "num_blocks": 10,
        "max_model_len": 64,
        **kwargs,
    }
    with pytest.raises(error, match=name):
        KVCacheManager(
            args.pop("kv_cache_groups"),
            args.pop("num_blocks"),
            args.pop("max_model_len"),
            **args,
        )


def test_the_planner_refuses_empty_or_wrong_input():
    with pytest.raises(ValueError, match="specs is empty"):
        get_kv_cache_groups({})
    with pytest.raises(TypeError, match="specs"):
        get_kv_cache_groups({"L0": "full"})
    with pytest.raises(ValueError, match="groups is empty"):
        get_kv_cache_config([], 1 << 30)
    with pytest.raises(TypeError, match="groups"):
        get_kv_cache_config([full(4)], 1 << 30)
    with pytest.raises(TypeError, match="mtp"):
        deepseek_v4.kv_cache_specs("flash", mtp="yes")


def test_swa_indices_refuse_a_negative_block_id_in_a_window():
    args = dict(
        query_start_loc=torch.tensor([0, 3], dtype=torch.int32),
        seq_lens=torch.tensor([6], dtype=torch.int32),
        token_to_req_indices=torch.zeros(3, dtype=torch.int32),
        is_valid_token=torch.ones(3, dtype=torch.bool),
        block_size=4,
        window_size=4,
    )
    ok, lens = reference_v4.compute_swa_indices_and_lens(
        block_table=torch.tensor([[5, 7]], dtype=torch.int32), **args
    )
    assert ok.tolist() == [
        [20, 21, 22, 23],
        [21, 22, 23, 28],
        [22, 23, 28, 29],
    ] and lens.tolist() == [4, 4, 4]
    with pytest.raises(ValueError, match=r"block_table\[0, 0\] = -1"):
        reference_v4.compute_swa_indices_and_lens(
            block_table=torch.tensor([[-1, 7]], dtype=torch.int32), **args
        )
    # -1 padding past what the windows read is fine
    pad = torch.tensor([[5, 7, -1]], dtype=torch.int32)
    assert (
        reference_v4.compute_swa_indices_and_lens(block_table=pad, **args)[0].tolist()
        == ok.tolist()
    )


# --- random misuse against a random workload
misuse = st.sampled_from(
    [
        "float",
        "negative",
        "too_many",
        "twin",
        "foreign_hits",
        "bad_flag",
        "no_blocks",
        "str_request",
    ]
)
op = st.one_of(
    st.tuples(st.just("add"), st.lists(st.integers(0, 2), min_size=1, max_size=24)),
    st.tuples(st.just("run"), st.integers(0, 9), st.integers(1, 8)),
    st.tuples(st.just("free"), st.integers(0, 9)),
    st.tuples(st.just("misuse"), misuse, st.integers(0, 9)),
)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(op, max_size=30), retention=st.sampled_from([None, 0, 4]))
def test_random_misuse_leaves_the_allocator_unchanged(ops, retention):
    m = KVCacheManager(
        [full(4), swa(4, 8), swa(2, 4)], 24, 64, prefix_cache_retention_interval=retention
    )
    other = KVCacheManager([full(4), swa(4, 8), swa(2, 4)], 24, 64)
    seeded = other.make_request("x", range(9))
    step(other, seeded, 9)
    foreign_hits = KVCacheBlocks(tuple(list(g) for g in other.get_blocks("x").blocks))
    live: list[Request] = []
    refused = 0
    for i, o in enumerate(ops):
        if o[0] == "add":
            r = m.make_request(f"r{i}", o[1])
            hits, n, r.shared_prefix_boundary = m.get_computed_blocks(r)
            if (
                step(
                    m, r, r.num_tokens - n, num_new_computed_tokens=n, new_computed_blocks=hits
                )
                is not None
            ):
                live.append(r)
        elif o[0] == "run" and live:
            r = live[o[1] % len(live)]
            if r.num_tokens + o[2] <= m.max_model_len:
                r.append_output_token_ids([1] * o[2])
                step(m, r, o[2])
        elif o[0] == "free" and live:
            m.free(live.pop(o[1] % len(live)))
        elif o[0] == "misuse":
            target = live[o[2] % len(live)] if live else m.make_request("fresh", range(6))
            calls = {
                "float": lambda: m.allocate_slots(target, 0.5),
                "negative": lambda: m.allocate_slots(target, 1, num_lookahead_tokens=-2),
                "too_many": lambda: m.allocate_slots(target, target.num_tokens + 5),
                "twin": lambda: (
                    m.allocate_slots(
                        m.make_request(target.request_id, target.prompt_token_ids), 1
                    )
                    if target in live
                    else m.allocate_slots(target, 1, reserved_blocks=-1)
                ),
                "foreign_hits": lambda: m.allocate_slots(
                    m.make_request(f"f{i}", range(9)),
                    1,
                    num_new_computed_tokens=8,
                    new_computed_blocks=foreign_hits,
                ),
                "bad_flag": lambda: m.allocate_slots(target, 1, full_sequence_must_fit="yes"),
                "no_blocks": lambda: m.allocate_slots(target, 1, num_new_computed_tokens=4),
                "str_request": lambda: m.free(target.request_id),
            }
            before = state(m, live)
            with pytest.raises((ValueError, TypeError)):
                calls[o[1]]()
            assert state(m, live) == before
            refused += 1
        tables = [blocks for r in live for blocks in m.get_blocks(r.request_id).blocks]
        check_pool_invariants(m.block_pool, tables + [[]])


# --- the same contract as Part I (issue 29): hits must cover the computed tokens, and a
# request is built only from a valid prompt


def test_hits_must_cover_the_computed_tokens_in_every_group():
    m = KVCacheManager(
        [full(4), swa(4, 8), swa(2, 4)], 400, 512, prefix_cache_retention_interval=None
    )
    a = m.make_request("a", range(300))
    step(m, a, 300)
    m.free(a)  # a's blocks stay in the prefix cache
    b = m.make_request("b", range(300))
    hits, n, _ = m.get_computed_blocks(b)
    assert n == 296 and all(hits.blocks)
    fresh = m.make_request("fresh", list(range(1000, 1300)))
    misuse = [
        # the example: no block at all registered as 256 computed tokens
        (fresh, 44, 256, m.empty_blocks()),
        (b, 4, n - 4, hits),  # more blocks than the tokens fill
        (b, 4, 0, hits),  # blocks for no tokens
        (b, 1, n, KVCacheBlocks(tuple(g[:-1] for g in hits.blocks))),  # one block short
    ]
    for r, num_new, num_computed, blocks in misuse:
        before = state(m, [b, fresh])
        with pytest.raises(ValueError, match="new_computed_blocks holds .* computed tokens"):
            m.allocate_slots(
                r, num_new, num_new_computed_tokens=num_computed, new_computed_blocks=blocks
            )
        assert state(m, [b, fresh]) == before
    # nothing was registered for `fresh`: a request with its prompt gets no hit
    assert m.get_computed_blocks(m.make_request("again", list(range(1000, 1300))))[1] == 0
    # the hit as get_computed_blocks gave it is taken
    assert m.allocate_slots(b, 4, num_new_computed_tokens=n, new_computed_blocks=hits)


def test_hits_are_only_for_the_first_allocation():
    m = KVCacheManager([full(4)], 30, 64)
    a = m.make_request("a", range(8))
    step(m, a, 8)
    m.free(a)
    b = m.make_request("b", range(8))
    hits, n, _ = m.get_computed_blocks(b)
    c = m.make_request("c", range(20))
    step(m, c, 8)
    before = state(m, [b, c])
    with pytest.raises(ValueError, match="already holds blocks"):
        m.allocate_slots(c, 4, num_new_computed_tokens=n, new_computed_blocks=hits)
    assert state(m, [b, c]) == before


@pytest.mark.parametrize(
    "request_id, prompt, error, match",
    [
        ("r", [1, -1, 2], ValueError, r"prompt_token_ids\[1\] must be from 0"),
        ("r", [1, 1.5], TypeError, r"prompt_token_ids\[1\] must be an integer token id"),
        ("r", [1, False], TypeError, r"prompt_token_ids\[1\] must be an integer token id"),
        ("r", [1, 2**63], ValueError, r"prompt_token_ids\[1\] must be from 0"),
        ("r", [], ValueError, "empty prompt"),
        ("r", "abc", TypeError, r"prompt_token_ids\[0\] must be an integer"),
        (7, [1, 2], TypeError, "request_id must be a str"),
    ],
)
def test_make_request_checks_the_prompt_as_part_one_does(request_id, prompt, error, match):
    m = manager()
    a = m.make_request("a", range(10))
    step(m, a, 10)
    before = state(m, [a])
    with pytest.raises(error, match=match):
        m.make_request(request_id, prompt)
    assert state(m, [a]) == before


def test_one_block_is_no_cache():
    # block 0 is the null block: an override of 1 leaves nothing, as KVCacheManager says
    groups = get_kv_cache_groups({"L0": full(4)})
    for override in (1, 0, -3, 2.0, True):
        with pytest.raises(ValueError, match="num_blocks_override must be an integer >= 2"):
            get_kv_cache_config(groups, 1 << 30, num_blocks_override=override)
    assert get_kv_cache_config(groups, 0, num_blocks_override=2).num_blocks == 2
