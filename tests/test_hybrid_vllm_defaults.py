"""Part II at vLLM 0.32's installed defaults: prefix-cache retention (None, 0, a positive
interval) with the pinned shared-prefix junction, the unitary coordinator for one group, the
partial tail block, and the DeepSeek V4 indexer's kernel block. Every expected block id here is
the answer the installed vLLM gave to the same calls (tools/crosscheck plays them through
both)."""

import pytest
from hybrid_helpers import free_ids, full, step, swa

from refimpl.course.v4_inventory import short_name
from refimpl.hybrid import deepseek_v4
from refimpl.hybrid.invariants import check_pool_invariants
from refimpl.hybrid.kv_cache_coordinator import (
    HybridKVCacheCoordinator,
    KVCacheCoordinatorNoPrefixCache,
    UnitaryKVCacheCoordinator,
    replay_boundaries,
)
from refimpl.hybrid.kv_cache_interface import KVCacheGroupSpec
from refimpl.hybrid.kv_cache_manager import KVCacheManager
from refimpl.hybrid.kv_cache_planning import get_kv_cache_config, get_kv_cache_groups
from refimpl.hybrid.kv_cache_utils import make_block_hash_with_group_id
from refimpl.hybrid.single_type_kv_cache_manager import SlidingWindowManager


def hashed(m):
    return [b.block_id for b in m.block_pool.blocks if b.block_hash is not None]


def run_and_finish(m, rid, tokens):
    """Look up, compute the whole prompt in one step, return the request (still holding
    blocks)."""
    r = m.make_request(rid, tokens)
    hits, n = m.get_computed_blocks(r)
    assert (
        step(m, r, r.num_tokens - n, num_new_computed_tokens=n, new_computed_blocks=hits)
        is not None
    )
    return r, hits.get_block_ids(), n


A = list(range(20))
B = list(range(12)) + [90] * 8  # shares A's first 12 tokens
C = list(range(12)) + [80] * 8  # shares the same 12 tokens with both


# --- retention
def test_dense_retention_keeps_a_checkpoint_at_every_boundary():
    m = KVCacheManager([full(4), swa(4, 8)], 30, 96, prefix_cache_retention_interval=None)
    a, _, _ = run_and_finish(m, "a", A)
    assert m.get_block_ids("a") == ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) and hashed(m) == list(
        range(1, 11)
    )
    m.free(a)
    b, hit_ids, n = run_and_finish(m, "b", B)
    assert (n, hit_ids, b.shared_prefix_boundary) == (12, ([1, 2, 3], [0, 7, 8]), 0)


def test_vllm_default_keeps_the_replay_boundary_then_pins_the_junction():
    m = KVCacheManager([full(4), swa(4, 8)], 30, 96)  # retention 0, as vLLM installs
    a, _, _ = run_and_finish(m, "a", A)
    # A's replay boundary is token 19 -> 16: the window keeps only the two blocks before 16
    assert m.get_block_ids("a") == ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) and hashed(m) == [
        1,
        2,
        3,
        4,
        5,
        8,
        9,
    ]
    m.free(a)
    # B shares 12 tokens: full attention could reuse them, the window has nothing at 12 -> no
    # hit, but the lookup reports the junction and B keeps its window blocks there
    b, hit_ids, n = run_and_finish(m, "b", B)
    assert (n, b.shared_prefix_boundary) == (0, 12)
    assert m.get_block_ids("b") == ([10, 7, 6, 11, 12], [13, 14, 15, 16, 17])
    assert hashed(m) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 15, 16]
    m.free(b)
    # C, sharing the same 12 tokens, now hits them: B's block 14 and A's block 8 hold the
    # window
    c, hit_ids, n = run_and_finish(m, "c", C)
    assert (n, hit_ids, c.shared_prefix_boundary) == (12, ([1, 2, 3], [0, 14, 8]), 0)
    check_pool_invariants(m.block_pool, m.get_blocks("c").blocks)


def test_a_positive_interval_adds_periodic_checkpoints():
    a_tokens, b_tokens = list(range(24)), list(range(16)) + [90] * 8
    sparse = KVCacheManager([full(4), swa(4, 5)], 30, 96)
    periodic = KVCacheManager([full(4), swa(4, 5)], 30, 96, prefix_cache_retention_interval=8)
    for m, window_hashed in ((sparse, [11]), (periodic, [8, 10, 11, 12])):
        a, _, _ = run_and_finish(m, "a", a_tokens)
        assert m.get_block_ids("a")[1] == [7, 8, 9, 10, 11, 12]
        # 0: block before 20; 8: every 8 tokens too
        assert [i for i in hashed(m) if i > 6] == window_hashed
        m.free(a)
    _, _, n = run_and_finish(sparse, "b", b_tokens)
    assert n == 0
    _, hit_ids, n = run_and_finish(periodic, "b", b_tokens)
    assert (n, hit_ids) == (16, ([1, 2, 3, 4], [0, 0, 0, 10]))


def test_the_mask_and_the_replay_boundaries():
    spec = swa(4, 8)  # a hit needs the 2 blocks before its end
    dense = SlidingWindowManager.reachable_block_mask(0, 8, 16, spec, False, None)
    assert dense == [False, False, True, True] * 2
    assert (
        SlidingWindowManager.reachable_block_mask(0, 8, 16, spec, False, 0, [23])
        == [False] * 2 + [True] * 2 + [False] * 4
    )
    assert (
        SlidingWindowManager.reachable_block_mask(0, 8, 16, spec, False, 32, [5])
        == [False] * 6 + [True] * 2
    )
    # eagle: the run is one block longer and ends on the block the lookup drops
    assert (
        SlidingWindowManager.reachable_block_mask(0, 8, 16, spec, True, 0, [16])
        == [False] * 2 + [True] * 3 + [False] * 3
    )
    assert SlidingWindowManager.reachable_block_mask(4, 8, 16, spec, True, 0, [16]) == [
        True,
        False,
        False,
        False,
    ]
    assert replay_boundaries(20, 4, use_eagle=False) == (19,)
    assert replay_boundaries(20, 4, use_eagle=True) == (12, 16)
    # the two differ only on a block-aligned prompt
    assert replay_boundaries(19, 4, use_eagle=True) == (12,)


