"""Chapter 03's build (YourBlockManager): realistic wrong versions, as edits of our version.
Each must make the chapter's Compare cell fail (tests/test_chapter_builds.py)."""

WRONG = {
    "a decode at a block boundary, off by one": [
        ("(new_len - 1) % self.block_size == 0", "new_len % self.block_size == 0")
    ],
    "the article's len % block_size == 1 test (never fires with blocks of 1)": [
        ("(new_len - 1) % self.block_size == 0", "new_len % self.block_size == 1")
    ],
    "freeing first block first": [
        ("reversed(self.tables.pop(name))", "self.tables.pop(name)")
    ],
    "fresh blocks from the tail of the queue": [
        ("self.free_ids.popleft()", "self.free_ids.pop()")
    ],
    "every hit counted as a fresh block": [
        (
            "needed = num_blocks - sum(self.ref_count[b] > 0 for b in hits)",
            "needed = num_blocks",
        )
    ],
    "a freed hit left in the free queue": [("self.free_ids.remove(block_id)", "pass")],
}
