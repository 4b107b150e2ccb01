"""The graders: the reference passes, every broken variant fails, and a failure says where and
what."""

from __future__ import annotations

from functools import partial

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import grader as course
from grader.exercises import broken, reference_copies, reference_copies_v4
from grader.exercises.broken import BROKEN_VARIANTS, BrokenVariant
from grader.exercises.hybrid_checks import reference_kv_cache_config, reference_packed_groups
from grader.exercises.paged_checks import (
    random_manager_workload,
    scenario_prefix_cache_example,
)
from grader.exercises.paged_drivers import LockstepManagerDriver
from grader.lockstep.engine import Lockstep, first_difference, run_check
from refimpl.hybrid import deepseek_v4
from refimpl.hybrid.kv_cache_coordinator import HybridKVCacheCoordinator
from refimpl.hybrid.kv_cache_planning import (
    approximate_gcd,
    get_kv_cache_config,
    get_kv_cache_groups,
    get_packed_kv_cache_groups,
    padding_curve,
)
from refimpl.hybrid.single_type_kv_cache_manager import SlidingWindowManager
from refimpl.kernels.reference_v4 import compute_swa_indices_and_lens
from refimpl.paged import BlockManager, FreeBlockQueue, Scheduler

REFERENCE = {
    "check_block_manager": BlockManager,
    "check_prefix_cache": BlockManager,
    "check_scheduler": Scheduler,
    "check_approximate_gcd": approximate_gcd,
    "check_packed_groups": reference_packed_groups,
    "check_packed_layout": reference_kv_cache_config,
    "check_swa_indices": compute_swa_indices_and_lens,
}
# exercise 5, the hybrid allocator
REFERENCE["check_window_frees"] = SlidingWindowManager
REFERENCE["check_fixed_point_hit"] = HybridKVCacheCoordinator


@pytest.mark.parametrize("grader", sorted(REFERENCE))
def test_reference_passes_every_check(grader):
    report = getattr(course, grader)(REFERENCE[grader], verbose=False, allow_reference=True)
    assert report.passed, report.table()
    assert report.num_checks >= 6


def test_the_graders_copies_of_the_reference_pass_every_grader():
    """The variants are the grader's copies with one edit: each copy, unedited and recompiled
    (as `edited` does), behaves as the reference."""
    copies = {
        "check_scheduler": reference_copies.SchedulerCopy,
        "check_block_manager": reference_copies.BlockManagerCopy,
        "check_prefix_cache": reference_copies.BlockManagerCopy,
        "check_window_frees": reference_copies.SlidingWindowManagerCopy,
        "check_fixed_point_hit": reference_copies.HybridKVCacheCoordinatorCopy,
    }
    for grader, copy in copies.items():
        recompiled = type(
            "Same",
            (copy,),
            {
                name: broken.edited(value)
                for name, value in vars(copy).items()
                if callable(value)
            },
        )
        for implementation in (copy, recompiled):
            report = getattr(course, grader)(
                implementation, verbose=False, allow_reference=True
            )
            assert report.passed, (grader, report.table())
    report = course.check_swa_indices(
        reference_copies_v4.compute_swa_indices_and_lens, verbose=False, allow_reference=True
    )
    assert report.passed, report.table()


def test_an_edit_must_match_exactly_one_line():
    with pytest.raises(ValueError, match="has 0 lines 'no such line'"):
        broken.edited(reference_copies.SchedulerCopy.schedule, ("no such line", "pass"))
    with pytest.raises(ValueError, match="has 4 lines 'break'"):
        broken.edited(reference_copies.SchedulerCopy.schedule, ("break", "pass"))


def _relevant_pairs() -> list[tuple[BrokenVariant, str]]:
    return [(v, g) for v in BROKEN_VARIANTS for g in v.graders]


