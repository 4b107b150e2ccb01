"""Part II's glossary picture (chapter 08b): the six words follow one cache of the running
example through the package's real planner, layout and allocator."""

from __future__ import annotations

import pytest

from refimpl.course.hybrid_toy import toy_v4_specs
from refimpl.hybrid.kv_cache_planning import GIB, get_kv_cache_config, get_kv_cache_groups
from refimpl.viz.pipeline_glossary import (
    TERMS,
    draw_pipeline_glossary,
    follow_cache,
    pipeline_glossary_text,
)


@pytest.fixture(scope="module")
def steps():
    return follow_cache(toy_v4_specs(), "layers.2.swa_cache")


def test_the_six_words_in_order(steps):
    assert tuple(step.term for step in steps) == TERMS


def test_the_examples_are_the_planners_numbers(steps):
    """Group, width and slab address come from the package's plan of the toy."""
    specs = toy_v4_specs()
    groups = get_kv_cache_groups(specs)
    config = get_kv_cache_config(groups, GIB)
    by_term = {step.term: step.example for step in steps}
    assert by_term["bucket"].startswith("bucket 0 of 4: 5 caches (L0.swa, L1.swa, L2.swa")
    assert by_term["layer tuple"].startswith("tuple 2 of 5: (L2.swa), balanced")
    assert "(L2.idx_state, L2.c4_state)" in by_term["layer tuple"]
    assert by_term["group"].startswith(
        "group 0: L0.swa, L2.swa, L4.swa (bucket 0 dealt into 2)"
    )
    assert f"width {groups[0].width_bytes:,} B" in by_term["group"]
    assert "group 0 holds block ids [1, 2, 3]" in by_term["block table"]
    tensor = next(t for t in config.kv_cache_tensors if "layers.2.swa_cache" in t.shared_by)
    address = 3 * config.block_stride + tensor.layer_offset("layers.2.swa_cache")
    assert by_term["slab"].endswith(f"= {address:,} B")


def test_a_two_page_bucket_shows_its_pair():
    """Followed from a cache of the ratio-4 state bucket, the tuple is the (idx, c4) pair."""
    steps = follow_cache(toy_v4_specs(), "layers.4.compressor.state_cache")
    tup = next(s.example for s in steps if s.term == "layer tuple")
    assert tup.startswith("tuple 1 of 2: (L4.idx_state, L4.c4_state), balanced")


def test_text_twin_fits_a_laptop_and_the_figure_draws_every_word(steps):
    text = pipeline_glossary_text(steps)
    assert max(len(line) for line in text.splitlines()) <= 100
    fig = draw_pipeline_glossary(steps, "t")
    drawn = {t.get_text() for t in fig.axes[0].texts}
    assert set(TERMS) <= drawn


def test_unknown_cache_is_a_value_error():
    with pytest.raises(ValueError, match="not one of the 19 caches"):
        follow_cache(toy_v4_specs(), "layers.9.swa_cache")
