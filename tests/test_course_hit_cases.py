"""Chapter 12's two-round case: the package's fixed point needs a second round to settle."""

from __future__ import annotations

import pytest

from refimpl.course.hit_cases import plant_cached_blocks, two_round_hit
from refimpl.hybrid.single_type_kv_cache_manager import SlidingWindowManager


def one_round(manager, request):
    """Every group looked up once, in order: what a lookup without rounds answers."""
    coordinator, candidate = manager.coordinator, request.num_tokens - 1
    for spec, group_ids, _ in coordinator.attention_groups:
        kind = type(coordinator.single_type_managers[group_ids[0]])
        found = kind.find_longest_cache_hit(
            request.block_hashes,
            candidate,
            group_ids,
            manager.block_pool,
            spec,
            hash_block_size=coordinator.hash_block_size,
            alignment_tokens=coordinator.scheduler_block_size,
        )
        candidate = len(found[0]) * spec.block_size
    return candidate


def test_the_hit_settles_only_in_the_second_round():
    manager, request = two_round_hit()
    assert one_round(manager, request) == 8
    _, hit, _ = manager.get_computed_blocks(request)
    assert hit == 0


def test_without_the_gap_the_eight_window_serves_eight():
    manager, request = two_round_hit()
    plant_cached_blocks(manager, request, 1, [0, 1])
    assert manager.get_computed_blocks(request)[1] == 8
    assert isinstance(manager.coordinator.single_type_managers[1], SlidingWindowManager)


def test_planting_checks_its_arguments():
    manager, request = two_round_hit()
    with pytest.raises(ValueError, match="group_id"):
        plant_cached_blocks(manager, request, 3, [0])
    with pytest.raises(ValueError, match="block indices"):
        plant_cached_blocks(manager, request, 0, [6])
