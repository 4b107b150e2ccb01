"""Every table of the vLLM KV-cache article ("vllm分析(四)——kv cache初始化"), recomputed by the
package (Pro, fp8_ds_mla, block size 256, 10 GiB).

Where the code deliberately differs from the article (indexer entry bytes, bucket/group order,
offsets that follow registration order, the null block), both numbers are asserted.
"""

import torch

from refimpl.course import article_comparison
from refimpl.course.v4_inventory import page_size_rows
from refimpl.hybrid import deepseek_v4 as v4
from refimpl.hybrid.kv_cache_interface import KVCacheGroupSpec, cdiv, round_up
from refimpl.hybrid.kv_cache_planning import (
    GIB,
    approximate_gcd,
    padding_curve,
)
from refimpl.hybrid.older_planners import (
    get_kv_cache_config_b,
    get_kv_cache_groups_b,
    get_packed_kv_cache_layout,
    group_and_unify_kv_cache_specs,
    split_bucket,
    two_group_layout,
)
from refimpl.hybrid.tensors import allocate_kv_cache

ARTICLE = article_comparison.ARTICLE_FIGURES
PRO = v4.kv_cache_specs("pro")
ROWS = {r["kind"]: r for r in page_size_rows(PRO)}


def test_layer_counts_and_ratios():
    ratios = v4.PRO.compress_ratios
    assert ratios == ARTICLE["compress_ratios"]  # the article's list, entry by entry
    assert len(ratios) == ARTICLE["num_layers"]
    assert {r: ratios.count(r) for r in (4, 128)} == ARTICLE["ratio_counts"]


def test_mla_page_table():
    for article_name, kind in (("CSA", "c4"), ("HCA", "c128"), ("SWA", "swa")):
        row = ROWS[kind]
        assert (row["storage_block_size"], row["real_page"], row["page"]) == ARTICLE["pages"][
            article_name
        ]
        assert (
            row["entry_bytes"] == ARTICLE["token_bytes"]
            and row["page"] % ARTICLE["alignment"] == 0
        )


def test_indexer_row_is_corrected_but_padded_page_agrees():
    storage, article_real, article_padded = ARTICLE["pages"]["indexer"]
    row = ROWS["idx"]
    assert row["storage_block_size"] == storage == 64
    assert article_real == 64 * 1 * 128 * 1 == 8192  # the article's formula: 128 B per entry
    assert row["entry_bytes"] == 132 and row["real_page"] == 8448  # 128 fp8 + 4-byte scale
    assert row["page"] == article_padded == 8640  # both round up to 15 x 576
    fp4 = page_size_rows(v4.kv_cache_specs("pro", indexer="fp4"))
    assert [(r["entry_bytes"], r["page"]) for r in fp4 if r["kind"] == "idx"] == [(68, 4608)]


def test_compressor_state_table():
    for article_name, kind in (
        ("Indexer.state_cache", "idx_state"),
        ("C4A.state_cache", "c4_state"),
        ("C128A.state_cache", "c128_state"),
    ):
        row = ROWS[kind]
        spec = PRO[row["example"]]
        assert (
            spec.head_size,
            row["storage_block_size"],
            row["compress_ratio"],
            row["sliding_window"],
            row["real_page"],
            row["page"],
        ) == ARTICLE["state_pages"][article_name]
        assert spec.num_kv_heads == 1 and spec.dtype == "float32"


def test_buckets_tuples_and_order():
    grouped = group_and_unify_kv_cache_specs(PRO)
    sizes = [len(b.kv_cache_specs) for b in grouped]
    tuples = [b.get_num_layer_tuples() for b in grouped]
    # code order: MLA, SWA, C128 state, C4 state (first appearance: layer 0 is ratio 128)
    assert sizes == [91, 61, 31, 60] and tuples == [31, 61, 31, 30]
    article = ARTICLE["bucket_layers"]
    assert sorted(sizes) == sorted(article.values())
    assert (
        sorted(tuples) == sorted(ARTICLE["layer_tuples"]) and tuples != ARTICLE["layer_tuples"]
    )
    assert grouped[0].page_size_counts() == {1728: 31, 8640: 30, 37440: 30}


def test_approximate_gcd_and_split():
    for order in (ARTICLE["layer_tuples"], [31, 61, 31, 30]):
        assert approximate_gcd(order, lower_bound=order[0]) == ARTICLE["gcd"]
    curve = padding_curve([31, 61, 31, 30], 31)
    assert {d: curve[d] for d in ARTICLE["gcd_padding"]} == ARTICLE["gcd_padding"]
    groups = get_kv_cache_groups_b(PRO)
    assert [len(groups[1].layer_names), len(groups[2].layer_names)] == ARTICLE["swa_split"]


