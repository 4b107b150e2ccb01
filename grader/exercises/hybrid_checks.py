"""Graders for the Part II exercise: vLLM's planner for DeepSeek V4 (`approximate_gcd`, the
grouping `get_packed_kv_cache_groups` and the packed slab `get_kv_cache_config`).

All three are pure functions, so a "step" is one call: the student's answer is compared with
`refimpl.hybrid.kv_cache_planning` on worked examples, on every DeepSeek V4 configuration, and
on seeded random inputs; the first call whose answer differs is reported. Groups and configs
are objects: both answers are turned into plain data (`grader.lockstep.calls.plain`) and
compared field by field, so a row names the first group, tensor or field that differs.

The rules checked (each with its check and a broken variant in `grader.exercises.rules`):
`approximate_gcd` searches d from max(1, lower_bound) (0, negative or None meaning 1) to
max(values) inclusive, returns a lower bound above every value as is, counts every value's
padding (repeats included), breaks ties toward the larger d, and rejects no values, values <= 0
and anything not an int (bools, floats, strings) as values or lower bound with a ValueError;
`get_packed_kv_cache_groups` buckets caches greedily in registration order, takes the largest
balanced bucket that mixes page sizes as the lower bound, splits balanced buckets into
cdiv(tuples, d) groups of every n-th tuple, keeps unbalanced buckets whole, splits window
buckets to fit the widest block when there is no d, and returns None for one page size;
`get_kv_cache_config` overlays groups from byte 0, lays each group out spec by spec by padded
page size, takes the widest group rounded up to every kernel page as the stride, counts blocks
in the budget unless overridden, and rejects no groups or less than one block with a
ValueError. Every check runs under a time limit.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import cache
from typing import Any

from grader.exercises.paged_worlds import plain_function_world
from grader.exercises.reference_code import grading_side
from grader.lockstep.engine import (
    Call,
    LocalStudent,
    StudentFailure,
    StudentRaised,
    StudentSide,
    WorldSpec,
    describe_exception,
    described_difference,
    render,
    timeout_divergence,
)
from grader.lockstep.report import CheckResult, Divergence, GradeReport, seeded_checks
from grader.lockstep.time_limit import (
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
from refimpl.hybrid.kv_cache_planning import (
    GIB,
    UnsplittableBucketError,
    get_kv_cache_config,
    get_packed_kv_cache_groups,
)
from refimpl.hybrid.kv_cache_planning import approximate_gcd as reference_approximate_gcd

Case = tuple[str, tuple]  # (label shown in the table, arguments)


def reference_packed_groups(specs):
    """vLLM's `get_packed_kv_cache_groups` for the block-outermost layout the exercise teaches
    (DeepSeek V4's BLHNC): left to choose, the planner packs only DeepSeek V4's caches, and
    the exercise's small mixed models would get None."""
    return get_packed_kv_cache_groups(specs, "BLHNC")


Compare = Callable[[Any, Any], "tuple[str, str, str] | None"]


def _run_cases(
    name: str,
    description: str,
    reference: Callable,
    side: StudentSide,
    cases: list[Case],
    compare: Compare,
    time_limit: float | None = None,
    world: str = "function",
) -> CheckResult:
    """Call both functions case by case; the whole check is stopped after `time_limit`
    seconds."""
    progress = {"step": 0, "label": "(before the first call)"}
    try:
        with scenario_time_limit(
            time_limit, student_in_this_process=side.runs_in_this_process
        ):
            return _compare_cases(
                name, description, reference, side, cases, compare, progress, world
            )
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
    world: str = "function",
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
                side.start(WorldSpec(world))
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
    world: str = "function",
) -> GradeReport:
    """Run every row of a Part II grader on the student's function (here, or behind a
    StudentSide). In a "plain_function" world both answers are compared as plain data."""
    time_limit = _time_limit(time_limit, verbose)
    side, guard = grading_side(student, check_name, allow_reference)
    side = side or LocalStudent(student, guard)
    if world == "plain_function":
        reference = plain_function_world(reference)
    results = [
        _run_cases(name, desc, reference, side, cases, compare, time_limit, world)
        for name, desc, cases in checks
    ]
    report = GradeReport(
        f"{check_name}({getattr(student, '__name__', 'fn')})", results, one_function=True
    )
    if verbose:
        print(report.table())
    return report