@pytest.mark.parametrize(
    "variant,grader", _relevant_pairs(), ids=lambda x: x if isinstance(x, str) else x.name
)
def test_every_grader_fails_every_relevant_broken_variant(variant, grader):
    # allow_reference: the variants reuse the reference for everything but their one mistake,
    # so the mistake itself (not the reuse) must be what fails.
    report = getattr(course, grader)(
        variant.implementation, verbose=False, allow_reference=True
    )
    assert not report.passed, f"{grader} did not notice: {variant.mistake}"
    for result in report.results:
        if not result.passed:
            assert result.divergence is not None and result.divergence.step >= 1


def test_required_mistakes_are_in_the_catalogue():
    names = {v.name for v in BROKEN_VARIANTS}
    required = {
        "free_in_forward_order",
        "no_stale_hash_guard",
        "look_up_last_block",
        "skip_token_double_check",
        "append_on_len_mod_0",
        "preempt_first_running",
        "in_use_hits_need_free_blocks",
    }
    assert required <= names
    assert any("check_approximate_gcd" in v.graders for v in BROKEN_VARIANTS)
    assert any("check_packed_layout" in v.graders for v in BROKEN_VARIANTS)
    assert any("check_packed_groups" in v.graders for v in BROKEN_VARIANTS)


def test_each_listed_mistake_is_caught_by_its_own_scenario():
    """The named scenario for each rule fails for the mistake that breaks that rule."""
    expected_failures = {
        (broken.FreeForwardOrder, "check_block_manager"): "free_last_block_first",
        (broken.AppendOnMultiple, "check_block_manager"): "append_at_block_boundary",
        (broken.NoStaleHashGuard, "check_prefix_cache"): "stale_hash_guard",
        (broken.LooksUpLastBlock, "check_prefix_cache"): "last_block_never_looked_up",
        (broken.NoTokenDoubleCheck, "check_prefix_cache"): "token_double_check",
        (
            broken.InUseHitsNeedFreeBlocks,
            "check_prefix_cache",
        ): "in_use_hits_need_no_free_block",
        (broken.FreeHitsCostNothing, "check_prefix_cache"): "free_hits_still_cost",
        (broken.KeepMatchingAfterMiss, "check_prefix_cache"): "first_miss_stops_matching",
        (broken.PreemptFirstRunning, "check_scheduler"): "preempt_last_running",
        (broken.ChunkAnyWaiting, "check_scheduler"): "chunked_prefill_first_only",
        (broken.DropInsteadOfSelfPreempt, "check_scheduler"): "preempt_self_when_alone",
        (broken.BudgetCountsCachedTokens, "check_scheduler"): "prefix_hit_shortens_prefill",
    }
    for (cls, grader), check_name in expected_failures.items():
        report = getattr(course, grader)(cls, verbose=False, allow_reference=True)
        assert check_name in report.failed_checks, (cls.__name__, report.table())


def test_failure_names_first_step_expected_and_found():
    report = course.check_block_manager(
        broken.FreeForwardOrder, verbose=False, allow_reference=True
    )
    row = next(r for r in report.results if r.name == "free_last_block_first")
    d = row.divergence
    assert (d.step, d.action, d.where) == (
        6,
        "deallocate(A: 12 tokens)",
        "free_block_ids (head first), first difference at index 3",
    )
    assert (d.expected, d.found) == ("[5, 6, 7, 2, 1, 0]", "[5, 6, 7, 0, 1, 2]")
    table = report.table()
    assert "FAIL  free_last_block_first" in table
    assert "first difference at step 6: deallocate(A: 12 tokens)" in table
    assert table.splitlines()[0] == "check_block_manager(FreeForwardOrder): 3/10 checks passed"


def test_return_value_difference_is_reported():
    report = course.check_prefix_cache(
        broken.LooksUpLastBlock, verbose=False, allow_reference=True
    )
    d = next(r for r in report.results if r.name == "last_block_never_looked_up").divergence
    assert d.action == "can_allocate(B: 8 tokens)" and d.where == "return value"
    assert (d.expected, d.found) == ("1", "2")


def test_tables_are_deterministic(capsys):
    course.check_scheduler(broken.PreemptFirstRunning, allow_reference=True)
    first = capsys.readouterr().out
    course.check_scheduler(broken.PreemptFirstRunning, allow_reference=True)
    assert capsys.readouterr().out == first
    assert "0x" not in first


