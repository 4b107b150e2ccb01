"""Chapter 10's build (your_layout): realistic wrong versions, as edits of our version.
Each must make the Compare cell fail."""

WRONG = {
    "groups laid one after another instead of each from byte 0": [
        ("    offsets, widths = {}, []\n", "    offsets, widths = {}, []\n    at = 0\n"),
        ("        at = 0  # every group starts at byte 0 of the block\n", ""),
    ],
    "pages in layer order instead of spec runs": [
        ("runs.setdefault(group.layer_spec(name), []).append(name)", "runs[name] = [name]"),
        ("for spec, names in runs.items():", "for names in runs.values():"),
        ("at += spec.page_size_bytes", "at += group.layer_spec(name).page_size_bytes"),
    ],
    "the stride is the narrowest group": [("stride = max(widths)", "stride = min(widths)")],
}
