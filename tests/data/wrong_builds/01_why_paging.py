"""Chapter 01's build (your_held, your_waste, your_requests_that_fit): realistic wrong
versions, as edits of our version. Each must make the Compare cell fail."""

WRONG = {
    "one block too many when a request fills its last block exactly": [
        ("-(-n // block_size) * block_size", "(n // block_size + 1) * block_size")
    ],
    "whole blocks rounded down": [
        ("-(-n // block_size) * block_size", "n // block_size * block_size")
    ],
    "later, smaller requests overtake the first that does not fit": [
        ("break  # arrival order", "continue  # arrival order")
    ],
    "an exact fit refused": [("if used + slots > budget:", "if used + slots >= budget:")],
    "waste counted against the longest request": [
        ("return held, held - sum(lens)", "return held, held - max(lens) * len(lens)")
    ],
}
