"""Realistic wrong versions of chapter 10's `your_layout`; each must fail the Compare cell."""

WRONG = {
    "groups laid one after another instead of each from byte 0": '''
def your_layout(groups, budget):
    offsets, at = {}, 0
    for group in groups:
        for name in group.layer_names:
            offsets[name] = at
            at += group.layer_spec(name).page_size_bytes
    return offsets, at, budget // at
''',
    "pages in layer order instead of spec runs": '''
def your_layout(groups, budget):
    offsets, widths = {}, []
    for group in groups:
        at = 0
        for name in group.layer_names:
            offsets[name] = at
            at += group.layer_spec(name).page_size_bytes
        widths.append(at)
    return offsets, max(widths), budget // max(widths)
''',
}
