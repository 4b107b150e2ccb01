"""Chapter 09's step-by-step view of the packed grouping agrees with the package's planner."""

from __future__ import annotations

import pytest

from refimpl.course.hybrid_toy import toy_v4_specs
from refimpl.course.v4_buckets import (
    bucket_shape,
    buckets_of_groups,
    find_buckets,
    gcd_inputs,
)
from refimpl.hybrid import deepseek_v4 as v4
from refimpl.hybrid.kv_cache_planning import get_packed_kv_cache_groups

MODELS = {
    "pro": lambda: v4.kv_cache_specs("pro"),
    "flash": lambda: v4.kv_cache_specs("flash"),
    "pro+mtp": lambda: v4.kv_cache_specs("pro", mtp=True),
    "toy": toy_v4_specs,
    "four layers": lambda: toy_v4_specs(4),
}


@pytest.mark.parametrize("model", MODELS)
def test_buckets_read_back_from_the_planners_groups(model):
    specs = MODELS[model]()
    groups = get_packed_kv_cache_groups(specs)
    assert buckets_of_groups(specs, groups) == [list(b) for b in find_buckets(specs)]


def test_pro_buckets_shapes_and_gcd_inputs():
    specs = v4.kv_cache_specs("pro")
    shapes = [bucket_shape(b) for b in find_buckets(specs)]
    assert [(s.tuples, s.balanced, s.page_sizes) for s in shapes] == [
        (61, True, 1),
        (31, False, 3),
        (31, True, 1),
        (30, True, 2),
    ]
    assert gcd_inputs(specs) == ([61, 31, 30], 30)
    assert gcd_inputs(toy_v4_specs()) == ([5, 3, 2], 2)


def test_merging_stops_at_a_bucket_boundary():
    """Two SWA groups merge; the MLA group after them does not join them."""
    specs = toy_v4_specs()
    merged = buckets_of_groups(specs, get_packed_kv_cache_groups(specs))
    assert [len(b) for b in merged] == [5, 7, 3, 4]
