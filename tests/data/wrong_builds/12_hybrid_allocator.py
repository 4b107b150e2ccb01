"""Chapter 12's builds (your_frees, your_hit): realistic wrong versions, as edits of our
versions. Each must make a Compare cell fail."""

WRONG = {
    "frees: a partly skipped block freed too": [
        (
            "skipped = max(0, num_computed - window + 1) // block_size",
            "skipped = -(-max(0, num_computed - window + 1) // block_size)",
        )
    ],
    "frees: one token too few skipped": [
        ("max(0, num_computed - window + 1)", "max(0, num_computed - window)")
    ],
    "frees: walked first block first, stopping at the first null": [
        (
            "for i in range(min(skipped, len(table)) - 1, -1, -1):",
            "for i in range(min(skipped, len(table))):",
        )
    ],
    "hit: one lookup, full attention only": [
        (
            "for spec, group_ids, _ in coordinator.attention_groups:",
            "for spec, group_ids, _ in coordinator.attention_groups[:1]:",
        )
    ],
    "hit: one round, no fixed point": [("if candidate == start:", "if True:")],
    "hit: the last token looked up too": [
        ("candidate = request.num_tokens - 1", "candidate = request.num_tokens")
    ],
}
