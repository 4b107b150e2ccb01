"""What the vLLM KV-cache article prints, and the layouts it assumes, kept apart from the real
plan.

The article "vllm分析(四)——kv cache初始化" (vLLM analysis, part 4: KV-cache
initialisation) walks
through DeepSeek V4 Pro's cache plan with concrete numbers. `ARTICLE_FIGURES` holds those
numbers as printed, so tests and notebooks can put the code's answer next to each one. Two
things the article assumes are not what vLLM builds, and live here so the real planner never
sees them:

- one MLA group and one unsplit sliding-window group (the compressor states left out), the
  plan the article uses to explain why the SWA bucket is split;
- each ratio-4 layer's main attention listed before its indexer, the order the article's
  offset walk assumes (vLLM registers the indexer first).

Both are layouts the plan command can print, so they sit with the older planners:
`older_planners.two_group_layout` and `older_planners.article_layer_order`.

Where a figure and the code differ (the indexer page, the bucket order, the offsets), notebooks
08 to 10 show the difference next to its cause.
"""

from __future__ import annotations

from refimpl.hybrid.deepseek_v4 import layer_name

# Pro, fp8_ds_mla, block size 256, 10 GiB budget: the numbers as the article prints them.
ARTICLE_FIGURES = {
    "compress_ratios": (
        128,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
        128,
        4,
    ),
    "num_layers": 61,
    "ratio_counts": {4: 30, 128: 31},
    "token_bytes": 584,
    "alignment": 576,
    # name: (storage_block_size, real page, padded page); the indexer row uses 128 B per entry
    "pages": {
        "CSA": (64, 37376, 37440),
        "HCA": (2, 1168, 1728),
        "indexer": (64, 8192, 8640),
        "SWA": (64, 37376, 37440),
    },
    # name: (head_size, storage_block_size, compressor ratio, sliding_window, real, padded)
    "state_pages": {
        "Indexer.state_cache": (512, 4, 4, 8, 8192, 8640),
        "C4A.state_cache": (2048, 4, 4, 8, 32768, 32832),
        "C128A.state_cache": (1024, 8, 128, 128, 32768, 32832),
    },
    "bucket_layers": {"MLA": 91, "SWA": 61, "C4 state": 60, "C128 state": 31},
    "layer_tuples": [31, 61, 30, 31],  # order MLA, SWA, C4 state, C128 state
    "gcd": 31,
    "gcd_padding": {31: 2, 32: 7},
    # in the article's order [31, 61, 30, 31]
    "gcd_padding_per_value": {31: [0, 1, 1, 0], 32: [1, 3, 2, 1]},
    "swa_split": [31, 30],
    "group_widths": [
        ("MLA", 1435968),
        ("SWA KV 1", 1160640),
        ("SWA KV 2", 1123200),
        ("SWA state 1 (C4)", 1244160),
        ("SWA state 2 (C128)", 1017792),
    ],
    "two_group_stride": 2283840,
    "two_group_blocks_10gib": 4701,
    "two_group_last_swa_offset": 2246400,
    "two_group_widths": {"MLA": 1435968, "SWA": 2283840},
    "two_group_swa_offsets": [
        ("swa_0", 0),
        ("swa_1", 37440),
        ("swa_2", 74880),
        ("swa_3", 112320),
        ("swa_60", 2246400),
    ],
    # the article's MLA-group walk: main attention before the indexer in each ratio-4 layer
    "two_group_mla_offsets": [
        ("HCA0", 0),
        ("HCA1", 1728),
        ("CSA2", 3456),
        ("Indexer2", 40896),
        ("HCA3", 49536),
        ("CSA4", 51264),
        ("Indexer4", 88704),
    ],
    "two_group_mla_end_after_layer4": 97344,
    "layer_packing": {
        "swa_0": 0,
        "hca_0": 0,
        "hca_1": 1728,
        "csa_2": 3456,
        "swa_1": 37440,
        "indexer_2": 40896,
        "HCA3": 49536,
        "CSA4": 51264,
        "swa_2": 74880,
        "Indexer4": 88704,
    },
    "five_group_stride": 1435968,
    "five_group_blocks_10gib": 7477,
    "swa_view_shape": (64, 584),
    "swa_view_page_bytes": 37376,
}


# The article's layer labels ("CSA4", "swa_1", ...), mapped to this package's layer names.
ARTICLE_LABEL_KINDS = {"swa": "swa", "hca": "attn", "csa": "attn", "indexer": "idx"}


def article_label_to_name(label: str) -> str:
    """'CSA4' or 'swa_1' -> 'layers.4.attn' / 'layers.1.swa_cache'."""
    text = label.lower().replace("_", "")
    for prefix, kind in ARTICLE_LABEL_KINDS.items():
        if text.startswith(prefix) and text[len(prefix) :].isdigit():
            return layer_name(int(text[len(prefix) :]), kind)
    raise ValueError(
        f"unknown layer label {label!r}; expected e.g. 'CSA4', 'HCA0', 'Indexer2' or 'swa_1'"
    )
