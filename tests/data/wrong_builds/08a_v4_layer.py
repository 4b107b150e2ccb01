"""Chapter 08a's build (your_fold): realistic wrong versions, as edits of our version. Each
must make the Compare cell fail."""

WRONG = {
    "the series swapped (own window from series a)": [
        ("torch.cat([kv_a[prev], kv_b[own]])", "torch.cat([kv_b[prev], kv_a[own]])"),
        (
            "torch.cat([score_a[prev], score_b[own]])",
            "torch.cat([score_b[prev], score_a[own]])",
        ),
    ],
    "no overlap: each entry pools its own window only": [
        ("kv = kv_b[own] if j == 0 else torch.cat([kv_a[prev], kv_b[own]])", "kv = kv_b[own]"),
        (
            "score = score_b[own] if j == 0 else torch.cat([score_a[prev], score_b[own]])",
            "score = score_b[own]",
        ),
    ],
    "one softmax over the whole window, not one per number": [
        ("(score.softmax(dim=0) * kv)", "(score.flatten().softmax(dim=0).view_as(score) * kv)")
    ],
    "a plain average instead of softmax weights": [
        ("(score.softmax(dim=0) * kv).sum(dim=0)", "kv.mean(dim=0)")
    ],
    "a partial window at the end makes an entry": [
        ("for j in range(len(kv_b) // ratio):", "for j in range(-(-len(kv_b) // ratio)):")
    ],
}
