"""Play the same random streams through vLLM's and refimpl's allocators and compare every output
and the pool state after every operation; shrink the first divergence of a failing stream."""

from __future__ import annotations

import random

from tools.crosscheck.refimpl_side import RefimplAllocator
from tools.crosscheck.streams import GROUP_SETS, GroupSet, Harness, random_stream


def run_stream(gs: GroupSet, ops: list[tuple], make_other) -> tuple[list, int | None, tuple | None]:
    """(vLLM-side observations, index of the first divergence or None, (theirs, ours) there)."""
    theirs = Harness(make_other(gs), gs.max_model_len)
    try:
        ours = Harness(RefimplAllocator(gs), gs.max_model_len)
    except Exception as exc:  # noqa: BLE001 - a crash is a divergence too
        return [], 0, ("constructed", f"{type(exc).__name__}: {exc}")
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


def shrink(gs: GroupSet, ops: list[tuple], make_other) -> list[tuple]:
    """Delete operations (halves, then single ones) while the streams still diverge."""
    ops = list(ops[: run_stream(gs, ops, make_other)[1] + 1])
    chunk = max(1, len(ops) // 2)
    while chunk >= 1:
        i = 0
        while i < len(ops):
            trial = ops[:i] + ops[i + chunk :]
            if trial and run_stream(gs, trial, make_other)[1] is not None:
                ops = trial[: run_stream(gs, trial, make_other)[1] + 1]
            else:
                i += chunk
        chunk //= 2
    return ops


def _jsonable(x):
    if isinstance(x, tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, list):
        return [_jsonable(v) for v in x]
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    return x


def stream_for(seed: int) -> tuple[GroupSet, list[tuple]]:
    """Stream `seed`: the group sets take turns; the stream length varies from 20 to 80."""
    names = sorted(GROUP_SETS)
    gs = GROUP_SETS[names[seed % len(names)]]
    rng = random.Random(seed)
    return gs, random_stream(rng, gs, rng.randrange(20, 81))


def crosscheck_allocator(num_streams: int, make_other, log=print) -> tuple[int, list[str]]:
    """Returns (streams that agree, one report line per failing stream)."""
    agreed, failures = 0, []
    for seed in range(num_streams):
        gs, ops = stream_for(seed)
        _, at, diff = run_stream(gs, ops, make_other)
        if at is None:
            agreed += 1
            continue
        small = shrink(gs, ops, make_other) if at > 0 or diff[0] != "constructed" else ops[:1]
        _, at2, diff2 = run_stream(gs, small, make_other)
        failures.append(f"stream {seed} ({gs.name}): diverges at operation {at} of {len(ops)}; shrunk to "
                        f"{len(small)} operations {small}\n    vLLM:    {diff2[0]}\n    refimpl: {diff2[1]}")
        log(failures[-1])
    return agreed, failures
