"""Every rule of an exercise has a realistic wrong version that its grader fails.

Each wrong version is a student's slip planted in the exercise's own solution notebook: one or
two lines of its solution cells changed as a student might get them wrong (a `<` for a `<=`, a
`max` for an `lcm`, a missing `reversed`). The setup and solution cells then run here, as
`check_*` in the notebook runs them, and the rule's scenario (`grader.exercises.rules.GRADER_RULES`)
must fail, so the score is below full. The unchanged solution passes every row, so the
failure is the slip's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import nbformat
import pytest

import grader as course
from grader.exercises.catalogue import EXERCISES
from grader.exercises.rules import GRADER_RULES
from grader.grading import notebook_program

SOLUTIONS = Path(__file__).resolve().parents[1] / "notebooks" / "exercises" / "solutions"


@dataclass(frozen=True)
class Slip:
    """A wrong version of an exercise: `edits` (old text, new text) applied to its solution
    cells. `name` is the rule's wrong version in `GRADER_RULES` (a broken variant's name, or a
    slip planted only here)."""

    exercise: str
    grader: str
    name: str
    edits: tuple[tuple[str, str], ...]


def slip(exercise: str, grader: str, name: str, *edits: tuple[str, str]) -> Slip:
    return Slip(exercise, grader, name, edits)


E1, E2, E3 = "01_block_manager", "02_prefix_cache", "03_scheduler"
E4, E5, E6 = "04_packed_layout", "05_hybrid_allocator", "06_slot_addressing"
PREFIX, SCHEDULER = "check_prefix_cache", "check_scheduler"
WINDOW, HIT = "check_window_frees", "check_fixed_point_hit"
LAYOUT, GCD, GROUPS = "check_packed_layout", "check_approximate_gcd", "check_packed_groups"
LCM = "math.lcm(*(s.block_stride_alignment() for s in specs))"
OVERRIDE = "        num_blocks = num_blocks_override\n"
IN_USE = (
    "            if block_id in self.used_block_ids:\n                num_new_blocks -= 1\n"
)
STALE_GUARD = (
    "        if block.hash != -1 and self.hash_to_block_id.get(block.hash) == block_id:\n"
    "            del self.hash_to_block_id[block.hash]\n"
)
SKIPPED = "num_computed_tokens - self.sliding_window + 1)"

SLIPS = (
    # exercise 1: the block manager
    slip(E1, "check_block_manager", "allocate_from_tail", ("popleft()", "pop()")),
    slip(
        E1,
        "check_block_manager",
        "can_allocate_strict",
        (
            "len(self.free_block_ids) >= seq.num_blocks",
            "len(self.free_block_ids) > seq.num_blocks",
        ),
    ),
    slip(
        E1,
        "check_block_manager",
        "free_in_forward_order",
        ("reversed(seq.block_table)", "seq.block_table"),
    ),
    slip(
        E1,
        "check_block_manager",
        "append_on_len_mod_0",
        ("(len(seq) - 1) % self.block_size == 0", "len(seq) % self.block_size == 0"),
    ),
    slip(  # nano-vllm's literal test
        E1,
        "check_block_manager",
        "append_on_len_mod_1",
        ("(len(seq) - 1) % self.block_size == 0", "len(seq) % self.block_size == 1"),
    ),
    slip(
        E1,
        "check_block_manager",
        "can_append_needs_a_free_block",
        (
            "return len(self.free_block_ids) >= ((len(seq) - 1) % self.block_size == 0)",
            "return len(self.free_block_ids) > 0",
        ),
    ),
    # exercise 2: the prefix cache
    slip(
        E2,
        PREFIX,
        "hash_without_chain",
        ("compute_hash(token_ids, h)", "compute_hash(token_ids)"),
        ("compute_hash(seq.block(i), h)", "compute_hash(seq.block(i))"),
    ),
    slip(
        E2,
        PREFIX,
        "registers_partial_block",
        (
            "(seq.num_cached_tokens + seq.num_scheduled_tokens) // self.block_size",
            "(seq.num_cached_tokens + seq.num_scheduled_tokens + self.block_size - 1)"
            " // self.block_size",
        ),
    ),
    slip(
        E2,
        PREFIX,
        "look_up_last_block",
        ("for i in range(seq.num_blocks - 1):", "for i in range(seq.num_blocks):"),
    ),
    slip(
        E2,
        PREFIX,
        "skip_token_double_check",
        (
            "if block_id == -1 or self.blocks[block_id].token_ids != token_ids:",
            "if block_id == -1:",
        ),
    ),
    slip(
        E2,
        PREFIX,
        "confirm_hit_by_hash",
        (
            "if block_id == -1 or self.blocks[block_id].token_ids != token_ids:",
            "if block_id == -1 or self.blocks[block_id].hash != h:",
        ),
    ),
    slip(
        E2,
        PREFIX,
        "keep_matching_after_miss",
        (
            "                break\n            num_cached_blocks += 1",
            "                continue\n            num_cached_blocks += 1",
        ),
    ),
    slip(
        E2,
        PREFIX,
        "in_use_hits_need_free_blocks",
        (IN_USE, ""),
    ),
    slip(
        E2,
        PREFIX,
        "free_hits_cost_nothing",
        (IN_USE, "            num_new_blocks -= 1\n"),
    ),
    slip(E2, PREFIX, "hit_resets_ref_count", ("block.ref_count += 1", "block.ref_count = 1")),
    slip(E2, PREFIX, "keeps_reused_block_entry", (STALE_GUARD, "")),
    slip(
        E2,
        PREFIX,
        "no_stale_hash_guard",
        (
            "self.hash_to_block_id.get(block.hash) == block_id:",
            "block.hash in self.hash_to_block_id:",
        ),
    ),
    # exercise 3: the scheduler
    slip(
        E3,
        SCHEDULER,
        "chunk_any_waiting",
        (
            "                if (\n"
            "                    remaining < seq.num_tokens - num_cached_blocks * self.block_size\n"
            "                    and scheduled_seqs\n"
            "                ):\n"
            "                    break\n",
            "",
        ),
        (
            "            if remaining < num_tokens and scheduled_seqs:\n                break\n",
            "",
        ),
    ),
    slip(
        E3,
        SCHEDULER,
        "keep_token_after_chunk",
        (
            "            if is_prefill and seq.num_cached_tokens < seq.num_tokens:\n"
            "                continue\n",
            "",
        ),
    ),
    slip(
        E3,
        SCHEDULER,
        "budget_counts_cached_tokens",
        (
            "remaining < seq.num_tokens - num_cached_blocks * self.block_size",
            "remaining < seq.num_tokens",
        ),
    ),
    slip(
        E3,
        SCHEDULER,
        "one_seq_too_many",
        (
            "len(scheduled_seqs) < self.max_num_seqs",
            "len(scheduled_seqs) <= self.max_num_seqs",
        ),
    ),
    slip(
        E3,
        SCHEDULER,
        "batch_to_back_of_running",
        (
            "self.running.extendleft(reversed(scheduled_seqs))",
            "self.running.extend(scheduled_seqs)",
        ),
    ),
    slip(
        E3,
        SCHEDULER,
        "preempt_first_running",
        ("self.preempt(self.running.pop())", "self.preempt(self.running.popleft())"),
    ),
    slip(
        E3,
        SCHEDULER,
        "preempt_to_back",
        ("self.waiting.appendleft(seq)", "self.waiting.append(seq)"),
    ),
    slip(
        E3, SCHEDULER, "keep_decode_flag_on_preempt", ("        seq.is_prefill = True\n", "")
    ),
    slip(
        E3,
        SCHEDULER,
        "drop_instead_of_self_preempt",
        (
            "                    self.preempt(seq)\n                    break",
            "                    break",
        ),
    ),
    slip(
        E3,
        SCHEDULER,
        "register_after_commit",
        (
            "            self.block_manager.hash_blocks(seq)\n"
            "            seq.num_cached_tokens += seq.num_scheduled_tokens\n",
            "            seq.num_cached_tokens += seq.num_scheduled_tokens\n"
            "            self.block_manager.hash_blocks(seq)\n",
        ),
    ),
    slip(
        E3,
        SCHEDULER,
        "eos_despite_ignore_eos",
        ("not seq.ignore_eos and token_id == self.eos", "token_id == self.eos"),
    ),
    # exercise 4: approximate_gcd
    slip(E4, GCD, "gcd_smaller_wins_ties", ("pad <= best_pad", "pad < best_pad")),
    slip(E4, GCD, "gcd_ignores_lower_bound", ("lo = max(1, lower_bound or 1)", "lo = 1")),
    slip(E4, GCD, "gcd_exclusive_max", ("range(lo, hi + 1)", "range(lo, hi)")),
    slip(
        E4,
        GCD,
        "gcd_clamps_to_max",
        ("    if lo > hi:\n        return lo", "    if lo > hi:\n        return hi"),
    ),
    slip(
        E4,
        GCD,
        "gcd_trusts_lower_bound",
        ("lo = max(1, lower_bound or 1)", "lo = lower_bound or 1"),
    ),
    slip(
        E4,
        GCD,
        "gcd_dedupes_values",
        ("values = list(values)", "values = sorted(set(values))"),
    ),
    slip(
        E4,
        GCD,
        "gcd_accepts_non_ints",
        ("if isinstance(x, bool) or not isinstance(x, int) or x <= 0:", "if x <= 0:"),
        (
            "        isinstance(lower_bound, bool) or not isinstance(lower_bound, int)\n",
            "        False\n",
        ),
    ),
    # exercise 4: the packed groups
    slip(
        E4,
        GROUPS,
        "groups_no_lower_bound",
        ("lower_bound=max(mixed)", "lower_bound=None"),
    ),
    slip(
        E4,
        GROUPS,
        "groups_floor_split",
        (
            "return cdiv(merged.get_num_layer_tuples(), repeats)",
            "return merged.get_num_layer_tuples() // repeats",
        ),
    ),
    slip(
        E4,
        GROUPS,
        "groups_contiguous",
        (
            "tuples[i::n]",
            "tuples[i * cdiv(len(tuples), n) : (i + 1) * cdiv(len(tuples), n)]",
        ),
    ),
    slip(
        E4,
        GROUPS,
        "groups_split_unbalanced",
        ("balanced = len({len(names) for names in by_page.values()}) == 1", "balanced = True"),
    ),
    slip(
        E4,
        GROUPS,
        "groups_for_one_page_size",
        ("for spec in specs.values()}) <= 1:", "for spec in specs.values()}) < 1:"),
    ),
    slip(
        E4,
        GROUPS,
        "groups_no_state_split",
        ("            n = max(n, cdiv(len(merged.kv_cache_specs), per_block))\n", ""),
    ),
    # exercise 4: the packed layout
    slip(
        E4,
        LAYOUT,
        "layout_stride_is_sum",
        (
            "widest = max(sum(g.page_size_of(n) for n in g.layer_names) for g in groups)",
            "widest = sum(sum(g.page_size_of(n) for n in g.layer_names) for g in groups)",
        ),
    ),
    slip(
        E4,
        LAYOUT,
        "layout_no_overlay",
        ("        offset = 0  # every group starts at byte 0 of a block\n", ""),
        ("    tensors = []\n", "    tensors = []\n    offset = 0\n"),
    ),
    slip(
        E4,
        LAYOUT,
        "layout_real_pages",
        ("g.page_size_of(n)", "g.layer_spec(n).real_page_size_bytes"),
        ("layer_stride=spec.page_size_bytes", "layer_stride=spec.real_page_size_bytes"),
        ("len(names) * spec.page_size_bytes", "len(names) * spec.real_page_size_bytes"),
    ),
    slip(E4, LAYOUT, "layout_ignores_alignment", (f"round_up(widest, {LCM})", "widest")),
    slip(
        E4,
        LAYOUT,
        "stride_to_largest_alignment",
        (LCM, "max(s.block_stride_alignment() for s in specs)"),
    ),
    slip(
        E4,
        LAYOUT,
        "layout_ignores_override",
        (OVERRIDE, "        num_blocks = available_memory // block_stride\n"),
    ),
    slip(
        E4,
        LAYOUT,
        "override_capped_by_budget",
        (
            OVERRIDE,
            "        num_blocks = min(num_blocks_override, available_memory // block_stride)\n",
        ),
    ),
    slip(E4, LAYOUT, "layout_zero_blocks", ("if num_blocks < 1:", "if num_blocks < 0:")),
    slip(
        E4,
        LAYOUT,
        "layout_empty_is_zero",
        (
            '    if not groups:\n        raise ValueError("no groups: there is no cache to lay out")\n',
            "",
        ),
        (
            "widest = max(sum(g.page_size_of(n) for n in g.layer_names) for g in groups)",
            "widest = max([sum(g.page_size_of(n) for n in g.layer_names) for g in groups] or [0])",
        ),
    ),
    # exercise 5: the window's frees
    slip(
        E5,
        WINDOW,
        "skip_one_token_too_few",
        (SKIPPED, "num_computed_tokens - self.sliding_window)"),
    ),
    slip(
        E5,
        WINDOW,
        "skip_one_token_too_many",
        (SKIPPED, "num_computed_tokens - self.sliding_window + 2)"),
    ),
    slip(
        E5,
        WINDOW,
        "skip_without_floor",
        (
            "max(0, num_computed_tokens - self.sliding_window + 1)",
            "num_computed_tokens - self.sliding_window + 1",
        ),
    ),
    slip(
        E5,
        WINDOW,
        "frees_partly_skipped_block",
        (
            "self.get_num_skipped_tokens(total_computed_tokens) // self.block_size",
            "cdiv(self.get_num_skipped_tokens(total_computed_tokens), self.block_size)",
        ),
    ),
    slip(
        E5,
        WINDOW,
        "no_cap_at_table",
        ("range(min(skipped, len(table)) - 1, -1, -1)", "range(skipped - 1, -1, -1)"),
    ),
    slip(
        E5,
        WINDOW,
        "frees_the_null_block",
        ("            if table[i].is_null:\n                break\n", ""),
    ),
    slip(
        E5,
        WINDOW,
        "frees_first_to_last",
        ("self.block_pool.free_blocks(removed)", "self.block_pool.free_blocks(removed[::-1])"),
    ),
    slip(
        E5,
        WINDOW,
        "drops_freed_entries",
        ("            table[i] = self.block_pool.null_block\n", "            del table[i]\n"),
    ),
    slip(
        E5, WINDOW, "forgets_to_free", ("        self.block_pool.free_blocks(removed)\n", "")
    ),
    # exercise 5: the fixed-point hit
    slip(
        E5,
        HIT,
        "looks_up_in_group_order",
        ("in self.attention_groups:", "in reversed(self.attention_groups):"),
    ),
    slip(
        E5,
        HIT,
        "stops_after_one_round",
        ("            if hit_length == start:\n                break", "            break"),
    ),
    slip(E5, HIT, "no_uncached_prefix", ("longest - hit_length", "0")),
    slip(
        E5,
        HIT,
        "looks_up_whole_prompt",
        (
            "hit_length = max_cache_hit_length\n",
            "hit_length = len(block_hashes) * self.hash_block_size\n",
        ),
    ),
    # exercise 6: slot addressing
    slip(
        E6,
        "check_swa_indices",
        "swa_window_off_by_one",
        ("pos - window_size + 1, min=0", "pos - window_size, min=0"),
    ),
    slip(
        E6,
        "check_swa_indices",
        "swa_ignores_padding",
        ("lens = torch.where(valid, pos - first + 1, 0)", "lens = pos - first + 1"),
    ),
    slip(
        E6,
        "check_swa_indices",
        "swa_no_length_clamp",
        ("torch.clamp(pos - window_size + 1, min=0)", "(pos - window_size + 1)"),
    ),
)


@cache
def _program(exercise: str) -> str:
    notebook = nbformat.read(SOLUTIONS / f"{exercise}.ipynb", as_version=4)
    return "\n\n".join(source for _, source in notebook_program(notebook))


def _grade(exercise: str, grader: str, edits: tuple[tuple[str, str], ...] = ()):
    """The grader's report on the exercise's solution cells with `edits` applied (each old
    text must be there)."""
    program = _program(exercise)
    for old, new in edits:
        assert old in program, f"{old!r} is not in {exercise}'s solution"
        program = program.replace(old, new)
    namespace: dict = {"__name__": f"planted_{exercise}"}
    exec(compile(program, f"<{exercise} with a slip>", "exec"), namespace)
    target = dict(EXERCISES[exercise].checks)[grader]
    return getattr(course, grader)(namespace[target], verbose=False)


RULES = {(g, rule.variant): rule for g, rules in GRADER_RULES.items() for rule in rules}


def test_every_rule_planted_only_here_has_its_slip():
    slips = {(s.grader, s.name) for s in SLIPS}
    assert {key for key, rule in RULES.items() if rule.planted} <= slips
    assert slips <= set(RULES), "a slip names no rule"


@pytest.mark.slow  # 11 s: the solutions' grading (test_course_notebooks grades them too)
@pytest.mark.parametrize("exercise", sorted({s.exercise for s in SLIPS}))
def test_the_unchanged_solutions_pass_every_row(exercise):
    for grader, _ in EXERCISES[exercise].checks:
        report = _grade(exercise, grader)
        assert report.passed, report.table()


@pytest.mark.parametrize("planted", SLIPS, ids=lambda s: s.name)
def test_each_rules_wrong_version_fails_its_scenario(planted):
    rule = RULES[planted.grader, planted.name]
    report = _grade(planted.exercise, planted.grader, planted.edits)
    assert report.num_passed < report.num_checks
    assert rule.scenario in report.failed_checks, (rule.rule, report.table())
