"""Chapter 02's build (YourSequence): realistic wrong versions, as edits of our version. Each
must make the Compare cell fail."""

WRONG = {
    "num_blocks one too many on a full last block": [
        (
            "-(-len(self.token_ids) // self.block_size)",
            "len(self.token_ids) // self.block_size + 1",
        )
    ],
    "last_block_num_tokens 0 on a full last block": [
        (
            "len(self.token_ids) - (self.num_blocks - 1) * self.block_size",
            "len(self.token_ids) % self.block_size",
        )
    ],
    "the slot's block id not scaled by block_size": [
        (
            "block_table[p // self.block_size] * self.block_size + p % self.block_size",
            "block_table[p // self.block_size] + p % self.block_size",
        )
    ],
    "the slot ignores the block table": [
        (
            "block_table[p // self.block_size] * self.block_size",
            "p // self.block_size * self.block_size",
        )
    ],
}