def test_prefix_cache_example_reaches_the_writeup_picture():
    """block_size=4, 12 tokens: L0 -> in-use #1 (ref 2), L1 -> free #3, L2 -> #6, 8 cached
    tokens."""
    lockstep = Lockstep()
    scenario_prefix_cache_example(BlockManager, lockstep)
    world = lockstep.reference
    q = world.seqs["Q"]
    assert q.block_table == [1, 3, 6]
    assert q.num_cached_tokens == 8
    assert world.bm.blocks[1].ref_count == 2
    assert 3 not in world.bm.free_block_ids
    assert list(world.bm.free_block_ids) == [7, 8, 9, 4]


def test_stub_reports_not_implemented_cleanly():
    class BlockManagerStub:
        def __init__(self, num_blocks, block_size):
            self.blocks = []

        def can_allocate(self, seq):
            raise NotImplementedError(
                "Exercise 1: BlockManager.can_allocate is not written yet"
            )

    report = course.check_block_manager(BlockManagerStub, verbose=False)
    assert report.num_passed == 0
    row = report.results[0]
    assert row.divergence.where.startswith("state")  # free_block_ids is missing
    scheduler_report = course.check_scheduler(
        type("Empty", (), {"__init__": lambda self, c: None}), verbose=False
    )
    assert scheduler_report.num_passed == 0


def test_not_implemented_message_reaches_the_table():
    class Half(BlockManager):
        def allocate(self, seq, num_cached_blocks):
            raise NotImplementedError("Exercise 1: BlockManager.allocate is not written yet")

    report = course.check_block_manager(Half, verbose=False, allow_reference=True)
    d = report.results[0].divergence
    assert (
        d.found == "NotImplementedError: Exercise 1: BlockManager.allocate is not written yet"
    )
    assert d.action.startswith("allocate(")


# --- reusing the reference is not passing
def test_a_subclass_of_the_reference_fails_every_check():
    class BlockManagerCopy(BlockManager):  # "my" block manager: everything inherited
        pass

    report = course.check_block_manager(BlockManagerCopy, verbose=False)
    assert report.num_passed == 0
    d = report.results[0].divergence
    assert (d.step, d.where, d.expected) == (1, "the code that ran", "your own implementation")
    assert "refimpl.paged.block_manager.BlockManager.__init__" in d.found
    # The same class passes when the reference is allowed: the failure is the reuse, nothing
    # else.
    assert course.check_block_manager(
        BlockManagerCopy, verbose=False, allow_reference=True
    ).passed


def test_calling_the_reference_through_super_fails_the_step_that_does_it():
    """Exercise 2 inherits allocate/append/free from the reference, but matching must be the
    student's."""

    class Delegating(BlockManager):
        def can_allocate(self, seq):
            return super().can_allocate(seq)

    report = course.check_prefix_cache(Delegating, verbose=False)
    assert report.num_passed == 0
    d = report.results[0].divergence
    assert d.action == "can_allocate(F0: 4 tokens)" and d.step == 2
    assert "BlockManager.can_allocate" in d.found


def test_wrapping_a_reference_object_fails():
    class Wrapper:  # holds a reference Scheduler and forwards every attribute to it
        def __init__(self, config):
            self._inner = Scheduler(config)

        def __getattr__(self, name):
            return getattr(self._inner, name)

    report = course.check_scheduler(Wrapper, verbose=False)
    assert report.num_passed == 0
    # the whole Scheduler is the exercise: building the reference one is already its use
    assert report.results[0].divergence.action.startswith("Scheduler(SchedulerConfig(")
    assert "Scheduler.__init__" in report.results[0].divergence.found


