"""Chapter 14's build (your_startup_figures): realistic wrong versions, as edits of our
version. Each must make the Compare cell fail."""

WRONG = {
    "no null block held back before the fit check": [
        (
            "if budget - block_bytes < per_request * block_bytes:",
            "if budget < per_request * block_bytes:",
        )
    ],
    "blocks per request rounded down": [
        ("-(-max_model_len // spec.block_size)", "max_model_len // spec.block_size")
    ],
    "KV cache size as blocks x block size": [
        ("int(concurrency * max_model_len)", "num_blocks * spec.block_size")
    ],
    "the V head taken as wide as the K head": [
        ("(spec.head_size + spec.head_size_v)", "2 * spec.head_size")
    ],
    "two bytes per value whatever the cache dtype": [("BYTES_PER_VALUE[spec.dtype]", "2")],
    "the null block left out of the blocks reported": [
        ("num_blocks = budget // block_bytes", "num_blocks = budget // block_bytes - 1")
    ],
    "the block size fixed at FlashAttention's 16": [
        ("spec.block_size\n        * spec.num_kv_heads", "16\n        * spec.num_kv_heads"),
        ("-(-max_model_len // spec.block_size)", "-(-max_model_len // 16)"),
    ],
}
