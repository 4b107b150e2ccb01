"""Chapter 13's build (your_slot): realistic wrong versions, as edits of our version. Each must
make the Compare cell fail."""

WRONG = {
    "every position writes a compressed row": [("if (position + 1) % ratio:", "if False:")],
    "the row written at the window's first token": [
        ("if (position + 1) % ratio:", "if position % ratio:")
    ],
    "rows per block without the ratio": [
        ("per_block = block_size // ratio", "per_block = block_size")
    ],
    "the block table left out": [
        ("return table[row // per_block] * per_block + row % per_block", "return row")
    ],
}
