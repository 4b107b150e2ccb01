"""Chapter 08b's build (your_layer, your_page): realistic wrong versions, as edits of our
version. Each must make the Compare cell fail."""

WRONG = {
    "a row without its pad byte (583 B)": [
        ("ROW_BYTES = 448 + 64 * 2 + 7 + 1", "ROW_BYTES = 448 + 64 * 2 + 7")
    ],
    "the article's 128-byte indexer entry": [
        ("INDEXER_BYTES = 128 + 4", "INDEXER_BYTES = 128")
    ],
    "the window registered before the indexer": [
        (
            'return kinds + ["swa"] + (',
            'return ["swa"] + kinds + (',
        )
    ],
    "the real page reserved, no alignment": [
        ("return entries, real, math.ceil(real / ALIGN) * ALIGN", "return entries, real, real")
    ],
    "every state block of 4 rows": [
        ('entries = 8 if kind == "c128_state" else 4', "entries = 4")
    ],
}
