"""Chapter 15's build (your_upper_bound): realistic wrong versions, as edits of our version.
Each must make the Compare cell fail."""

WRONG = {
    "the last prompt token counted as a hit": [
        ("out.append(min(hit, r.input_length - 1))", "out.append(hit)")
    ],
    "a shared block counts its length here, not the length it had before": [
        ("hit += min(length, seen[h])", "hit += length")
    ],
    "an unseen block skipped instead of ending the run": [
        (
            "if h not in seen:\n                break",
            "if h not in seen:\n                continue",
        )
    ],
    "the run goes on past a block that was only seen shorter": [
        ("            if seen[h] < length:\n                break\n", "")
    ],
    "a shorter turn overwrites the length a block had": [
        (
            "seen[h] = max(seen.get(h, 0), min(512, r.input_length - 512 * i))",
            "seen[h] = min(512, r.input_length - 512 * i)",
        )
    ],
    "the request's own blocks recorded before its hit is counted": [
        (
            "        hit = 0\n",
            "        for i, h in enumerate(r.hash_ids):\n"
            "            seen[h] = max(seen.get(h, 0), min(512, r.input_length - 512 * i))\n"
            "        hit = 0\n",
        )
    ],
}