# --- approximate_gcd
def _gcd_label(values: list[int], lower_bound: int | None) -> str:
    return f"approximate_gcd({values}, lower_bound={lower_bound})"


def _gcd_cases(pairs: list[tuple[list[int], int | None]]) -> list[Case]:
    return [(_gcd_label(v, lb), (v, lb)) for v, lb in pairs]


@cache
def dsv4_gcd_calls() -> tuple[tuple[str, tuple[int, ...], int | None], ...]:
    """(configuration, values, lower bound) of the `approximate_gcd` call vLLM's planner makes
    for every DeepSeek V4 setting the package knows, taken from the planner itself."""
    from unittest import mock

    from refimpl.hybrid import deepseek_v4, kv_cache_planning

    rows = []
    for variant in ("pro", "flash"):
        for mtp in (False, True):
            calls = []

            def record(values, lower_bound=None, calls=calls):
                calls.append((tuple(values), lower_bound))
                return reference_approximate_gcd(values, lower_bound)

            specs = deepseek_v4.kv_cache_specs(variant=variant, mtp=mtp)
            with mock.patch.object(kv_cache_planning, "approximate_gcd", record):
                kv_cache_planning.get_packed_kv_cache_groups(specs)
            ((values, lower_bound),) = calls
            rows.append((f"{variant}{' + mtp' if mtp else ''}", values, lower_bound))
    return tuple(rows)


