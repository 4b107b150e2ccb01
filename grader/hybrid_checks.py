"""Graders for the Part II exercise: `approximate_gcd` and the packed layout of DeepSeek V4
groups.

Both are pure functions, so a "step" is one call: the student's answer is compared with
`refimpl.hybrid` on worked examples, on every DeepSeek V4 configuration, and on seeded random
inputs; the first call whose answer differs is reported.

The rules checked (each with its check and a broken variant in `grader.rules`):
`approximate_gcd` searches d from max(1, lower_bound) (0, negative or None meaning 1) to
max(values) inclusive, returns a lower bound above every value as is, counts every value's
padding (repeats included), breaks ties toward the larger d, and rejects no values, values <= 0
and anything not an int (bools, floats, strings) as values or lower bound with a ValueError;
`get_packed_kv_cache_layout` overlays groups from byte 0, packs each group's layers in its
order by padded page size, lists every layer starting at an offset, takes the widest group as
the stride, and rejects no groups with a ValueError. Every check runs under a time limit.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import cache
from typing import Any

from grader.lockstep import (
    Call,
    LocalStudent,
    StudentFailure,
    StudentRaised,
    StudentSide,
    WorldSpec,
    describe_exception,
    render,
    timeout_divergence,
)
from grader.reference_code import grading_side
from grader.report import CheckResult, Divergence, GradeReport
from grader.time_limit import (
    DEFAULT_TIME_LIMIT,
    ScenarioTimeout,
    check_time_limit,
    limit_is_enforceable,
    scenario_time_limit,
)
from refimpl.hybrid.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from refimpl.hybrid.kv_cache_planning import approximate_gcd as reference_approximate_gcd
from refimpl.hybrid.older_planners import get_kv_cache_groups_b
from refimpl.hybrid.older_planners import get_packed_kv_cache_layout as reference_packed_layout

Case = tuple[str, tuple]  # (label shown in the table, arguments)
Compare = Callable[[Any, Any], "tuple[str, str, str] | None"]


def _run_cases(
    name: str,
    description: str,
    reference: Callable,
    side: StudentSide,
    cases: list[Case],
    compare: Compare,
    time_limit: float | None = None,
) -> CheckResult:
    """Call both functions case by case; the whole check is stopped after `time_limit`
    seconds."""
    progress = {"step": 0, "label": "(before the first call)"}
    try:
        with scenario_time_limit(time_limit):
            return _compare_cases(name, description, reference, side, cases, compare, progress)
    except ScenarioTimeout:
        return CheckResult(
            name,
            description,
            False,
            progress["step"],
            timeout_divergence(name, progress["step"], progress["label"], time_limit),
        )


def _compare_cases(
    name: str,
    description: str,
    reference: Callable,
    side: StudentSide,
    cases: list[Case],
    compare: Compare,
    progress: dict,
) -> CheckResult:
    def fail(step: int, label: str, where: str, expected: str, found: str) -> CheckResult:
        return CheckResult(
            name, description, False, step, Divergence(step, label, where, expected, found)
        )

    for step, (label, args) in enumerate(cases, start=1):
        progress["step"], progress["label"] = step, label
        try:
            ok, expected = True, reference(*args)
        except Exception as exc:  # the reference rejects this input
            ok, expected = False, exc
        try:
            if step == 1:
                side.start(WorldSpec("function"))
            student_ok, found = True, side.run(Call("__call__", args))
        except StudentRaised as raised:
            student_ok, found = False, raised.exception
        except StudentFailure as failure:  # the reference ran, or no answer came
            return fail(step, label, failure.where, failure.expected, failure.found)
        if not ok:  # the reference rejects this input: the student must raise ValueError too
            if student_ok or not isinstance(found, ValueError):
                shown = f"returns {render(found)}" if student_ok else describe_exception(found)
                return fail(step, label, "result", f"raises ValueError ({expected})", shown)
            continue
        if not student_ok:
            return fail(
                step, label, "result", f"returns {render(expected)}", describe_exception(found)
            )
        difference = compare(expected, found)
        if difference is not None:
            return fail(step, label, *difference)
    return CheckResult(name, description, True, len(cases))


def _time_limit(time_limit: float | None, verbose: bool) -> float | None:
    time_limit = check_time_limit(time_limit)
    if verbose and time_limit is not None and not limit_is_enforceable():
        print(
            f"note: this Python cannot stop a check from this thread; the {time_limit:g} s "
            "limit per check is not enforced"
        )
    return time_limit


def _grade(
    check_name: str,
    student: Any,
    reference: Callable,
    checks: CheckCases,
    compare: Compare,
    verbose: bool,
    allow_reference: bool,
    time_limit: float | None,
) -> GradeReport:
    """Run every row of a Part II grader on the student's function (here, or behind a
    StudentSide)."""
    time_limit = _time_limit(time_limit, verbose)
    side, guard = grading_side(student, check_name, allow_reference)
    side = side or LocalStudent(student, guard)
    results = [
        _run_cases(name, desc, reference, side, cases, compare, time_limit)
        for name, desc, cases in checks
    ]
    report = GradeReport(f"{check_name}({getattr(student, '__name__', 'fn')})", results)
    if verbose:
        print(report.table())
    return report


# --- approximate_gcd
def _gcd_label(values: list[int], lower_bound: int | None) -> str:
    return f"approximate_gcd({values}, lower_bound={lower_bound})"


def _gcd_cases(pairs: list[tuple[list[int], int | None]]) -> list[Case]:
    return [(_gcd_label(v, lb), (v, lb)) for v, lb in pairs]


@cache
def dsv4_tuple_counts() -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(configuration, layer tuples per bucket) for every DeepSeek V4 setting the package
    knows."""
    from refimpl.hybrid import deepseek_v4
    from refimpl.hybrid.older_planners import group_and_unify_kv_cache_specs

    rows = []
    for variant in ("pro", "flash"):
        for mtp in (False, True):
            specs = deepseek_v4.kv_cache_specs(variant=variant, mtp=mtp)
            buckets = group_and_unify_kv_cache_specs(specs)
            rows.append(
                (
                    f"{variant}{' + mtp' if mtp else ''}",
                    tuple(b.get_num_layer_tuples() for b in buckets),
                )
            )
    return tuple(rows)