def test_handing_in_the_reference_function_fails():

    gcd_report = course.check_approximate_gcd(approximate_gcd, verbose=False)
    assert (
        gcd_report.num_passed == 0
        and "kv_cache_planning.approximate_gcd" in gcd_report.results[0].divergence.found
    )

    # the reference's table, only the pick is "own"
    def from_the_padding_curve(values, lower_bound=None):
        curve = padding_curve(values, lower_bound)
        return min(curve, key=lambda d: (curve[d], -d))

    curve_report = course.check_approximate_gcd(from_the_padding_curve, verbose=False)
    assert (
        curve_report.num_passed == 0
        and "kv_cache_planning.padding_curve" in curve_report.results[0].divergence.found
    )

    # the reference's answer, reached through a public entry point
    groups_report = course.check_packed_groups(get_kv_cache_groups, verbose=False)
    assert groups_report.num_passed == 0
    assert (
        "kv_cache_planning.get_packed_kv_cache_groups"
        in groups_report.results[0].divergence.found
    )

    def own_loop_reference_stride(groups, available_memory, num_blocks_override=None):
        from refimpl.hybrid.kv_cache_planning import get_kv_cache_bytes_per_block

        stride = get_kv_cache_bytes_per_block(groups)
        return get_kv_cache_config(groups, max(available_memory, stride), num_blocks_override)

    layout_report = course.check_packed_layout(own_loop_reference_stride, verbose=False)
    assert layout_report.num_passed == 0
    assert (
        "kv_cache_planning.get_kv_cache_bytes_per_block"
        in layout_report.results[0].divergence.found
    )


def test_first_difference_shows_only_differing_hash_entries():
    expected = [("hash_to_block_id", {1: 10, 2: 20, 3: 30})]
    found = [("hash_to_block_id", {1: 10, 2: 20})]
    where, want, got = first_difference(expected, found)
    assert where == "hash_to_block_id"
    assert want == "3 entries; 2 shared, then {3: 30}"
    assert got == "2 entries; 2 shared, then {}"


def test_student_state_fields_are_read_through_the_public_names():
    """A student's manager is compared field by field; a missing attribute is a clear
    failure."""
    lockstep = Lockstep()

    class NoUsedSet(BlockManager):
        def __init__(self, num_blocks, block_size):
            super().__init__(num_blocks, block_size)
            del self.used_block_ids

    from grader.lockstep.engine import Diverged

    with pytest.raises(Diverged) as info:
        LockstepManagerDriver(lockstep, NoUsedSet, 4, 4, prefix_cache=False)
    assert "AttributeError" in info.value.divergence.found


def test_state_that_cannot_be_compared_is_a_clear_failure():
    class Ambiguous:  # like a numpy array: `==` gives something with no single truth value
        def __eq__(self, other):
            return self

        def __bool__(self):
            raise ValueError("the truth value of an array is ambiguous")

    class ArrayRefCount(BlockManager):
        def __init__(self, num_blocks, block_size):
            super().__init__(num_blocks, block_size, enable_prefix_caching=False)
            self.blocks[0].ref_count = Ambiguous()

    report = course.check_block_manager(ArrayRefCount, verbose=False, allow_reference=True)
    d = report.results[0].divergence
    assert d.step == 1 and d.where == "state (comparing your object's fields)"
    assert d.found == "ValueError: the truth value of an array is ambiguous"


def test_gcd_grader_expects_value_error_for_bad_input():
    def lenient(values, lower_bound=None):  # right on good input, returns 1 instead of raising
        values = list(values)
        return approximate_gcd(values, lower_bound) if values and min(values) > 0 else 1

    report = course.check_approximate_gcd(lenient, verbose=False, allow_reference=True)
    # min(["4"]) raises TypeError
    assert report.failed_checks == ["rejects_bad_input", "rejects_non_integers"]
    d = next(r for r in report.results if r.name == "rejects_bad_input").divergence
    assert d.action == "approximate_gcd([], lower_bound=None)"
    assert d.expected.startswith("raises ValueError") and d.found == "returns 1"


# --- the lockstep machinery itself


