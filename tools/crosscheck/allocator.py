"""Play the same random streams through vLLM's and refimpl's allocators and compare every
output and the pool state after every operation; shrink the first divergence of a failing
stream.

Each stream runs at one retention setting (`streams.RETENTION_SETTINGS`); `causes` names what a
stream exercised (the unitary coordinator, a pinned junction, a refused allocation, ...), so
the report can say how many agreeing streams reached each feature.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from functools import partial

from tools.crosscheck.refimpl_side import RefimplAllocator
from tools.crosscheck.streams import GROUP_SETS, GroupSet, Harness, random_stream


def _construct(make, gs: GroupSet, retention: str):
    try:
        return Harness(make(gs, retention), gs.max_model_len), None
    except Exception as exc:  # noqa: BLE001 - a refusal is an observation too
        return None, type(exc).__name__


def run_stream(
    gs: GroupSet, ops: list[tuple], make_other, retention: str = "0"
) -> tuple[list, int | None, tuple | None]:
    """(vLLM-side observations, index of the first divergence or None, (theirs, ours) there).

    Both sides refusing the configuration with the same exception type is an agreement (one
    observation, ["refused", type])."""
    theirs, their_error = _construct(make_other, gs, retention)
    ours, our_error = _construct(RefimplAllocator, gs, retention)
    if their_error or our_error:
        if their_error == our_error:
            return [["refused", their_error]], None, None
        return (
            [],
            0,
            (f"constructed: {their_error or 'ok'}", f"constructed: {our_error or 'ok'}"),
        )
    record = []
    for i, op in enumerate(ops):
        a = (theirs.play(op), theirs.observe())
        try:
            b = (ours.play(op), ours.observe())
        except Exception as exc:  # noqa: BLE001
            b = (f"{type(exc).__name__}: {exc}",)
        record.append(_jsonable(a))
        if _jsonable(a) != _jsonable(b):
            return record, i, (_jsonable(a), _jsonable(b))
    return record, None, None


def shrink(gs: GroupSet, ops: list[tuple], make_other, retention: str = "0") -> list[tuple]:
    """Delete operations (halves, then single ones) while the streams still diverge."""
    run = partial(run_stream, gs, make_other=make_other, retention=retention)
    ops = list(ops[: run(ops)[1] + 1])
    chunk = max(1, len(ops) // 2)
    while chunk >= 1:
        i = 0
        while i < len(ops):
            trial = ops[:i] + ops[i + chunk :]
            at = run(trial)[1] if trial else None
            if at is not None:
                ops = trial[: at + 1]
            else:
                i += chunk
        chunk //= 2
    return ops


def _jsonable(x):
    if isinstance(x, (tuple, list)):
        return [_jsonable(v) for v in x]
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    return x


def stream_for(seed: int, names: Sequence[str] = ()) -> tuple[GroupSet, list[tuple]]:
    """Stream `seed`: the group sets (all, or `names`) take turns; the stream length varies
    from 20 to 80."""
    names = sorted(names or GROUP_SETS)
    gs = GROUP_SETS[names[seed % len(names)]]
    rng = random.Random(seed)
    return gs, random_stream(rng, gs, rng.randrange(20, 81))


def causes(gs: GroupSet, ops: list[tuple], record: list) -> set[str]:
    """What one stream exercised, read from its group set, its operations and vLLM's
    answers."""
    found = set()
    if record and record[0][0] == "refused":
        return {"configuration refused by both"}
    if len(gs.groups) == 1 and gs.enable_caching:
        found.add("one group (unitary coordinator)")
    if gs.use_eagle or gs.eagle_groups:
        found.add("eagle / MTP drop")
    if (
        any(g[0] == "full" and g[1] > min(d[1] for d in gs.groups) for g in gs.groups)
        or gs.unit > 1
    ):
        found.add("full block above the hash unit (partial tail)")
    if gs.unit > 1:
        found.add("DeepSeek V4 real block sizes")
    if gs.max_in_flight_tokens is not None:
        found.add("in-flight token cap")
    chunked = [i for i, g in enumerate(gs.groups) if g[0] == "chunked"]
    if chunked:
        found.add("chunked local attention")
    tokens: dict[str, list[int]] = {}  # prompt of each request
    prefilling: dict[str, int] = {}  # started requests with uncomputed prompt tokens
    preempted: set[str] = set()
    for op, (out, _state) in zip(ops, record):
        if op[0] == "new" and out == "ok":
            tokens[op[1]] = list(op[2])
        elif op[0] in ("preempt", "finish") and out == "ok":
            prefilling.pop(op[1], None)
            if op[0] == "preempt":
                preempted.add(op[1])
        if not isinstance(out, list):
            continue
        if out[0] == "hit":
            _, _, hit_len, _, junction, _, new = out
            rid, pinned = op[1], (op[8] if len(op) > 8 else True)
            if hit_len:
                found.add("prefix hit")
            if any(out[1][i][:1] == [0] for i in chunked):
                found.add("chunked hit: null blocks before its last chunk")
            if junction:
                found.add(
                    "shared-prefix junction pinned"
                    if pinned
                    else "junction reported, not pinned by the caller"
                )
            if _shares_block_with(tokens, rid, prefilling, gs.scheduler_block_size):
                found.add("prefix shared with a partially prefilled request")
            if new is None:
                found.add("allocation refused")
                if op[6]:
                    found.add("refused with reserved_blocks")
                if op[4]:
                    found.add("full-sequence check")
                continue
            if op[7]:
                found.add("delayed caching")
            if op[6]:
                found.add("admitted with reserved_blocks")
            if op[4]:
                found.add("admitted past the full-sequence check")
            if op[5] and gs.watermark:
                found.add("admitted under the watermark (has_scheduled_reqs)")
            if rid in preempted:
                found.add("re-admitted after preemption")
                if op[3]:
                    found.add("re-admitted with lookahead tokens")
            left = len(tokens[rid]) - hit_len - min(op[2], len(tokens[rid]) - hit_len)
            if left > 0:
                prefilling[op[1]] = left
        elif out[0] == "alloc" and out[1] is None:
            found.add("allocation refused")
        elif out[0] == "alloc" and op[0] == "schedule" and op[1] in prefilling:
            prefilling[op[1]] -= min(op[2], prefilling[op[1]])
            if not prefilling[op[1]]:
                del prefilling[op[1]]
        elif out[0] == "reset":
            found.add("reset_prefix_cache " + ("accepted" if out[1] else "refused"))
    return found


def _shares_block_with(
    tokens: dict[str, list[int]], rid: str, prefilling: dict[str, int], block: int
) -> bool:
    """Does request `rid` share at least one scheduler block of prompt with a request that is
    still prefilling?"""
    mine = tokens[rid]
    for other in prefilling:
        theirs = tokens[other]
        if other != rid and len(mine) >= block and mine[:block] == theirs[:block]:
            return True
    return False


def crosscheck_allocator(
    num_streams: int,
    make_other,
    retention: str = "0",
    log=print,
    names: Sequence[str] = (),
) -> tuple[int, list[str], Counter]:
    """Returns (streams that agree, one report line per failing stream, agreeing streams per
    cause); `names` limits the streams to those group sets."""
    agreed, failures, by_cause = 0, [], Counter()
    for seed in range(num_streams):
        gs, ops = stream_for(seed, names)
        record, at, diff = run_stream(gs, ops, make_other, retention)
        if at is None:
            agreed += 1
            by_cause.update(causes(gs, ops, record))
            continue
        small = shrink(gs, ops, make_other, retention) if ops else ops
        _, at2, diff2 = run_stream(gs, small, make_other, retention)
        if diff2 is None:  # the divergence is in construction only
            small, diff2 = [], diff
        failures.append(
            f"stream {seed} ({gs.name}, retention {retention}): diverges at operation {at} of "
            f"{len(ops)}; shrunk to {len(small)} operations {small}\n    vLLM:    {diff2[0]}\n"
            f"    refimpl: {diff2[1]}"
        )
        log(failures[-1])
    return agreed, failures, by_cause
