"""Part I pictures: every figure builds; text twins are exact for the write-up's fixed
state."""

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from refimpl.course.fragmentation import compare_allocation, sample_request_lengths
from refimpl.course.paged_scenarios import prefix_cache_example
from refimpl.course.prefix_match import explain_prefix_match
from refimpl.paged import BlockManager, Sequence
from refimpl.viz.paged import (
    block_pool_text,
    draw_block_pool,
    draw_fragmentation,
    draw_prefix_lookup,
    draw_prefix_match,
    draw_reusable_tokens,
    fragmentation_text,
    prefix_lookup_text,
    prefix_match_text,
    reusable_tokens_text,
    short_hash,
)

EXAMPLE_POOL = """\
pool: 8 blocks x 4 tokens | used 4, free 4, cached hashes 2
block  ref  hash  tokens  state
   #0    1  -     3/4     in use by other0
   #1    1  1835  4/4     in use by holder
   #2    1  -     1/4     in use by holder
   #3    0  a7dc  4/4     free, cached (queue position 3)
   #4    0  -     -       free (queue position 2)
   #5    1  -     2/4     in use by other1
   #6    0  -     -       free (queue position 0)
   #7    0  -     -       free (queue position 1)
free queue (head -> tail): #6 #7 #4 #3
other0: L0->#0  (len 3, cached 3)
holder: L0->#1 L1->#2  (len 5, cached 5)
other1: L0->#5  (len 2, cached 2)"""

EXAMPLE_MATCH = """\
request: 12 tokens, block_size 4, 3 blocks
L0 [101 102 103 104]      hash 1835  hit, in use    #1 shared, ref 1->2
L1 [201 202 203 204]      hash a7dc  hit, freed     #3 leaves the free queue, ref 0->1
L2 [301 302 303 304]      hash -     last block     #6 from the free-queue head
   (the last block is always recomputed (prefill needs logits))
cached blocks: 2 (8 tokens); free blocks needed 2 of 4 free -> fits, can_allocate = 2"""


def test_block_pool_text_and_figure():
    bm, holders, request = prefix_cache_example()
    assert block_pool_text(bm, holders) == EXAMPLE_POOL
    fig = draw_block_pool(bm, holders)
    assert isinstance(fig, Figure)
    bm.allocate(request, 2)
    text = block_pool_text(bm, {**holders, "request": request})
    assert "   #1    2  1835  4/4     in use by holder, request" in text
    assert "free queue (head -> tail): #7 #4" in text
    assert text.endswith("request: L0->#1 L1->#3 L2->#6  (len 12, cached 8)")
    ax = draw_block_pool(bm, {**holders, "request": request}).axes[0]
    pool = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_y() == 0]
    # exactly one shared block, thick border
    assert sum(p.get_linewidth() == 3.0 for p in pool) == 1
    assert not any(p.get_hatch() for p in ax.patches)  # nothing hatched over the labels
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "free, empty" in labels and "shared (ref > 1)" in labels


def test_block_pool_legend_lists_only_states_in_the_picture_and_mutes_others():
    bm = BlockManager(4, 4)
    subject, other = Sequence([1, 2, 3, 4, 5], block_size=4), Sequence([9], block_size=4)
    for seq in (subject, other):
        bm.allocate(seq, bm.can_allocate(seq))
    ax = draw_block_pool(bm, {"other": other, "subject": subject}, muted=["other"]).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    # nothing shared, nothing cached
    assert labels == ["subject", "other requests", "free, empty"]


def test_block_pool_unnamed_sequences_and_empty_pool():
    bm = BlockManager(3, 2)
    seq = Sequence([1, 2, 3], block_size=2)
    text = block_pool_text(bm, [seq])
    assert "free queue (head -> tail): #0 #1 #2" in text
    assert text.endswith(f"seq {seq.seq_id}: no blocks  (len 3, cached 0)")
    assert isinstance(draw_block_pool(bm, [seq]), Figure)


def test_prefix_match_text_and_figure():
    bm, _, request = prefix_cache_example()
    m = explain_prefix_match(bm, request)
    assert prefix_match_text(m) == EXAMPLE_MATCH
    assert isinstance(draw_prefix_match(m), Figure)


def test_prefix_match_does_not_fit_and_long_blocks():
    bm = BlockManager(2, 8)
    m = explain_prefix_match(bm, Sequence(list(range(20)), block_size=8))
    text = prefix_match_text(m)
    assert "L0 [0 1 .. 7] (8 tokens)" in text
    assert text.count("does not fit") == 4  # three blocks plus the verdict
    assert text.endswith("free blocks needed 3 of 2 free -> does not fit, can_allocate = -1")
    assert isinstance(draw_prefix_match(m), Figure)


def test_short_hash():
    assert short_hash(None) == "-" and short_hash(-1) == "-"
    assert short_hash(0xABCDEF0123456789) == "abcd"


def test_fragmentation_and_reuse_plots():
    lengths = sample_request_lengths(200, seed=1)
    rows = compare_allocation(lengths.total_lens, 2048, [16, 256])
    assert isinstance(draw_fragmentation(lengths, rows), Figure)
    assert fragmentation_text(rows).splitlines()[1].startswith("reserve-max")
    assert reusable_tokens_text(600, 700, [16, 256]) == (
        "shared prefix 600 tokens, prompt 700 tokens\n"
        "block_size  reused  recomputed-prefix\n"
        "        16     592                  8\n"
        "       256     512                 88"
    )
    assert isinstance(draw_reusable_tokens(600, 700, [1, 16, 256]), Figure)


def test_prefix_lookup_text_and_figure():
    bm, holders, request = prefix_cache_example()
    m = explain_prefix_match(bm, request)
    text = prefix_lookup_text(bm, m, holders)
    assert text.splitlines()[:6] == [
        "L0 [101 102 103 104]   hash 1835 -> hash_to_block_id -> #1 -> tokens equal",
        "   => in use: share #1 ref 1\u21922",
        "L1 [201 202 203 204]   hash a7dc -> hash_to_block_id -> #3 -> tokens equal",
        "   => freed: pull #3 from the free queue",
        "L2 [301 302 303 304]   last block -> never looked up",
        "   => fresh #6 from the queue head",
    ]
    assert text.endswith(EXAMPLE_POOL)
    ax = draw_prefix_lookup(bm, m, holders).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [
        "hit, in use",
        "hit, freed",
        "last block",
        "in use (holders under it)",
        "free, hash kept",
        "free, empty",
    ]
    shown = [t.get_text() for t in ax.texts]
    # the flow and the free queue are drawn
    assert "\u2192 hash_to_block_id" in shown and "#6" in shown
    assert min(t.get_fontsize() for t in ax.texts) >= 8


def test_prefix_lookup_collision_and_miss():
    bm, _, _ = prefix_cache_example()
    from refimpl.course.paged_scenarios import EXAMPLE_C
    from refimpl.paged import compute_hash

    fake = compute_hash(EXAMPLE_C)
    bm.hash_to_block_id[fake] = 1
    bm.blocks[1].hash = fake
    m = explain_prefix_match(bm, Sequence(EXAMPLE_C + [9], block_size=4))
    assert prefix_lookup_text(bm, m, {}).splitlines()[:2] == [
        "L0 [301 302 303 304]   hash a45d -> hash_to_block_id -> #1 -> tokens differ",
        "   => fresh #6 from the queue head",
    ]