def _corrupt(manager, seq, kind: str) -> bool:
    """Change one observable thing; False when this kind cannot apply to the current state."""
    if kind == "ref_count":
        manager.blocks[seq.block_table[0]].ref_count += 1
    elif kind == "free_order":
        ids = list(manager.free_block_ids)
        if len(ids) < 2:
            return False
        manager.free_block_ids = FreeBlockQueue([ids[1], ids[0], *ids[2:]])
    elif kind == "hash_entry":
        manager.hash_to_block_id[12345] = seq.block_table[0]
    elif kind == "block_table":
        seq.block_table.reverse()
        if len(seq.block_table) < 2:
            return False
    return True


@given(
    seed=st.integers(0, 2),
    k=st.integers(1, 6),
    kind=st.sampled_from(["ref_count", "free_order", "hash_entry", "block_table"]),
)
def test_any_state_change_is_reported_at_the_step_that_made_it(seed, k, kind):
    """Lockstep property: a single wrong field after the k-th allocate is caught at exactly
    that call."""
    calls = {"allocate": 0, "corrupted_at": None}

    class Corrupting(BlockManager):
        def allocate(self, seq, num_cached_blocks):
            super().allocate(seq, num_cached_blocks)
            calls["allocate"] += 1
            if calls["allocate"] == k:
                calls["corrupted_at"] = _corrupt(self, seq, kind)

    result = run_check("probe", "", partial(random_manager_workload, Corrupting, True, seed))
    assume(calls["corrupted_at"] is True)
    assert not result.passed
    assert result.divergence.action.startswith("allocate("), result.divergence


# ---------------------------------------------------------------------- every rule has a
# scenario and a variant
from grader.exercises.rules import GRADER_RULES, rules_table  # noqa: E402

VARIANTS = {v.name: v for v in BROKEN_VARIANTS}
# rules whose wrong version is a slip planted by tests/test_exercise_rules.py are tested there
RULES = [
    (grader, rule)
    for grader, rules in GRADER_RULES.items()
    for rule in rules
    if not rule.planted
]


def test_every_grader_has_rules_and_every_variant_breaks_a_rule():
    assert set(GRADER_RULES) == set(REFERENCE)
    named = {rule.variant for _, rule in RULES}
    assert named <= set(VARIANTS)
    assert set(VARIANTS) <= named, f"variants with no rule: {sorted(set(VARIANTS) - named)}"


@pytest.mark.parametrize(
    "grader,rule", RULES, ids=lambda x: x if isinstance(x, str) else x.variant
)
def test_the_scenario_of_each_rule_fails_when_the_rule_is_broken(grader, rule):
    variant = VARIANTS[rule.variant]
    assert grader in variant.graders
    report = getattr(course, grader)(
        variant.implementation, verbose=False, allow_reference=True
    )
    assert rule.scenario in [r.name for r in report.results], (
        f"{grader} has no scenario {rule.scenario}"
    )
    assert rule.scenario in report.failed_checks, (rule.rule, report.table())


def test_instructor_guide_lists_the_rules():
    from pathlib import Path

    guide = (
        Path(__file__).resolve().parents[1] / "notebooks" / "exercises" / "README.md"
    ).read_text()
    assert rules_table() in guide, (
        "update the rules table in notebooks/exercises/README.md from "
        "grader.exercises.rules.rules_table()"
    )
    for variant in BROKEN_VARIANTS:
        assert f"`{variant.implementation.__name__}`" in guide, (
            f"{variant.implementation.__name__} is missing from the guide's variant table"
        )


# ---------------------------------------------------------------------- realistic mistakes the
# scenarios must catch
def test_a_real_collision_reaches_both_worlds_and_is_undone():
    from grader.exercises.paged_worlds import colliding_hashes
    from refimpl.paged import compute_hash

    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    before = compute_hash(a)
    with colliding_hashes([(a, b)]):
        assert compute_hash(a) == compute_hash(b) == BlockManager.compute_hash(b)
        assert compute_hash(b, 7) != compute_hash(a, 7)  # only the listed first blocks collide
    assert compute_hash(a) == before != compute_hash(b)


