"""Chapter 11's build (your_window_row, your_swa_indices_and_lens): realistic wrong versions,
as edits of our version. Each must make the Compare cell fail."""

WRONG = {
    "a window one position too long": [
        ("first = max(position - window + 1, 0)", "first = max(position - window, 0)")
    ],
    "the position counted from the request's start (new tokens taken as the first)": [
        ("pos = int(seq_lens[req]) - (q_end - q_start) + (t - q_start)", "pos = t - q_start")
    ],
    "padding rows read their stale request": [("if not valid[t]:", "if False:")],
    "the slot from the position alone (no block table)": [
        (
            "return [table[p // block_size] * block_size + p % block_size for p in positions]",
            "return list(positions)",
        )
    ],
    "rows padded at the front": [
        (
            "rows.append(row + [-1] * (window - len(row)))",
            "rows.append([-1] * (window - len(row)) + row)",
        )
    ],
}
