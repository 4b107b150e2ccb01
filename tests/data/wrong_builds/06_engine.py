"""Chapter 06's build (your_prepare_prefill): realistic wrong versions, as edits of our
version. Each must make the Compare cell fail."""

WRONG = {
    "the cached prefix packed again": [
        ("start = seq.num_cached_tokens  #", "start = 0  #")
    ],
    "cu_seqlens_k counting only the tokens computed": [
        ('step["cu_seqlens_k"][-1] + end)', 'step["cu_seqlens_k"][-1] + end - start)')
    ],
    "slots as if blocks were contiguous": [
        ("block = seq.block_table[pos // block_size]", "block = pos // block_size")
    ],
    "block tables padded with 0": [("[-1] * (width - len(s.block_table))", "[0] * (width - len(s.block_table))")],
}