def test_block_size_1_catches_nano_vllms_literal_append_test():
    report = course.check_block_manager(
        broken.AppendWhenLenModIsOne, verbose=False, allow_reference=True
    )
    d = next(r for r in report.results if r.name == "block_size_1").divergence
    assert d.action.startswith("may_append(A: 3 tokens)")
    assert d.where == "free_block_ids (head first), first difference at index 0" and (
        d.expected,
        d.found,
    ) == (
        "[3, 4, 5]",
        "[2, 3, 4, 5]",
    )


def test_waiting_head_scenario_names_the_jumped_queue():
    report = course.check_scheduler(
        broken.SkipBlockedWaitingHead, verbose=False, allow_reference=True
    )
    d = next(r for r in report.results if r.name == "waiting_head_does_not_fit").divergence
    assert d.action == "schedule()" and d.where == "return value, first difference at [0][0]"
    assert (d.expected, d.found) == ("(['A'], False)", "(['C'], True)")


def test_gcd_grader_rejects_bools_and_needs_every_repeat():
    report = course.check_approximate_gcd(
        broken.approximate_gcd_accepts_non_ints, verbose=False, allow_reference=True
    )
    assert report.failed_checks == ["rejects_non_integers"]
    d = next(r for r in report.results if r.name == "rejects_non_integers").divergence
    assert d.action == "approximate_gcd([True], lower_bound=None)" and d.found == "returns 1"
    report = course.check_approximate_gcd(
        broken.approximate_gcd_dedupes_values, verbose=False, allow_reference=True
    )
    d = next(
        r for r in report.results if r.name == "repeated_values_with_lower_bound"
    ).divergence
    assert d.action == "approximate_gcd([2, 2, 3], lower_bound=2)" and (
        d.expected,
        d.found,
    ) == ("2", "3")


def test_layout_grader_rejects_zero_byte_stride_for_no_groups():
    report = course.check_packed_layout(
        broken.packed_layout_empty_is_zero, verbose=False, allow_reference=True
    )
    assert report.failed_checks == ["rejects_no_groups"]
    d = next(r for r in report.results if r.name == "rejects_no_groups").divergence
    assert d.expected.startswith("raises ValueError") and d.found.startswith(
        "returns {'class': 'KVCacheConfig', 'num_blocks': 0"
    )


def test_groups_grader_names_the_first_differing_group():
    """The article's bucket order puts the MLA group first: the table says which group's
    layers differ, with both lists."""
    report = course.check_packed_groups(
        broken.packed_groups_mla_first, verbose=False, allow_reference=True
    )
    d = next(r for r in report.results if r.name == "deepseek_v4_pro").divergence
    assert d.where == "groups[0].layer_names, first difference at index 0"
    assert d.expected.startswith(
        "items 0-3 of 31: ['layers.0.swa_cache', 'layers.2.swa_cache'"
    )
    assert d.found.startswith("items 0-3 of 91: ['layers.0.attn', 'layers.1.attn'")


def test_broken_copies_with_no_mistake_switched_on_are_the_reference():
    """The switchable copies in grader.exercises.broken equal vLLM's planner with every switch off, so
    each variant differs from the reference by its one mistake only."""
    for variant in ("pro", "flash"):
        specs = deepseek_v4.kv_cache_specs(variant)
        assert broken._packed_groups(specs) == get_packed_kv_cache_groups(specs)
        groups = get_packed_kv_cache_groups(specs)
        assert broken._kv_cache_config(groups, 2**30) == get_kv_cache_config(groups, 2**30)


# ---------------------------------------------------------------------- time limit per
# scenario
class LoopingScheduler(Scheduler):
    """Self-preemption written as a loop that never ends: `seq` is never taken off the loop."""

    def schedule(self):
        if self.waiting:
            return super().schedule()
        batch = []
        while self.running:
            seq = self.running[0]
            while not self.block_manager.can_append(seq):
                if len(self.running) > 1:
                    self.preempt(self.running.pop())
                # alone: forgot to preempt `seq` itself, so this loops forever
            seq = self.running.popleft()
            seq.num_scheduled_tokens = 1
            seq.is_prefill = False
            self.block_manager.may_append(seq)
            batch.append(seq)
        self.running.extendleft(reversed(batch))
        return batch, False


