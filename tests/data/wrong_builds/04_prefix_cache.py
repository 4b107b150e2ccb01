"""Chapter 04's build (your_prefix_match): realistic wrong versions, as edits of our version.
Each must make the Compare cell fail."""

WRONG = {
    "each block hashed alone (no chain)": [
        ("h = compute_hash(tokens, h)", "h = compute_hash(tokens)")
    ],
    "the last block looked up too": [
        ("for i in range(num_blocks - 1):", "for i in range(num_blocks):")
    ],
    "a hash hit trusted without comparing tokens": [
        (" or bm.blocks[block_id].token_ids != tokens", "")
    ],
    "every hit saves a free block, freed ones too": [
        ("return hits, num_blocks - in_use", "return hits, num_blocks - len(hits)")
    ],
    "a miss skipped instead of ending the walk": [
        ("            break  # the first miss", "            continue  # the first miss")
    ],
}
