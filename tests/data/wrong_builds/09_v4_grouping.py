"""Chapter 09's three builds (your_approximate_gcd, your_buckets, your_groups): realistic wrong
versions, as edits of our versions. Each must make a Compare cell fail."""

WRONG = {
    "gcd: a tie goes to the smaller d": [
        ("if best_pad is None or pad <= best_pad:", "if best_pad is None or pad < best_pad:")
    ],
    "gcd: the lower bound ignored": [
        ("range(max(1, lower_bound), max(values) + 1)", "range(1, max(values) + 1)")
    ],
    "gcd: padding as v % d instead of the round-up": [
        ("pad = sum(-v % d for v in values)", "pad = sum(v % d for v in values)")
    ],
    "buckets: a cache tried against the last bucket only": [
        ("for bucket in buckets:", "for bucket in buckets[-1:]:")
    ],
    "buckets: grouped by spec class alone": [
        (
            "if UniformTypeKVCacheSpecs.is_uniform_type({**bucket, name: spec}):",
            "if type(next(iter(bucket.values()))) is type(spec):",
        )
    ],
    "groups: a bucket cut into contiguous runs instead of dealt": [
        ("tups[i::n]", "tups[i * d : (i + 1) * d]")
    ],
    "groups: floor instead of ceil": [("n = -(-len(tups) // d)", "n = len(tups) // d or 1")],
    "groups: the unbalanced MLA bucket dealt too": [("if not balanced:", "if False:")],
}