def test_gcd_walkthrough_per_value_and_round_up():
    article_order_tuples = ARTICLE["layer_tuples"]
    for d, per_value in ARTICLE["gcd_padding_per_value"].items():
        assert [round_up(x, d) - x for x in article_order_tuples] == per_value
        assert (
            sum(per_value)
            == padding_curve(article_order_tuples, article_order_tuples[0])[d]
            == ARTICLE["gcd_padding"][d]
        )
    # computed, never used
    assert [round_up(x, ARTICLE["gcd"]) for x in article_order_tuples] == [31, 62, 31, 31]
    swa = group_and_unify_kv_cache_specs(PRO)[1]
    assert (
        cdiv(len(swa.kv_cache_specs), ARTICLE["gcd"])
        == len(split_bucket(swa, ARTICLE["gcd"]))
        == 2
    )


def test_group_widths_same_set_different_order():
    groups = get_kv_cache_groups_b(PRO)
    widths = [g.width_bytes for g in groups]
    article_widths = [w for _, w in ARTICLE["group_widths"]]
    assert widths == [1435968, 1160640, 1123200, 1017792, 1244160]
    assert sorted(widths) == sorted(article_widths) and widths[3:] == article_widths[3:][::-1]
    assert groups[0].width_bytes == 30 * 37440 + 31 * 1728 + 30 * 8640
    assert groups[4].width_bytes == 30 * (8640 + 32832)


def test_five_group_stride_and_blocks():
    cfg = get_kv_cache_config_b(get_kv_cache_groups_b(PRO), 10 * GIB)
    assert cfg.block_stride == ARTICLE["five_group_stride"]
    assert (
        cfg.num_blocks == ARTICLE["five_group_blocks_10gib"] and cfg.num_usable_blocks == 7476
    )


def test_hypothetical_two_group_layout():
    groups = two_group_layout(PRO)
    cfg = get_kv_cache_config_b(groups, 10 * GIB)
    assert cfg.block_stride == ARTICLE["two_group_stride"] == 61 * 37440
    assert cfg.num_blocks == ARTICLE["two_group_blocks_10gib"]
    _, by_offset = get_packed_kv_cache_layout(groups)
    at = {n: o for o, names in by_offset.items() for n in names}
    assert at["layers.60.swa_cache"] == ARTICLE["two_group_last_swa_offset"]
    for label, offset in ARTICLE["two_group_swa_offsets"]:
        assert at[article_comparison.article_label_to_name(label)] == offset, label
    assert [g.width_bytes for g in groups] == [
        ARTICLE["two_group_widths"]["MLA"],
        ARTICLE["two_group_widths"]["SWA"],
    ]
    # the SWA group sets the stride
    assert cfg.block_stride == max(ARTICLE["two_group_widths"].values())


def test_article_offsets_need_the_article_layer_order():
    article_groups = two_group_layout(PRO, article_order=True)
    _, by_offset = get_packed_kv_cache_layout(article_groups)
    at = {n: o for o, names in by_offset.items() for n in names}
    for label, offset in ARTICLE["two_group_mla_offsets"]:
        assert at[article_comparison.article_label_to_name(label)] == offset, label
    assert at["layers.5.attn"] == ARTICLE["two_group_mla_end_after_layer4"]
    for label, offset in ARTICLE["layer_packing"].items():
        assert at[article_comparison.article_label_to_name(label)] == offset, label
    # In registration order (indexer first) the ratio-4 offsets move; layer 3 lands in the same
    # place.
    _, real = get_packed_kv_cache_layout(two_group_layout(PRO))
    real_at = {n: o for o, names in real.items() for n in names}
    assert (real_at["layers.2.indexer.k_cache"], real_at["layers.2.attn"]) == (3456, 12096)
    assert real_at["layers.3.attn"] == at["layers.3.attn"] == 49536
    assert (real_at["layers.4.indexer.k_cache"], real_at["layers.4.attn"]) == (51264, 59904)


def test_swa_view_shape_and_strides():
    cfg = get_kv_cache_config_b(two_group_layout(PRO), 0, num_blocks_override=2)
    views = allocate_kv_cache(cfg)
    swa = views["layers.1.swa_cache"]
    assert tuple(swa.shape[1:]) == ARTICLE["swa_view_shape"] and swa.dtype == torch.uint8
    assert swa[0].numel() == ARTICLE["swa_view_page_bytes"]
    assert swa.stride() == (ARTICLE["two_group_stride"], 584, 1)
    # the decode kernel's 4-D view keeps strides
    assert swa.unsqueeze(-2).shape == (2, 64, 1, 584)
    assert swa.unsqueeze(-2).stride(0) == ARTICLE["two_group_stride"]
    assert swa.storage_offset() == 37440


def test_blog_entries_per_block():
    assert PRO["layers.2.attn"].storage_block_size == 256 // 4 == 64
    assert PRO["layers.3.attn"].storage_block_size == 256 // 128 == 2
    assert isinstance(get_kv_cache_groups_b(PRO)[0], KVCacheGroupSpec)


def test_swa2_and_swa3_share_an_offset_in_the_five_group_layout():
    cfg = get_kv_cache_config_b(get_kv_cache_groups_b(PRO), 10 * GIB)
    (tensor,) = [t for t in cfg.kv_cache_tensors if "layers.2.swa_cache" in t.shared_by]
    assert tensor.offset == 37440 and tensor.shared_by == (
        "layers.2.swa_cache",
        "layers.3.swa_cache",
    )
