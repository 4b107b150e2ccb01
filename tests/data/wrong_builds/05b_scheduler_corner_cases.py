"""Chapter 05b's build (YourScheduler with chunks and preemption): realistic wrong versions, as
edits of our version. Each must make the Compare cell fail."""

WRONG = {
    "the oldest running request preempted": [
        (
            "return self.running.pop()  # the request that arrived last",
            "return self.running.popleft()",
        )
    ],
    "every request of a step may be cut": [
        ("            if todo > budget and batch:\n                break", "            pass")
    ],
    "a cut prompt's rest computed from its start": [
        ("todo = len(seq) - seq.num_cached_tokens", "todo = len(seq)")
    ],
    "decoded requests put back in reverse order": [
        ("self.running.extendleft(reversed(batch))", "self.running.extendleft(batch)")
    ],
    "a cut prompt moved to running before it is done": [
        (
            "if seq.num_cached_tokens + seq.num_scheduled_tokens == len(seq):",
            "if True:",
        )
    ],
}
