"""Chapter 09's steps of vLLM's packed grouping, one at a time: the uniform-type buckets in
registration order, each bucket's layer tuples and balance, and the inputs of the approximate
gcd.

vLLM's `get_packed_kv_cache_groups` (refimpl.hybrid.kv_cache_planning) does all of this inside
one function. The chapter takes it apart so a reader can build and check each step;
`buckets_of_groups` reads the buckets back from the package's groups, so a reader's buckets are
checked against the real planner, not against this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from refimpl.hybrid.kv_cache_interface import (
    KVCacheGroupSpec,
    KVCacheSpec,
    UniformTypeKVCacheSpecs,
)


def find_buckets(specs: Mapping[str, KVCacheSpec]) -> list[dict[str, KVCacheSpec]]:
    """The buckets: in registration order, a cache joins the first bucket it keeps
    uniform-type (same kind, block size and window), or opens a new one."""
    buckets: list[dict[str, KVCacheSpec]] = []
    for name, spec in specs.items():
        for bucket in buckets:
            if UniformTypeKVCacheSpecs.is_uniform_type({**bucket, name: spec}):
                bucket[name] = spec
                break
        else:
            buckets.append({name: spec})
    return buckets


def by_page_size(bucket: Mapping[str, KVCacheSpec]) -> dict[int, list[str]]:
    """{page size: the bucket's caches of that size, in registration order}."""
    pages: dict[int, list[str]] = {}
    for name, spec in bucket.items():
        pages.setdefault(spec.page_size_bytes, []).append(name)
    return pages


@dataclass(frozen=True)
class BucketShape:
    """What the approximate gcd needs from one bucket."""

    tuples: int  # layer tuples: the count of its most frequent page size
    balanced: bool  # every page size has the same count
    page_sizes: int  # how many page sizes it mixes


def bucket_shape(bucket: Mapping[str, KVCacheSpec]) -> BucketShape:
    counts = [len(names) for names in by_page_size(bucket).values()]
    return BucketShape(max(counts), len(set(counts)) == 1, len(counts))


def gcd_inputs(specs: Mapping[str, KVCacheSpec]) -> tuple[list[int], int]:
    """(the tuple counts of the balanced buckets, the lower bound: the largest balanced
    bucket that mixes page sizes, 0 when there is none)."""
    shapes = [bucket_shape(b) for b in find_buckets(specs)]
    tuples = [s.tuples for s in shapes if s.balanced]
    lower = max((s.tuples for s in shapes if s.balanced and s.page_sizes > 1), default=0)
    return tuples, lower


def buckets_of_groups(
    specs: Mapping[str, KVCacheSpec], groups: Sequence[KVCacheGroupSpec]
) -> list[list[str]]:
    """The buckets a grouping came from, each in registration order: consecutive groups whose
    caches together stay uniform-type came from one bucket (had two buckets been uniform-type
    together, their caches would have joined the first)."""
    merged: list[list[str]] = []
    for group in groups:
        names = list(group.layer_names)
        if merged and UniformTypeKVCacheSpecs.is_uniform_type(
            {n: specs[n] for n in merged[-1] + names}
        ):
            merged[-1] += names
        else:
            merged.append(names)
    order = {name: i for i, name in enumerate(specs)}
    return [sorted(names, key=order.__getitem__) for names in merged]