def _compare_value(expected: Any, found: Any) -> tuple[str, str, str] | None:
    if expected == found and type(found) is not bool:
        return None
    return "return value", render(expected), render(found)


def _random_gcd_pairs(seed: int, n: int) -> list[tuple[list[int], int | None]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        values = [rng.randint(1, 70) for _ in range(rng.randint(1, 6))]
        lower_bound = rng.choice([None, 0, values[0], rng.randint(1, 90)])
        pairs.append((values, lower_bound))
    return pairs


CheckCases = list[tuple[str, str, list[Case]]]  # (row name, description, cases)


def approximate_gcd_checks() -> CheckCases:
    """The rows of `check_approximate_gcd`, each with its calls."""
    checks = [
        (
            "worked_examples",
            "four worked examples, the last from DeepSeek V4 Pro",
            _gcd_cases(
                [([4, 6], 1), ([3], 5), ([21, 43, 21, 20], 21), ([31, 61, 31, 30], 31)]
            ),
        ),
        (
            "deepseek_v4_buckets",
            "tuple counts of every DeepSeek V4 bucket list (lower bound = MLA count)",
            _gcd_cases([(list(c), c[0]) for _, c in dsv4_tuple_counts()]),
        ),
        (
            "ties_go_to_larger_d",
            "among equal paddings the larger d wins",
            _gcd_cases([([12], None), ([6, 10, 14], None), ([8, 8, 4], 2), ([5, 7], 3)]),
        ),
        (
            "search_range_inclusive",
            "d runs from max(1, lower_bound) up to max(values), both included",
            _gcd_cases(
                [
                    ([3], 5),
                    ([2, 2], 9),
                    ([9, 3], 3),
                    ([7], 7),
                    ([1, 1], None),
                    ([10, 4], 0),
                    ([6, 4], -2),
                ]
            ),
        ),
        (
            "repeated_values_with_lower_bound",
            "every value counts, repeats included, also above a lower bound",
            _gcd_cases(
                [
                    ([2, 2, 3], 2),
                    ([4, 7, 4], 5),
                    ([1, 6, 1], 4),
                    ([3, 3, 7], 3),
                    ([31, 61, 31, 30, 30], 31),
                ]
            ),
        ),
        (
            "rejects_bad_input",
            "no values, or a value <= 0, is a ValueError",
            _gcd_cases([([], None), ([3, 0], None), ([-4], 2)]),
        ),
        (
            "rejects_non_integers",
            "a bool, float or string among the values or as lower bound is a ValueError",
            _gcd_cases(
                [
                    ([True], None),
                    ([4, True], None),
                    ([2.5], None),
                    (["4"], None),
                    ([4, 6], True),
                    ([4, 6], 2.5),
                    ([4, 6], "3"),
                ]
            ),
        ),
    ]
    for seed in range(2):
        checks.append(
            (
                f"random_values_{seed}",
                f"seeded random values and lower bounds (seed {seed})",
                _gcd_cases(_random_gcd_pairs(seed, 40)),
            )
        )
    return checks


def check_approximate_gcd(
    student_fn: Callable,
    *,
    verbose: bool = True,
    allow_reference: bool = False,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
) -> GradeReport:
    """Grade `approximate_gcd(values, lower_bound=None)` against
    `refimpl.hybrid.kv_cache_planning`.

    A call that runs the reference function (or its `padding_curve`) fails unless
    `allow_reference`. A check still running after `time_limit` seconds (None: no limit) is
    stopped and fails.
    """
    return _grade(
        "check_approximate_gcd",
        student_fn,
        reference_approximate_gcd,
        approximate_gcd_checks(),
        _compare_value,
        verbose,
        allow_reference,
        time_limit,
    )


# --- packed layout
def _compare_layout(expected: tuple[int, dict], found: Any) -> tuple[str, str, str] | None:
    if not (isinstance(found, tuple) and len(found) == 2):
        return "return value", "a tuple (block_stride, layers_by_offset)", render(found)
    stride, offsets = expected
    found_stride, found_offsets = found
    if found_stride != stride:
        return "block_stride", render(stride), render(found_stride)
    if not isinstance(found_offsets, dict):
        return "layers_by_offset", "a dict {offset: [layer names]}", render(found_offsets)
    for offset in sorted(
        set(offsets) | set(found_offsets),
        key=lambda o: (not isinstance(o, int), o if isinstance(o, int) else 0),
    ):
        want = offsets.get(offset)
        got = found_offsets.get(offset)
        got = list(got) if isinstance(got, (list, tuple)) else got
        if want != got:
            return (
                f"layers_by_offset[{offset}]",
                render(want) if want is not None else "(no layer starts here)",
                render(got) if got is not None else "(no layer starts here)",
            )
    # the dict's key order does not matter: tensors are emitted by ascending offset
    return None


@cache
def _dsv4_groups(
    variant: str, cache_dtype: str, indexer: str, mtp: bool
) -> tuple[KVCacheGroupSpec, ...]:
    from refimpl.hybrid import deepseek_v4

    specs = deepseek_v4.kv_cache_specs(
        variant=variant, cache_dtype=cache_dtype, indexer=indexer, mtp=mtp
    )
    return tuple(get_kv_cache_groups_b(specs))  # the exercises teach the article's planner


@cache
def _article_two_groups() -> tuple[KVCacheGroupSpec, ...]:
    from refimpl.hybrid import deepseek_v4
    from refimpl.hybrid.older_planners import two_group_layout

    return tuple(two_group_layout(deepseek_v4.kv_cache_specs()))


def _layout_case(label: str, groups: tuple[KVCacheGroupSpec, ...]) -> Case:
    return (
        f"get_packed_kv_cache_layout({label}: {len(groups)} groups, "
        f"{sum(len(g.layer_names) for g in groups)} layers)",
        (list(groups),),
    )


def cross_layer_groups(page_tokens: int = 16) -> list[KVCacheGroupSpec]:
    """A cross-layer packed layout: groups (full.0, full.1), (sw.0, sw.2), (sw.1, sw.3), one
    page size.

    vLLM packs these only with `enable_cross_layers_blocks`; the small case shows that each
    group starts again at byte 0 of a block and that layers at one offset are listed in group
    order.
    """
    full = FullAttentionSpec(
        block_size=page_tokens, num_kv_heads=2, head_size=64, dtype="float16"
    )
    window = SlidingWindowSpec(
        block_size=page_tokens,
        num_kv_heads=2,
        head_size=64,
        dtype="float16",
        sliding_window=128,
    )
    return [
        KVCacheGroupSpec(["full.0", "full.1"], full),
        KVCacheGroupSpec(["sw.0", "sw.2"], window),
        KVCacheGroupSpec(["sw.1", "sw.3"], window),
    ]


def random_groups(seed: int) -> list[KVCacheGroupSpec]:
    """Groups of uniform-type layers with mixed page sizes (head sizes), as a packed plan sees
    them."""
    rng = random.Random(seed)
    groups = []
    layer = 0
    for g in range(rng.randint(1, 4)):
        members = {}
        for _ in range(rng.randint(1, 5)):
            members[f"model.layers.{layer}.g{g}"] = FullAttentionSpec(
                block_size=16,
                num_kv_heads=1,
                head_size=rng.choice([16, 32, 48, 64, 128]),
                dtype="float16",
            )
            layer += 1
        groups.append(
            KVCacheGroupSpec(list(members), UniformTypeKVCacheSpecs.from_specs(members))
        )
    return groups


def packed_layout_checks() -> CheckCases:
    """The rows of `check_packed_layout`, each with its calls."""
    checks = [
        (
            "deepseek_v4_pro",
            "Pro, fp8_ds_mla, fp8 indexer: stride 1,435,968 B, 206 offsets",
            [_layout_case("DeepSeek-V4-Pro", _dsv4_groups("pro", "fp8_ds_mla", "fp8", False))],
        ),
        (
            "deepseek_v4_variants",
            "Flash, fp4 indexer, bfloat16 cache, MTP layer",
            [
                _layout_case(
                    "DeepSeek-V4-Flash", _dsv4_groups("flash", "fp8_ds_mla", "fp8", False)
                ),
                _layout_case(
                    "Pro + fp4 indexer", _dsv4_groups("pro", "fp8_ds_mla", "fp4", False)
                ),
                _layout_case(
                    "Pro, bfloat16 cache", _dsv4_groups("pro", "bfloat16", "fp8", False)
                ),
                _layout_case("Pro + MTP", _dsv4_groups("pro", "fp8_ds_mla", "fp8", True)),
            ],
        ),
        (
            "article_two_groups",
            "the article's MLA + one unsplit SWA group: stride 2,283,840 B",
            [_layout_case("article's two groups", _article_two_groups())],
        ),
        (
            "cross_layer_groups",
            "three groups of one page size overlay: offsets 0 and one page",
            [_layout_case("cross-layer groups", tuple(cross_layer_groups()))],
        ),
        (
            "rejects_no_groups",
            "no groups (nothing to lay out) is a ValueError, not a 0-byte block",
            [_layout_case("no groups", ())],
        ),
    ]
    for seed in range(2):
        cases = [
            _layout_case(f"random groups {seed}.{i}", tuple(random_groups(100 * seed + i)))
            for i in range(6)
        ]
        checks.append(
            (
                f"random_groups_{seed}",
                f"seeded random groups with mixed page sizes (seed {seed})",
                cases,
            )
        )
    return checks


def check_packed_layout(
    student_fn: Callable,
    *,
    verbose: bool = True,
    allow_reference: bool = False,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
) -> GradeReport:
    """Grade `get_packed_kv_cache_layout(groups) -> (block_stride, {offset: [layer names]})`.

    A call that runs the reference function (directly or through `get_kv_cache_config`) fails
    unless `allow_reference`. A check still running after `time_limit` seconds (None: no limit)
    is stopped and fails.
    """
    return _grade(
        "check_packed_layout",
        student_fn,
        reference_packed_layout,
        packed_layout_checks(),
        _compare_layout,
        verbose,
        allow_reference,
        time_limit,
    )
