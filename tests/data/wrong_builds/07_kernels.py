"""Chapter 07's build (your_decode): realistic wrong versions, as edits of our version. Each
must make the Compare cell fail."""

WRONG = {
    "l and acc not rescaled when the max grows": [
        ("l = l * alpha + p.sum().item()", "l = l + p.sum().item()"),
        ("acc = acc * alpha + p @ v", "acc = acc + p @ v"),
    ],
    "scores not scaled by 1 / sqrt(head_dim)": [
        ("scale = 1 / math.sqrt(q_head.shape[-1])", "scale = 1.0")
    ],
    "blocks read as if the context were contiguous": [
        ("table[pos // block_size].long()", "(pos // block_size)")
    ],
    "the last tile read past the context": [
        ("torch.arange(start, min(start + block_n, seqlen))", "torch.arange(start, start + block_n)")
    ],
}