@pytest.mark.parametrize(
    "groups, retention, error",
    [
        ([full(4), swa(4, 8)], 6, ValueError),  # not a multiple of the scheduler block size 4
        ([full(4), swa(4, 8)], -4, ValueError),
        ([full(4), swa(4, 8)], 4.0, TypeError),
        ([full(4), swa(4, 8)], "8", TypeError),
        ([full(4)], 8, ValueError),  # no sliding window: a positive interval would do nothing
    ],
)
def test_bad_retention_is_refused(groups, retention, error):
    with pytest.raises(error, match="prefix_cache_retention_interval"):
        KVCacheManager(groups, 30, 96, prefix_cache_retention_interval=retention)


def test_zero_retention_is_fine_without_a_window():
    assert (
        KVCacheManager(
            [full(4)], 30, 96, prefix_cache_retention_interval=0
        ).coordinator.retention_interval
        == 0
    )


# --- coordinators
def test_one_group_uses_the_unitary_coordinator_and_eagle_loses_a_block():
    m = KVCacheManager([full(4)], 24, 96, use_eagle=True)
    assert type(m.coordinator) is UnitaryKVCacheCoordinator
    a, _, _ = run_and_finish(m, "a", range(12))
    m.free(a)
    b, hit_ids, n = run_and_finish(m, "b", range(12))
    # one lookup up to token 11 (2 blocks), minus the eagle block: 4 tokens, block 1
    assert (n, hit_ids, m.get_block_ids("b")) == (4, ([1],), ([1, 4, 5],))
    # the hybrid loop would look one block further and keep 8 tokens
    hybrid = HybridKVCacheCoordinator([full(4)], 24, use_eagle=True)
    hybrid.allocate_new_blocks("a", 12)
    hybrid.cache_blocks(m.make_request("a", range(12)), 12)
    assert hybrid.find_longest_cache_hit(b.block_hashes, 11)[1] == 8


def test_coordinator_choice_follows_vllm():
    assert (
        type(KVCacheManager([full(4), swa(4)], 9, 96).coordinator) is HybridKVCacheCoordinator
    )
    assert (
        type(KVCacheManager([full(4)], 9, 96, enable_caching=False).coordinator)
        is KVCacheCoordinatorNoPrefixCache
    )
    # one group hashed finer than its block: refimpl's fine-grained hits, handled by the hybrid
    # loop
    assert (
        type(KVCacheManager([full(8)], 9, 96, hash_block_size=4).coordinator)
        is HybridKVCacheCoordinator
    )


# --- the partial tail block
def test_an_eagle_full_group_registers_the_prompt_tail_inside_a_block():
    groups = [
        KVCacheGroupSpec(("f",), full(8), is_eagle_group=True),
        KVCacheGroupSpec(("s",), swa(4, 21)),
    ]
    m = KVCacheManager(groups, 40, 96, use_eagle=True)
    a, _, _ = run_and_finish(m, "a", range(12))
    assert m.get_block_ids("a") == ([1, 2], [3, 4, 5])
    # block 2 holds tokens 8-11 and answers the 12-token prefix
    assert hashed(m) == [1, 2] and m.block_pool.blocks[2].block_hash_num_tokens == 12
    assert m.block_pool.blocks[2].block_hash == make_block_hash_with_group_id(
        a.block_hashes[2], 0
    )
    m.free(a)
    assert free_ids(m.block_pool) == [5, 4, 3, *range(6, 40), 2, 1]  # hashed: to the back


def test_the_tail_of_a_non_eagle_prompt_is_registered_once_its_block_is_reached():
    m = KVCacheManager([full(8), swa(4, 5)], 30, 96)
    a, _, _ = run_and_finish(m, "a", range(13))
    assert m.get_block_ids("a") == ([1, 2], [3, 4, 5, 6]) and hashed(m) == [1, 4]
    a.append_output_token_ids([100, 101, 102])
    step(m, a, 3)  # 16 computed: block 2 is full, and also answers the 12-token prompt tail
    assert hashed(m) == [1, 2, 4] and m.block_pool.blocks[2].block_hash_num_tokens == 16
    assert m.block_pool.cached_block_hashes_by_block == {
        2: [make_block_hash_with_group_id(a.block_hashes[2], 0)]
    }


# --- DeepSeek V4's indexer kernel block
def test_the_indexer_is_split_into_256_token_kernel_blocks_like_the_main_attention():
    specs = deepseek_v4.kv_cache_specs("flash", indexer="fp4", block_size=512)
    kernel = {short_name(n, s).split(".")[1]: s.kernel_block_size for n, s in specs.items()}
    assert kernel == {
        "swa": None,
        "idx": 256,
        "idx_state": None,
        "c4": 256,
        "c4_state": None,
        "c128": 256,
        "c128_state": None,
    }
    config = get_kv_cache_config(get_kv_cache_groups(specs), 10 << 30)
    # vLLM 0.32's answer (5,623 without the indexer's rounding)
    assert config.num_blocks == 3983
    one = deepseek_v4.kv_cache_specs(
        deepseek_v4.DeepseekV4Config("one", (4,)), indexer="fp4", block_size=512
    )
    # not 112,320
    assert get_kv_cache_config(get_kv_cache_groups(one), 10 << 30).block_stride == 299_520
