"""vLLM 0.32's general planner and capacity figures in refimpl: the issue's examples with the
numbers vLLM gave (recorded in tests/data/vllm_planner_oracle.json by the crosscheck), the
spec kinds, and properties of `plan_kv_cache` on random layer mixes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl.hybrid import kv_cache_planning as P
from refimpl.hybrid.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheGroupSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from refimpl.hybrid.kv_cache_planning import (
    add_kv_sharing_layers_to_kv_cache_groups,
    align_hybrid_block_size,
    get_kv_cache_groups,
)
from refimpl.hybrid.kv_cache_utils import (
    NotEnoughKVCacheMemoryError,
    get_max_in_flight_tokens,
    plan_kv_cache,
)

GIB = 1 << 30


def full(heads=8, block=16, **kw):
    return FullAttentionSpec(
        block_size=block, num_kv_heads=heads, head_size=128, dtype="bfloat16", **kw
    )


def sliding(heads=8, window=4096, block=16):
    return SlidingWindowSpec(
        block_size=block,
        num_kv_heads=heads,
        head_size=128,
        dtype="bfloat16",
        sliding_window=window,
    )


def plan(specs, **kw):
    args = dict(
        max_model_len=8192, max_num_batched_tokens=8192, kv_cache_memory_bytes=10 * GIB
    )
    return plan_kv_cache(specs, **{**args, **kw})


def test_ten_full_and_fourteen_sliding_make_two_groups_as_vllm_does():
    specs = {f"f{i}": full() for i in range(10)} | {f"s{i}": sliding() for i in range(14)}
    p = plan(specs)
    assert [len(g.layer_names) for g in p.groups] == [10, 14]
    # vLLM 0.32: 11,702 blocks, 93,524 tokens, 11702 / (512 + 513) requests at 8k
    assert (p.num_blocks, p.num_tokens) == (11_702, 93_524)
    assert p.blocks_per_request == (512, 513)
    assert p.max_concurrency == 11_702 / 1025
    assert p.num_padding_layers == 4
    assert "padding_layers" in {n.kind for n in p.notes}


def test_the_old_one_point_two_five_rule_gives_the_issue_s_wrong_answer(monkeypatch):
    monkeypatch.setattr(P, "GROUP_SIZE_RATIO", 1.25)
    specs = {f"f{i}": full() for i in range(10)} | {f"s{i}": sliding() for i in range(14)}
    p = plan(specs)
    assert [len(g.layer_names) for g in p.groups] == [10, 7, 7]
    assert p.num_blocks == 16_384


def test_fewer_sliding_heads_double_their_block_unless_the_layout_packs():
    specs = {}
    for i in range(12):
        specs[f"f{i}"] = full()
        specs[f"s{i}"] = sliding(heads=4)
    p = plan(specs)  # not DeepSeek V4: vLLM's default layout LBNHC
    assert p.kv_cache_layout == "LBNHC"
    assert p.block_sizes == (16, 32) and p.page_sizes == (12 * 65536, 12 * 65536)
    assert (p.num_blocks, p.num_tokens) == (13_653, 145_442)  # vLLM 0.32's figures
    assert "block_size_scaled" in {n.kind for n in p.notes}
    packed = plan(specs, kv_cache_layout="BLHNC")
    assert packed.block_sizes == (16, 16)
    assert packed.page_sizes == (12 * 65536, 12 * 32768)
    assert (packed.num_blocks, packed.num_tokens) == (13_653, 109_117)
    assert round(packed.max_concurrency, 2) == 13.32
    cfg = packed.kv_cache_config
    assert [t.offset for t in cfg.kv_cache_tensors] == [0, 0]
    assert {t.block_stride for t in cfg.kv_cache_tensors} == {12 * 65536}


def test_unequal_pages_that_do_not_divide_are_padded():
    specs = {"a": full(heads=8), "b": sliding(heads=3), "c": full(heads=8)}
    groups = get_kv_cache_groups(specs)  # 2 full vs 1 sliding: 2 >= 1.5 x 1, groups of 1
    assert [g.layer_names for g in groups] == [("a",), ("c",), ("b",)]
    g_sw = groups[2]
    assert g_sw.kv_cache_spec.page_size_bytes == full().page_size_bytes
    assert g_sw.kv_cache_spec.page_size_padded == 65536
    assert g_sw.block_size == 16
    mla = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=500, dtype="bfloat16")
    with pytest.raises(P.PageSizeUnifyError, match="cannot be padded"):
        P.unify_kv_cache_spec_page_size({"a": full(), "m": mla})


def test_the_window_reservation_costs_gemma_3_concurrency_at_8k():
    layers = {}
    for i in range(62):
        layers[f"l{i}"] = full(heads=16) if i % 6 == 5 else sliding(heads=16, window=1024)
    hybrid = plan(layers)
    managed_as_full = plan(layers, disable_hybrid_kv_cache_manager=True)
    # min(1024 - 1 + 2 x 8192 in flight, 8192) tokens + 1 block: 513 blocks, more than 512
    assert set(hybrid.blocks_per_request) == {512, 513}
    assert managed_as_full.blocks_per_request == (512,)
    assert hybrid.max_concurrency < managed_as_full.max_concurrency
    # vLLM 0.32 at a 10 GiB budget
    assert (hybrid.num_blocks, hybrid.num_tokens) == (8192, 18_693)
    # without async scheduling one batch is in flight: the same cap at 8k
    assert get_max_in_flight_tokens(8192, async_scheduling=False) == 8192
    assert get_max_in_flight_tokens(8192, async_scheduling=True) == 16_384


def test_mamba_hybrid_block_alignment_gives_400_token_blocks():
    state = MambaSpec(
        block_size=8192, shapes=((6144, 3), (48, 64, 128)), dtypes=("bfloat16", "float32")
    )
    assert state.page_size_bytes == 6144 * 3 * 2 + 48 * 64 * 128 * 4 == 1_609_728
    block, padded = align_hybrid_block_size(
        block_size=16,
        attn_page_size_1_token=2 * 8 * 128 * 2,
        mamba_page_size=state.page_size_bytes,
        kernel_block_alignment=16,
    )
    assert (block, padded) == (400, 400 * 4096)
    assert align_hybrid_block_size(
        block_size=16,
        attn_page_size_1_token=4096,
        mamba_page_size=400 * 4096,
        kernel_block_alignment=16,
    ) == (400, None)
    assert (
        align_hybrid_block_size(
            block_size=16,
            attn_page_size_1_token=576,
            mamba_page_size=1000,
            kernel_block_alignment=16,
            use_mla=True,
        )[0]
        == 128
    )
    padded_state = MambaSpec(
        block_size=8192, shapes=state.shapes, dtypes=state.dtypes, page_size_padded=padded
    )
    specs = {f"l{i}": full(block=400) if i % 10 == 9 else padded_state for i in range(40)}
    p = plan(specs)
    # vLLM 0.32: ten groups of four layers, 1,638 blocks, 54.6 requests at 8k
    assert [len(g.layer_names) for g in p.groups] == [4] * 10
    assert p.block_sizes == (8192,) * 9 + (400,)
    assert (p.num_blocks, p.num_tokens) == (1638, 447_283)
    assert p.max_concurrency == 1638 / 30
    assert p.blocks_per_request == (1,) * 9 + (21,)
    assert "mamba_state" in {n.kind for n in p.notes}


def test_not_enough_memory_is_refused_with_the_longest_length_that_fits():
    specs = {f"f{i}": full() for i in range(4)}
    page = 4 * full().page_size_bytes
    with pytest.raises(
        NotEnoughKVCacheMemoryError, match="longest max_model_len that fits is 1600"
    ):
        plan(specs, kv_cache_memory_bytes=101 * page)  # 100 usable blocks of 16 tokens
    assert plan(specs, kv_cache_memory_bytes=513 * page).num_blocks == 513
    with pytest.raises(ValueError, match="either kv_cache_memory_bytes or gpu_memory_bytes"):
        plan_kv_cache(specs, max_model_len=8, max_num_batched_tokens=8)


def test_gpu_memory_gives_an_estimate_and_says_so():
    specs = {f"f{i}": full() for i in range(4)}
    p = plan_kv_cache(
        specs,
        max_model_len=8192,
        max_num_batched_tokens=8192,
        gpu_memory_bytes=80 * GIB,
        gpu_memory_utilization=0.9,
        weights_bytes=16 * GIB,
    )
    assert p.memory_is_estimate and p.available_memory == int(80 * GIB * 0.9) - 16 * GIB
    assert "memory_estimate" in {n.kind for n in p.notes}
    assert not plan(specs).memory_is_estimate


def test_kv_sharing_layers_join_their_target_group_and_cost_nothing():
    specs = {"l0": full(), "l1": sliding(), "l2": full(), "l3": sliding()}
    alone = plan(specs)
    shared = plan(specs, shared_kv_cache_layers={"l4": "l2", "l5": "l1"})
    assert shared.num_blocks == alone.num_blocks and shared.num_tokens == alone.num_tokens
    assert shared.layer_names == (("l0", "l2", "l4"), ("l1", "l3", "l5"))
    groups = get_kv_cache_groups(specs)
    with pytest.raises(ValueError, match="in no group"):
        add_kv_sharing_layers_to_kv_cache_groups({"l9": "nope"}, groups)
    with pytest.raises(ValueError, match="has a spec"):
        add_kv_sharing_layers_to_kv_cache_groups({"l0": "l2"}, groups)


def test_spec_kinds_pages_and_reservations():
    assert full(head_size_v=64).page_size_bytes == 16 * 8 * (128 + 64) * 2
    mla = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype="bfloat16")
    assert mla.head_size_v == 0 and mla.page_size_bytes == 16 * 576 * 2
    chunk = ChunkedLocalAttentionSpec(
        block_size=16,
        num_kv_heads=8,
        head_size=128,
        dtype="bfloat16",
        attention_chunk_size=8192,
    )
    assert chunk.max_admission_blocks_per_request(2048, 131072) == (8192 + 2048) // 16
    sw = sliding(window=4096)
    assert sw.max_admission_blocks_per_request(2048, 131072) == -(-(4095 + 2048) // 16) + 1
    assert sw.max_admission_blocks_per_request(2048, 1000) == -(-1000 // 16) + 1
    align = MambaSpec(
        block_size=16, shapes=((4, 4),), dtypes=("float32",), mamba_cache_mode="align"
    )
    kw = dict(max_model_len=1, max_in_flight_tokens=1)
    assert align.max_memory_usage_bytes(**kw) == 2 * 64
    assert (
        MambaSpec(block_size=16, shapes=((4, 4),), dtypes=("float32",)).max_memory_usage_bytes(
            **kw
        )
        == 64
    )
    with pytest.raises(ValueError, match="mamba_type"):
        MambaSpec(block_size=16, shapes=((4,),), dtypes=("float32",), mamba_type="rwkv")
    with pytest.raises(ValueError, match="one dtype per state shape"):
        MambaSpec(block_size=16, shapes=((4,), (2,)), dtypes=("float32",))


def test_merge_and_uniform_type_follow_vllm():
    windowed = full(sliding_window=4096)
    assert FullAttentionSpec.merge([full(), windowed]).sliding_window == 4096
    with pytest.raises(ValueError, match="same window size"):
        FullAttentionSpec.merge([full(sliding_window=1024), windowed])
    (group,) = get_kv_cache_groups({"a": full(), "b": windowed})
    assert isinstance(group.kv_cache_spec, FullAttentionSpec)
    assert group.kv_cache_spec.sliding_window == 4096
    swmla = SlidingWindowMLASpec(
        block_size=16, num_kv_heads=1, head_size=64, dtype="bfloat16", sliding_window=128
    )
    plain = sliding(window=128)
    # the first layer decides: plain windows take MLA windows, not the other way round
    assert UniformTypeKVCacheSpecs.is_uniform_type({"a": plain, "b": swmla})
    assert not UniformTypeKVCacheSpecs.is_uniform_type({"a": swmla, "b": plain})
    with pytest.raises(ValueError, match="same window size"):
        get_kv_cache_groups(
            {"a": full(), "b": sliding(window=64), "c": sliding(window=128)},
            disable_hybrid_kv_cache_manager=True,
        )


layer_kinds = st.sampled_from(["full", "sliding", "sliding", "chunked"])


@settings(max_examples=60, deadline=None)
@given(
    kinds=st.lists(layer_kinds, min_size=1, max_size=30),
    heads=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3),
    layout=st.sampled_from(["LBNHC", "LBHNC", "BLHNC", "BLNHC"]),
    max_model_len=st.integers(16, 40_000),
    scale=st.floats(1.5, 400),
)
def test_plan_invariants(kinds, heads, layout, max_model_len, scale):
    specs = {}
    for i, kind in enumerate(kinds):
        h = heads[i % len(heads)]
        if kind == "full":
            specs[f"l{i}"] = full(heads=h)
        elif kind == "sliding":
            specs[f"l{i}"] = sliding(heads=h, window=1000)
        else:
            specs[f"l{i}"] = ChunkedLocalAttentionSpec(
                block_size=16,
                num_kv_heads=h,
                head_size=128,
                dtype="bfloat16",
                attention_chunk_size=2048,
            )
    memory = int(scale * sum(s.page_size_bytes for s in specs.values()) * max_model_len / 16)
    try:
        p = plan(
            specs,
            kv_cache_layout=layout,
            max_model_len=max_model_len,
            kv_cache_memory_bytes=memory,
        )
    except (NotEnoughKVCacheMemoryError, P.UnsplittableBucketError):
        return  # vLLM refuses both (the second with a StopIteration from its packer)
    names = [n for g in p.groups for n in g.layer_names]
    assert sorted(names) == sorted(specs)  # every layer in exactly one group
    assert p.num_blocks * p.bytes_per_block <= memory < (p.num_blocks + 1) * p.bytes_per_block
    assert p.num_tokens == int(p.max_concurrency * max_model_len)
    assert p.max_concurrency == p.num_blocks / sum(p.blocks_per_request)
    # the check held back the null block and still fitted one request
    assert sum(p.blocks_per_request) <= p.num_blocks - 1
    if layout.startswith("L"):  # not block-outermost: one page size everywhere
        pages = {g.layer_spec(n).page_size_bytes for g in p.groups for n in g.layer_names}
        assert len(pages) == 1
    for g, blocks in zip(p.groups, p.blocks_per_request):
        assert blocks <= -(-max_model_len // g.block_size) + 1


def test_groups_of_one_kind_need_no_layout():
    assert len(get_kv_cache_groups({"a": full(), "b": full()})) == 1
    assert isinstance(
        get_kv_cache_groups({"a": full(), "b": full(heads=2)})[0], KVCacheGroupSpec
    )


def test_the_allocator_gives_mamba_groups_their_manager():
    from refimpl.hybrid.block_pool import BlockPool
    from refimpl.hybrid.single_type_kv_cache_manager import MambaManager, make_manager

    state = MambaSpec(block_size=16, shapes=((4, 4),), dtypes=("float32",))
    manager = make_manager(KVCacheGroupSpec(["m"], state), BlockPool(4), 0)
    assert isinstance(manager, MambaManager) and manager.mamba_cache_mode == "none"
    aligned = MambaSpec(
        block_size=16, shapes=((4, 4),), dtypes=("float32",), mamba_cache_mode="align"
    )
    with pytest.raises(ValueError, match="sub-block hits"):
        make_manager(aligned, BlockPool(4), 0, alignment_tokens=8, hash_block_size=8)