def test_an_endless_loop_fails_its_scenario_with_a_message_and_grading_goes_on():
    import time

    started = time.monotonic()
    report = course.check_scheduler(
        LoopingScheduler, verbose=False, allow_reference=True, time_limit=0.5
    )
    elapsed = time.monotonic() - started
    row = next(r for r in report.results if r.name == "preempt_self_when_alone")
    assert not row.passed
    d = row.divergence
    assert d.where == "time limit" and d.action == "schedule()"
    assert (
        d.found
        == "scenario preempt_self_when_alone did not finish within 0.5 s and was stopped (an endless loop?)"
    )
    # the other scenarios were still graded
    assert "prefill_then_decode" not in report.failed_checks
    assert elapsed < 0.5 * len(report.results) + 5
    assert "did not finish within 0.5 s" in report.table()


def test_time_limit_works_off_the_main_thread_and_for_functions():
    import threading

    def endless(values, lower_bound=None):
        while True:
            pass

    results = {}
    thread = threading.Thread(
        target=lambda: results.update(
            report=course.check_approximate_gcd(
                endless, verbose=False, allow_reference=True, time_limit=0.2
            )
        )
    )
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    report = results["report"]
    assert report.num_passed == 0
    d = report.results[0].divergence
    assert d.where == "time limit" and d.action == "approximate_gcd([4, 6], lower_bound=1)"
    assert "scenario worked_examples did not finish within 0.2 s" in d.found


def test_time_limit_restores_an_outer_alarm_and_rejects_bad_values():
    import signal

    from grader.lockstep.time_limit import scenario_time_limit

    previous = signal.signal(signal.SIGALRM, lambda *a: None)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        with scenario_time_limit(1.0) as limit:
            assert limit.enforced and limit.mechanism == "alarm"
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25 < left <= 30  # the outer timer is running again with what it had left
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    for bad in (0, -1, True, "5", float("inf")):
        with pytest.raises(ValueError, match="time_limit"):
            course.check_block_manager(
                BlockManager, verbose=False, allow_reference=True, time_limit=bad
            )
    assert course.check_block_manager(
        BlockManager, verbose=False, allow_reference=True, time_limit=None
    ).passed


def test_a_limit_for_code_in_another_process_is_a_deadline_and_sets_no_alarm():
    import signal
    import time

    from grader.lockstep.time_limit import (
        ScenarioTimeout,
        scenario_deadline,
        scenario_expired,
        scenario_time_limit,
    )

    assert scenario_deadline() is None
    before = time.monotonic()
    with scenario_time_limit(0.5, student_in_this_process=False) as limit:
        assert limit.enforced and limit.mechanism == "deadline"
        assert before + 0.5 <= scenario_deadline() <= time.monotonic() + 0.5
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        with scenario_time_limit(None, student_in_this_process=False):
            assert scenario_deadline() is not None  # no limit inside keeps the outer one
        expired = scenario_expired()
    assert isinstance(expired, ScenarioTimeout) and limit.fired
    assert "did not finish within 0.5 s" in str(expired)
    assert scenario_deadline() is None
    with pytest.raises(RuntimeError, match="no scenario deadline"):
        scenario_expired()


def test_after_the_watchdog_stopped_a_loop_the_thread_still_runs_normally():
    """Regression: clearing a pending timeout with PyThreadState_SetAsyncExc(id, NULL) left
    CPython's eval breaker set, and the next grader in that thread spun forever on one
    instruction."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import grader as course
        import grader.lockstep.time_limit as time_limit
        from grader.sandbox.grading_child import missing
        time_limit._can_use_alarm = lambda: False  # force the watchdog, as on Windows or in a thread
        def endless(values, lower_bound=None):
            while True:
                pass
        first = course.check_approximate_gcd(endless, verbose=False, allow_reference=True, time_limit=0.2)
        second = course.check_block_manager(missing("BlockManager", "gone"), verbose=False)
        print(first.num_passed, second.num_checks)
    """)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "10"]
