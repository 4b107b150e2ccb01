"""The course layer's teaching props: what the chapters use next to the core.

Running examples and named requests (`running_example`), scenarios and steppers' data
(`paged_scenarios`, `paged_steps`, `prefix_match`, `runners`, `hybrid_simulate`,
`hybrid_toy`), comparisons with the articles (`article_comparison`, `fragmentation`,
`layout_summary`, `fp8_ds_mla`) and the notebook format (`notebook_format`). The exercises'
graders are not here: they are the top-level `grader` package.
"""