def _compare_value(expected: Any, found: Any) -> tuple[str, str, str] | None:
    if expected == found and type(found) is not bool:
        return None
    return described_difference("return value", expected, found)


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
            _gcd_cases([([4, 6], 1), ([3], 5), ([43, 21, 20], 21), ([61, 31, 30], 30)]),
        ),
        (
            "deepseek_v4_buckets",
            "vLLM's planner on every DeepSeek V4 model (lower bound: the mixed bucket)",
            _gcd_cases([(list(v), lb) for _, v, lb in dsv4_gcd_calls()]),
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
    checks += seeded_checks(
        "random_values",
        "seeded random values and lower bounds",
        lambda seed: _gcd_cases(_random_gcd_pairs(seed, 40)),
        range(2),
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


# --- answers that are objects: compared as plain data, field by field
def _first_difference(expected: Any, found: Any, path: str) -> tuple[str, str, str] | None:
    """(where, expected, found) of the first place two plain values differ, or None."""
    if isinstance(expected, dict) and isinstance(found, dict):
        if expected.get("class") != found.get("class"):
            return f"{path} (type)", str(expected.get("class")), render(found.get("class"))
        for key, value in expected.items():
            if key not in found:
                return f"{path}[{key!r}]", render(value), "(missing)"
            difference = _first_difference(value, found[key], f"{path}.{key}")
            if difference is not None:
                return difference
        extra = [key for key in found if key not in expected]
        if extra:
            return f"{path}[{extra[0]!r}]", "(no such entry)", render(found[extra[0]])
        return None
    nested = isinstance(expected, list) and any(isinstance(v, dict) for v in expected)
    if nested and isinstance(found, list):
        if len(expected) != len(found):
            return f"{path} (how many)", str(len(expected)), str(len(found))
        for i, (want, got) in enumerate(zip(expected, found)):
            difference = _first_difference(want, got, f"{path}[{i}]")
            if difference is not None:
                return difference
        return None
    if expected == found and type(found) is type(expected):
        return None
    return described_difference(path, expected, found)


def _compare_groups(expected: Any, found: Any) -> tuple[str, str, str] | None:
    return _first_difference(expected, found, "groups")


def _compare_config(expected: Any, found: Any) -> tuple[str, str, str] | None:
    return _first_difference(expected, found, "config")


# --- vLLM's grouping of DeepSeek V4 (get_packed_kv_cache_groups)
def _spec(head_size: int, window: int | None = None, **kwargs: Any) -> Any:
    """A one-head float16 spec of 16-token blocks: full attention, or a sliding window."""
    common = dict(block_size=16, num_kv_heads=1, head_size=head_size, dtype="float16")
    if window is None:
        return FullAttentionSpec(**common, **kwargs)
    return SlidingWindowSpec(**common, sliding_window=window, **kwargs)


@cache
def _dsv4_specs(variant: str, cache_dtype: str, indexer: str, mtp: bool) -> dict:
    from refimpl.hybrid import deepseek_v4

    return deepseek_v4.kv_cache_specs(
        variant=variant, cache_dtype=cache_dtype, indexer=indexer, mtp=mtp
    )


def toy_specs(num_layers: int) -> dict:
    """DeepSeek-V4-Pro's caches of its first `num_layers` layers (the course's toy is 5)."""
    from refimpl.hybrid import deepseek_v4

    return {
        name: spec
        for name, spec in _dsv4_specs("pro", "fp8_ds_mla", "fp8", False).items()
        if deepseek_v4.parse_layer_name(name)[0] < num_layers
    }


def unbalanced_specs() -> dict:
    """A balanced bucket of two page sizes (4 tuples), a one-size window bucket (9 tuples), and
    a window bucket with 8 pages of one size and 2 of another (unbalanced: it stays whole and
    sets no lower bound)."""
    specs = {}
    for i in range(4):
        specs[f"l{i}.a"], specs[f"l{i}.b"] = _spec(64), _spec(128)
    for i in range(9):
        specs[f"l{i}.sw"] = _spec(64, 64)
    for i in range(8):
        specs[f"l{i}.sw2a"] = _spec(64, 256)
    for i in range(2):
        specs[f"l{i}.sw2b"] = _spec(128, 256)
    return specs


def state_split_specs() -> dict:
    """No balanced bucket mixes page sizes: the full-attention bucket (3 + 1 pages) is the
    widest group, and the 8 window layers are split into groups that fit in its block."""
    specs = {f"l{i}.a": _spec(128) for i in range(3)}
    specs["l3.b"] = _spec(64)
    specs.update({f"l{i}.sw": _spec(64, 64) for i in range(8)})
    return specs


def one_page_size_specs() -> dict:
    """Full and window layers whose pages all have one size: not a packed plan (None)."""
    return {"l0.full": _spec(64), "l0.sw": _spec(64, 128), "l1.full": _spec(64)}


def random_specs(seed: int) -> dict:
    """Seeded layers of full attention and two windows, head sizes 64 and 128, in repeating
    patterns of one to three caches per layer (some buckets balanced, some not). Patterns that
    vLLM 0.32's packer itself cannot split (the planner's UnsplittableBucketError) are drawn
    again: the exercise asks only what vLLM answers."""
    for attempt in range(100):
        specs = _random_specs(seed * 1000 + attempt if attempt else seed)
        try:
            reference_packed_groups(specs)
        except UnsplittableBucketError:
            continue
        return specs
    raise RuntimeError(f"no plannable random pattern for seed {seed}")


def _random_specs(seed: int) -> dict:
    rng = random.Random(seed)
    kinds = [(None, 64), (None, 128), (64, 64), (64, 128), (256, 64)]
    pattern = rng.sample(kinds, rng.randint(2, 4))
    specs = {}
    for layer in range(rng.randint(3, 12)):
        for j, (window, head) in enumerate(pattern):
            if rng.random() < 0.85:
                specs[f"layers.{layer}.c{j}"] = _spec(head, window)
    if len({s.page_size_bytes for s in specs.values()}) == 1:
        specs["layers.99.extra"] = _spec(128 if pattern[0][1] == 64 else 64, pattern[0][0])
    return specs


def _groups_case(label: str, specs: dict) -> Case:
    return (f"get_packed_kv_cache_groups({label}: {len(specs)} caches)", (dict(specs),))


def packed_groups_checks() -> CheckCases:
    """The rows of `check_packed_groups`, each with its calls."""
    checks = [
        (
            "deepseek_v4_pro",
            "Pro's 243 caches: SWA-a, SWA-b, MLA, C128 state, C4 state",
            [_groups_case("DeepSeek-V4-Pro", _dsv4_specs("pro", "fp8_ds_mla", "fp8", False))],
        ),
        (
            "deepseek_v4_variants",
            "Flash, the MTP layer, fp4 indexer, bfloat16 cache",
            [
                _groups_case("Flash", _dsv4_specs("flash", "fp8_ds_mla", "fp8", False)),
                _groups_case("Pro + MTP", _dsv4_specs("pro", "fp8_ds_mla", "fp8", True)),
                _groups_case("Flash + MTP", _dsv4_specs("flash", "fp8_ds_mla", "fp8", True)),
                _groups_case(
                    "Pro, fp4 indexer", _dsv4_specs("pro", "fp8_ds_mla", "fp4", False)
                ),
                _groups_case("Pro, bfloat16", _dsv4_specs("pro", "bfloat16", "fp8", False)),
            ],
        ),
        (
            "toy_layers",
            "Pro's first 5 layers (five groups) and first 4 (nine groups)",
            [_groups_case("Pro's first 5 layers", toy_specs(5))]
            + [_groups_case("Pro's first 4 layers", toy_specs(4))],
        ),
        (
            "unbalanced_bucket_stays_whole",
            "an unbalanced bucket is one group and sets no lower bound",
            [_groups_case("unbalanced window bucket", unbalanced_specs())],
        ),
        (
            "state_buckets_split_to_fit",
            "no mixed balanced bucket: window layers split to fit the widest block",
            [_groups_case("window layers next to a wide group", state_split_specs())],
        ),
        (
            "one_page_size_is_none",
            "pages of one size are not a packed plan: None",
            [_groups_case("one page size", one_page_size_specs())],
        ),
    ]
    checks += seeded_checks(
        "random_specs",
        "seeded random layer patterns",
        lambda seed: [
            _groups_case(f"random {seed}.{i}", random_specs(100 * seed + i)) for i in range(8)
        ],
        range(2),
    )
    return checks


def check_packed_groups(
    student_fn: Callable,
    *,
    verbose: bool = True,
    allow_reference: bool = False,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
) -> GradeReport:
    """Grade `get_packed_kv_cache_groups(specs) -> list[KVCacheGroupSpec] | None` against
    vLLM's planner in `refimpl.hybrid.kv_cache_planning`.

    Groups are compared as plain data: their order, each group's layer names in order and its
    spec. A call that runs the reference (directly or through `get_kv_cache_groups`) fails
    unless `allow_reference`. A check still running after `time_limit` seconds (None: no limit)
    is stopped and fails.
    """
    return _grade(
        "check_packed_groups",
        student_fn,
        reference_packed_groups,
        packed_groups_checks(),
        _compare_groups,
        verbose,
        allow_reference,
        time_limit,
        world="plain_function",
    )


# --- the packed layout (get_kv_cache_config)
def reference_kv_cache_config(groups, available_memory, num_blocks_override=None):
    """vLLM's `get_kv_cache_config` in the block-outermost layout the exercise teaches (the
    packed slab of chapter 10: DeepSeek V4's BLHNC). Left to choose, the planner lays other
    models' caches out layer-outermost, which the exercise does not ask for."""
    return get_kv_cache_config(
        groups, available_memory, num_blocks_override, kv_cache_layout="BLHNC"
    )


@cache
def _planned_groups(variant: str, cache_dtype: str, indexer: str, mtp: bool) -> tuple:
    return tuple(reference_packed_groups(_dsv4_specs(variant, cache_dtype, indexer, mtp)))


def cross_layer_groups(page_tokens: int = 16) -> list[KVCacheGroupSpec]:
    """A cross-layer packed layout: groups (full.0, full.1), (sw.0, sw.2), (sw.1, sw.3), one
    page size.

    vLLM packs these only with `enable_cross_layers_blocks`; the small case shows that each
    group starts again at byte 0 of a block.
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


def aligned_groups() -> list[KVCacheGroupSpec]:
    """A 4,096-byte page whose kernel takes 8-token blocks (alignment 2,048 B) next to a
    5,120-byte page: the stride grows from 5,120 to 6,144 bytes."""
    return [
        KVCacheGroupSpec(["k.0"], _spec(64, kernel_block_size=8)),
        KVCacheGroupSpec(["w.0"], _spec(80)),
    ]


def coprime_alignment_groups() -> list[KVCacheGroupSpec]:
    """Two kernels of 8-token blocks whose kernel pages (2,048 B and 1,536 B) do not divide
    each other: the stride is a multiple of their least common multiple, 6,144 B, not of the
    larger one (4,096 B would split a 1,536 B kernel page)."""
    return [
        KVCacheGroupSpec(["k.0"], _spec(64, kernel_block_size=8)),
        KVCacheGroupSpec(["j.0"], _spec(48, kernel_block_size=8)),
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


def _config_case(
    label: str, groups: Any, memory: int = 10 * GIB, override: int | None = None
) -> Case:
    budget = f"{memory / GIB:g} GiB" if memory >= GIB else f"{memory:,} B"
    more = f", num_blocks_override={override}" if override is not None else ""
    return (
        f"get_kv_cache_config({label}: {len(groups)} groups, {budget}{more})",
        (list(groups), memory, override),
    )


def packed_layout_checks() -> CheckCases:
    """The rows of `check_packed_layout`, each with its calls."""
    pro = _planned_groups("pro", "fp8_ds_mla", "fp8", False)
    checks = [
        (
            "deepseek_v4_pro",
            "Pro's five groups: stride 1,435,968 B, 7,477 blocks in 10 GiB",
            [_config_case("DeepSeek-V4-Pro", pro)],
        ),
        (
            "deepseek_v4_variants",
            "Flash, fp4 indexer, bfloat16 cache, MTP layer",
            [
                _config_case("Flash", _planned_groups("flash", "fp8_ds_mla", "fp8", False)),
                _config_case("Pro, fp4", _planned_groups("pro", "fp8_ds_mla", "fp4", False)),
                _config_case("Pro, bf16", _planned_groups("pro", "bfloat16", "fp8", False)),
                _config_case("Pro + MTP", _planned_groups("pro", "fp8_ds_mla", "fp8", True)),
            ],
        ),
        (
            "toy_runs_by_spec",
            "Pro's first 5 layers: a group's layers are laid out spec by spec",
            [_config_case("Pro's first 5 layers", reference_packed_groups(toy_specs(5)), GIB)],
        ),
        (
            "cross_layer_groups",
            "three groups of one page size overlay from byte 0",
            [_config_case("cross-layer groups", cross_layer_groups(), 1 << 20)],
        ),
        (
            "kernel_block_alignment",
            "the stride is a whole number of every layer's kernel pages (their lcm)",
            [
                _config_case("a kernel of 8-token blocks", aligned_groups(), 1 << 20),
                _config_case(
                    "kernel pages 2,048 B and 1,536 B", coprime_alignment_groups(), 1 << 20
                ),
            ],
        ),
        (
            "budget_and_override",
            "blocks = budget // stride, or the override, uncapped; under one block: "
            "ValueError",
            [
                _config_case("DeepSeek-V4-Pro", pro, 3 * 1_435_968 - 1),
                _config_case("DeepSeek-V4-Pro", pro, GIB, 12),
                _config_case("DeepSeek-V4-Pro", pro, 3 * 1_435_968, 12),
                _config_case("DeepSeek-V4-Pro", pro, 1_435_967),
            ],
        ),
        (
            "rejects_no_groups",
            "no groups (nothing to lay out) is a ValueError, not a 0-byte block",
            [_config_case("no groups", [], GIB)],
        ),
    ]
    checks += seeded_checks(
        "random_groups",
        "seeded random groups with mixed page sizes",
        lambda seed: [
            _config_case(f"random groups {seed}.{i}", random_groups(100 * seed + i), 1 << 24)
            for i in range(6)
        ],
        range(2),
    )
    return checks


def check_packed_layout(
    student_fn: Callable,
    *,
    verbose: bool = True,
    allow_reference: bool = False,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
) -> GradeReport:
    """Grade `get_kv_cache_config(groups, available_memory, num_blocks_override=None) ->
    KVCacheConfig` against vLLM's planner in `refimpl.hybrid.kv_cache_planning`.

    Configs are compared as plain data: the block count, then every tensor (size, layers,
    offset, block stride, layer stride) in order, then the groups. A call that runs the
    reference fails unless `allow_reference`. A check still running after `time_limit` seconds
    (None: no limit) is stopped and fails.
    """
    return _grade(
        "check_packed_layout",
        student_fn,
        reference_kv_cache_config,
        packed_layout_checks(),
        _compare_config,
        verbose,
        allow_reference,
        time_limit,
        world="plain_function",
    )
