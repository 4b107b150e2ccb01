"""Chapter 05's build (YourScheduler.schedule): realistic wrong versions, as edits of our
version. Each must make the Compare cell fail."""

WRONG = {
    "cached prefix blocks computed again": [
        (
            "new_tokens = len(seq) - num_cached_blocks * self.block_size",
            "new_tokens = len(seq)",
        )
    ],
    "an exact fit of the token budget refused": [
        (
            "if num_tokens + new_tokens > self.max_num_batched_tokens:",
            "if num_tokens + new_tokens >= self.max_num_batched_tokens:",
        )
    ],
    "max_num_seqs ignored in prefill": [
        ("while self.waiting and len(batch) < self.max_num_seqs:", "while self.waiting:")
    ],
    "no block added when a decode token opens one": [("            bm.may_append(seq)\n", "")],
    "running requests decode in the same step as new prompts": [
        ("        if batch:\n            return batch, True\n", "")
    ],
}
