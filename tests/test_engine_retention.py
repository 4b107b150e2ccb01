"""Part I's `LLM` takes vLLM's `prefix_cache_retention_interval` with vLLM's default (0) and
vLLM's rule for a model without a sliding-window layer: 0 and None are accepted and change
nothing, a positive interval is refused."""

from __future__ import annotations

import pytest

from refimpl.engine import LLM
from refimpl.engine.config import Config


def test_default_is_vllms():
    assert Config.__dataclass_fields__["prefix_cache_retention_interval"].default == 0


def test_zero_and_none_are_accepted_a_positive_interval_is_refused(tiny_dir):
    for retention in (0, None):
        LLM(
            tiny_dir,
            device="cpu",
            num_kvcache_blocks=8,
            prefix_cache_retention_interval=retention,
        ).close()
    with pytest.raises(ValueError, match="no sliding-window layer"):
        LLM(tiny_dir, device="cpu", num_kvcache_blocks=8, prefix_cache_retention_interval=256)
    with pytest.raises(ValueError, match="non-negative int"):
        LLM(tiny_dir, device="cpu", num_kvcache_blocks=8, prefix_cache_retention_interval=-1)
