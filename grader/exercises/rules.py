"""The rules of the reference that each grader checks, each with the scenario and the broken
variant that cover it.

A grader is only as good as its scenarios: a rule no scenario exercises is a rule a wrong
submission may break and still pass. So every rule below names the scenario (a row of the
grader's table) that fails when the rule is broken, and a wrong version that breaks exactly
that rule: a variant in `grader.exercises.broken`, or (`planted`) a student's slip that
`tests/test_exercise_rules.py` plants in the exercise's solution notebook. The test suite
checks both: the scenario exists, and the wrong version fails it while the reference and the
exercise solutions pass. `tests/test_exercise_rules.py` also plants a student-style slip for
many of the broken variants. The instructor guide (`notebooks/exercises/README.md`) shows the
same list as a table (`rules_table()` writes it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """One behaviour of the reference, the scenario that checks it, and a variant that breaks
    it."""

    rule: str
    scenario: str  # a row name of the grader's table
    variant: str  # a BrokenVariant name in grader.exercises.broken, or (planted) a slip's name
    # True: the wrong version is a student's slip planted in the solution notebook by
    # tests/test_exercise_rules.py, not a variant in grader.exercises.broken
    planted: bool = False


GRADER_RULES: dict[str, tuple[Rule, ...]] = {
    "check_block_manager": (
        Rule(
            "allocate takes ceil(len / block_size) blocks from the head of the free queue, in "
            "order",
            "allocate_from_head",
            "allocate_from_tail",
        ),
        Rule(
            "can_allocate is -1 only when the free blocks do not cover the prompt (an exact "
            "fit fits)",
            "pool_full",
            "can_allocate_strict",
        ),
        Rule(
            "deallocate returns blocks to the tail of the queue, last block first",
            "free_last_block_first",
            "free_in_forward_order",
        ),
        Rule(
            "a decode needs a new block exactly when its token starts one: (len - 1) % "
            "block_size == 0",
            "append_at_block_boundary",
            "append_on_len_mod_0",
        ),
        Rule(
            "that test holds for block_size 1 too, where nano-vllm's literal len % block_size "
            "== 1 never does",
            "block_size_1",
            "append_on_len_mod_1",
        ),
        Rule(
            "can_append is False only when a new block is needed and the queue is empty",
            "append_with_empty_pool",
            "can_append_needs_a_free_block",
        ),
    ),
    "check_prefix_cache": (
        Rule(
            "a block's hash chains the previous block's hash with its own tokens",
            "hash_chain_in_chunks",
            "hash_without_chain",
        ),
        Rule(
            "hash_blocks registers exactly the blocks this step filled, never a partly filled "
            "one",
            "hash_chain_in_chunks",
            "registers_partial_block",
        ),
        Rule(
            "the chain continues from the hash stored on the previous block, even after "
            "another sequence took over its table entry",
            "entry_taken_over_mid_prefill",
            "prefix_hash_from_table",
        ),
        Rule(
            "the prompt's last block is never looked up",
            "last_block_never_looked_up",
            "look_up_last_block",
        ),
        Rule(
            "a hit needs equal tokens: a real hash collision is a miss",
            "token_double_check",
            "skip_token_double_check",
        ),
        Rule(
            "tokens, not the cached block's hash, confirm a hit (its hash always equals the "
            "looked-up one)",
            "token_double_check",
            "confirm_hit_by_hash",
        ),
        Rule(
            "matching stops at the first miss",
            "first_miss_stops_matching",
            "keep_matching_after_miss",
        ),
        Rule(
            "a hit on a block in use costs no free block",
            "in_use_hits_need_no_free_block",
            "in_use_hits_need_free_blocks",
        ),
        Rule(
            "a hit on a freed block still costs a free block",
            "free_hits_still_cost",
            "free_hits_cost_nothing",
        ),
        Rule(
            "a hit on a block in use adds a reference (ref_count + 1)",
            "example_12_tokens",
            "hit_resets_ref_count",
        ),
        Rule(
            "deallocate frees a block only when its last reference goes",
            "example_12_tokens",
            "free_ignores_ref_count",
        ),
        Rule(
            "reusing a block deletes its hash entry when the entry points to it",
            "first_miss_stops_matching",
            "keeps_reused_block_entry",
        ),
        Rule(
            "... and only then (the stale-hash guard)",
            "stale_hash_guard",
            "no_stale_hash_guard",
        ),
        Rule(
            "one-token blocks (block_size 1) are matched, registered and appended like any "
            "other",
            "block_size_1",
            "append_on_len_mod_1",
        ),
    ),
    "check_scheduler": (
        Rule(
            "a waiting head that does not fit blocks the queue: no later request jumps it",
            "waiting_head_does_not_fit",
            "skip_blocked_waiting_head",
        ),
        Rule(
            "only the first sequence of a batch may be cut into a chunk",
            "chunked_prefill_first_only",
            "chunk_any_waiting",
        ),
        Rule(
            "the token sampled after a chunk that does not end the prompt is dropped",
            "chunked_prefill_first_only",
            "keep_token_after_chunk",
        ),
        Rule(
            "cached blocks do not count against the token budget",
            "prefix_hit_shortens_prefill",
            "budget_counts_cached_tokens",
        ),
        Rule(
            "a batch holds at most max_num_seqs sequences", "max_num_seqs", "one_seq_too_many"
        ),
        Rule(
            "the decode batch goes back to the front of running, in batch order",
            "max_num_seqs",
            "batch_to_back_of_running",
        ),
        Rule(
            "with no free block for a decode, the newest running request is preempted",
            "preempt_last_running",
            "preempt_first_running",
        ),
        Rule(
            "a preempted request goes to the front of waiting",
            "preempt_last_running",
            "preempt_to_back",
        ),
        Rule(
            "preemption resets is_prefill",
            "preempt_self_when_alone",
            "keep_decode_flag_on_preempt",
        ),
        Rule(
            "a request alone without a block preempts itself (it is not dropped)",
            "preempt_self_when_alone",
            "drop_instead_of_self_preempt",
        ),
        Rule(
            "postprocess registers filled blocks before num_cached_tokens moves on",
            "prefill_then_decode",
            "register_after_commit",
        ),
        Rule(
            "a request finishes on eos only without ignore_eos, or at max_tokens",
            "eos_and_max_tokens",
            "eos_despite_ignore_eos",
        ),
    ),
    "check_approximate_gcd": (
        Rule(
            "among equal paddings the larger d wins",
            "ties_go_to_larger_d",
            "gcd_smaller_wins_ties",
        ),
        Rule(
            "the search starts at the lower bound (the bucket that mixes page sizes is never"
            " split)",
            "deepseek_v4_buckets",
            "gcd_ignores_lower_bound",
        ),
        Rule("the search includes max(values)", "ties_go_to_larger_d", "gcd_exclusive_max"),
        Rule(
            "a lower bound above every value is returned as is",
            "search_range_inclusive",
            "gcd_clamps_to_max",
        ),
        Rule(
            "a lower bound of 0 or below (or None) means 1",
            "search_range_inclusive",
            "gcd_trusts_lower_bound",
        ),
        Rule(
            "every value counts toward the padding, repeats included",
            "repeated_values_with_lower_bound",
            "gcd_dedupes_values",
        ),
        Rule(
            "a bool, float or string value or lower bound is a ValueError",
            "rejects_non_integers",
            "gcd_accepts_non_ints",
        ),
    ),
    "check_packed_groups": (
        Rule(
            "a layer joins the first bucket it keeps uniform-type, buckets in registration "
            "order (DeepSeek V4's SWA groups come first)",
            "deepseek_v4_pro",
            "groups_mla_first",
        ),
        Rule(
            "approximate_gcd's lower bound is the largest balanced bucket mixing page sizes",
            "deepseek_v4_pro",
            "groups_no_lower_bound",
        ),
        Rule(
            "a balanced bucket becomes cdiv(tuples, d) groups",
            "deepseek_v4_pro",
            "groups_floor_split",
        ),
        Rule(
            "group i takes layer tuples i, i + n, i + 2n, ... (not a contiguous run)",
            "deepseek_v4_pro",
            "groups_contiguous",
        ),
        Rule(
            "a bucket whose page sizes have different counts stays one group and sets no "
            "lower bound",
            "unbalanced_bucket_stays_whole",
            "groups_split_unbalanced",
        ),
        Rule(
            "pages of one size are not a packed plan: None",
            "one_page_size_is_none",
            "groups_for_one_page_size",
        ),
        Rule(
            "with no mixed balanced bucket, window buckets are split to fit the widest block",
            "state_buckets_split_to_fit",
            "groups_no_state_split",
        ),
    ),
    "check_packed_layout": (
        Rule(
            "the block stride is the widest group, not the sum of the groups",
            "deepseek_v4_pro",
            "layout_stride_is_sum",
        ),
        Rule(
            "each group starts again at byte 0 (groups overlay)",
            "cross_layer_groups",
            "layout_no_overlay",
        ),
        Rule(
            "layers are packed by their padded page size",
            "deepseek_v4_pro",
            "layout_real_pages",
        ),
        Rule(
            "a group's layers are laid out spec by spec: one tensor per run of equal specs",
            "toy_runs_by_spec",
            "layout_group_order",
        ),
        Rule(
            "the stride is rounded up to a whole number of every layer's kernel pages",
            "kernel_block_alignment",
            "layout_ignores_alignment",
        ),
        Rule(
            "... a multiple of their least common multiple, not of the largest (kernel pages "
            "that do not divide each other)",
            "kernel_block_alignment",
            "stride_to_largest_alignment",
            planted=True,
        ),
        Rule(
            "num_blocks_override replaces the blocks the budget gives",
            "budget_and_override",
            "layout_ignores_override",
        ),
        Rule(
            "... even above what the budget holds: it is not capped (vLLM's "
            "num_gpu_blocks_override)",
            "budget_and_override",
            "override_capped_by_budget",
            planted=True,
        ),
        Rule(
            "a budget smaller than one block is a ValueError",
            "budget_and_override",
            "layout_zero_blocks",
        ),
        Rule(
            "no groups is a ValueError, not a 0-byte stride",
            "rejects_no_groups",
            "layout_empty_is_zero",
        ),
    ),
    "check_swa_indices": (
        Rule(
            "the window of position pos starts at pos - W + 1: W positions, its own the last",
            "window_reaches_back",
            "swa_window_off_by_one",
        ),
        Rule(
            "a padding token (is_valid_token false) gets an all -1 row and length 0",
            "padding_rows",
            "swa_ignores_padding",
        ),
        Rule(
            "the window never starts before position 0: length min(pos + 1, W)",
            "young_request_short_window",
            "swa_no_length_clamp",
        ),
    ),
}


# exercise 5, the hybrid allocator
GRADER_RULES["check_window_frees"] = (
    Rule(
        "a window of W tokens skips max(0, n - W + 1) tokens once n are computed: the next "
        "token reads back W - 1",
        "skipped_tokens",
        "skip_one_token_too_few",
    ),
    Rule(
        "... not one more (the block of the oldest token still read stays)",
        "skipped_tokens",
        "skip_one_token_too_many",
    ),
    Rule(
        "... and never a negative count (a window longer than the prefix skips nothing)",
        "skipped_tokens",
        "skip_without_floor",
    ),
    Rule(
        "only whole skipped blocks are freed (skipped tokens // block_size)",
        "whole_blocks_only",
        "frees_partly_skipped_block",
    ),
    Rule(
        "at most the table's blocks are freed, however far the window moved",
        "window_past_the_table",
        "no_cap_at_table",
    ),
    Rule(
        "the walk goes back from the last skipped block and stops at the first null block",
        "stop_at_first_null",
        "frees_the_null_block",
    ),
    Rule(
        "skipped blocks are freed last first (the earliest ends up at the queue's head)",
        "last_block_first",
        "frees_first_to_last",
    ),
    Rule(
        "each freed entry becomes the null block: the table keeps its shape",
        "last_block_first",
        "drops_freed_entries",
    ),
    Rule(
        "the freed blocks go back to the pool (BlockPool.free_blocks)",
        "last_block_first",
        "forgets_to_free",
    ),
)
GRADER_RULES["check_fixed_point_hit"] = (
    Rule(
        "full attention is looked up first: the uncached shared prefix is measured from its "
        "hit",
        "junction",
        "looks_up_in_group_order",
    ),
    Rule(
        "rounds repeat until the hit stops changing, so every group serves the agreed length",
        "rounds_until_stable",
        "stops_after_one_round",
    ),
    Rule(
        "full attention's blocks are trimmed to the agreed length",
        "junction",
        "untrimmed_full_attention",
    ),
    Rule(
        "the third value is how much longer the longest lookup was (it pins the junction)",
        "junction",
        "no_uncached_prefix",
    ),
    Rule(
        "no group is looked up past max_cache_hit_length (never the prompt's last token)",
        "never_the_last_token",
        "looks_up_whole_prompt",
    ),
)


def rules_table() -> str:
    """The rules as a Markdown table (grader, rule, scenario, wrong version), as the
    instructor guide shows it; a slip planted only in the tests is marked so."""
    lines = [
        "| grader | rule of the reference | scenario | broken variant |",
        "|---|---|---|---|",
    ]
    for grader, rules in GRADER_RULES.items():
        for rule in rules:
            variant = f"`{rule.variant}`" + (" (a planted slip)" if rule.planted else "")
            lines.append(f"| `{grader}` | {rule.rule} | `{rule.scenario}` | {variant} |")
    return "\n".join(lines)
