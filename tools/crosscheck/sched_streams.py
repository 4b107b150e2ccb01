"""Traffic streams for the scheduler crosscheck, and the driver both schedulers share.

Nothing here imports vLLM: the vLLM side (`tools.crosscheck.scheduler`) and the oracle replay
test (`tests/test_sched_vllm_oracle.py`) drive a scheduler through the same `drive` loop.

A setting is a cache layout (groups of ("full", block_size), ("swa", block_size, window) or
("chunked", block_size, attention_chunk_size),
or a model config whose layers give the specs: the tiny DeepSeek V4) with a pool size,
scheduling flags and a retention interval. A stream is a seed: it expands
to arrivals per step (prompts built from a few shared prefixes so prefix hits happen, output
limits, priorities). The made-up model runner samples one token per request whose scheduled
chunk reaches the end of its tokens (`not request.is_prefill_chunk`, read from the
scheduler's own request after `schedule()`); the token is a function of (request id, step),
and a fixed share of them is EOS. Under async scheduling the output of step N is handed back
after step N+1 is scheduled, as vLLM's engine core does with a batch queue of two. Settings
with `aborts` finish some requests from outside (`finish_requests`, one id per call) a few
steps after they arrive, before that step's arrivals and schedule.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

EOS = 0
# block-outermost: groups whose pages differ in size may share one pool (both planners)
LAYOUT = "BLHNC"
VOCAB = 60
CONFIGS = Path(__file__).resolve().parents[2] / "tests/data/configs"


@dataclass(frozen=True)
class Setting:
    name: str
    groups: tuple[tuple, ...]
    num_blocks: int
    max_model_len: int = 160
    max_num_seqs: int = 4
    max_num_batched_tokens: int = 64
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"
    async_scheduling: bool = False
    retention: int | None = 0
    unit: int = 1  # scales prompt lengths (large block sizes need long prompts)
    # draft tokens per step (an n-gram drafter: no draft model, no lookahead slots); sync only
    num_spec: int = 0
    # a config folder under tests/data/configs whose model gives the specs (then `groups` is
    # empty): vLLM's side builds the model's layers, refimpl's reads the config
    model: str = ""
    # some requests are aborted from outside (`finish_requests`) a few steps after arrival
    aborts: bool = False
    # prefix caching off: a Mamba hybrid then keeps one state per request (mode "none")
    enable_prefix_caching: bool = True

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Setting:
        d = dict(d)
        d["groups"] = tuple(tuple(g) for g in d["groups"])
        return cls(**d)


def _layouts() -> list[tuple[str, tuple[tuple, ...], int, int, int]]:
    """(name, groups, spare blocks beyond one max_model_len request, unit, k for
    retention k)."""
    return [
        ("dense", (("full", 16),), 1, 1, 32),
        ("swa", (("full", 16), ("swa", 16, 32)), 3, 1, 32),
        # DeepSeek V4's group structure at small scale: a full (compressed) group with large
        # blocks beside a sliding window with small ones (scheduler block = lcm)
        ("v4", (("full", 64), ("swa", 16, 64)), 6, 4, 128),
        # Llama 4's layer pattern (three chunked local layers, then a full one, so the full
        # group is not group 0) at small scale: chunks of 32 tokens over 16-token blocks, so
        # prompts cross chunks often; retention only takes None or 0 here (no window: k is
        # skipped)
        ("llama4", (("chunked", 16, 32),) * 3 + (("full", 16),), 3, 1, 32),
    ]


def min_blocks_per_request(group: tuple, max_model_len: int, in_flight: int) -> int:
    """Blocks one request of `max_model_len` needs in a group (vLLM's per-request admission
    cap): all of them for full attention, a window or a chunk plus the tokens in flight for
    the others."""
    kind, block_size = group[:2]
    blocks = -(-max_model_len // block_size)
    if kind == "swa":
        return min(blocks, -(-(group[2] - 1 + in_flight) // block_size) + 1)
    if kind == "chunked":
        return -(-min(group[2] + in_flight, max_model_len) // block_size)
    return blocks


def settings() -> list[Setting]:
    """Every combination the crosscheck runs: layout x retention x chunked x async, with the
    scheduling flags varied alongside so each appears in many combinations."""
    out = []
    for name, groups, spare, unit, k in _layouts():
        for retention in (None, 0, k):
            if retention is not None and not any(g[0] == "swa" for g in groups):
                if retention != 0:
                    continue  # retention only acts on sliding windows
            for chunked in (True, False):
                for asy in (False, True):
                    i = len(out)
                    mml = 160 * unit
                    batch = (64 * unit) if chunked else mml
                    in_flight = batch * (2 if asy else 1)
                    # the smallest pool vLLM accepts (one request of max_model_len), plus spare
                    nb = spare + sum(min_blocks_per_request(g, mml, in_flight) for g in groups)
                    out.append(
                        Setting(
                            name=f"{name}-ret{retention}-{'chunk' if chunked else 'nochunk'}-"
                            f"{'async' if asy else 'sync'}",
                            groups=groups,
                            num_blocks=nb,
                            max_model_len=mml,
                            max_num_seqs=8 if i % 5 in (1, 3) else 5,
                            max_num_batched_tokens=batch,
                            enable_chunked_prefill=chunked,
                            long_prefill_token_threshold=(24 * unit) if i % 3 == 0 else 0,
                            policy="priority" if i % 3 == 1 else "fcfs",
                            async_scheduling=asy,
                            retention=retention,
                            unit=unit,
                        )
                    )
        for chunked in (True, False):
            # speculative decoding: 2 draft tokens per step (vLLM hands drafts back between
            # steps only when scheduling is synchronous)
            base = next(
                x
                for x in out
                if x.name == f"{name}-ret0-{'chunk' if chunked else 'nochunk'}-sync"
            )
            out.append(replace(base, name=base.name + "-spec2", num_spec=2))
            # async scheduling with drafts: the scheduler fills placeholders (-1) that the
            # worker's drafter would overwrite, and counts them as in flight
            asy = next(x for x in out if x.name == base.name.replace("-sync", "-async"))
            out.append(replace(asy, name=asy.name + "-spec2", num_spec=2))
        for asy in (False, True):
            base = next(
                x for x in out if x.name == f"{name}-ret0-chunk-{'async' if asy else 'sync'}"
            )
            out.append(replace(base, name=base.name + "-abort", aborts=True))
        # retention k where the layout has a window (dense caches only run retention 0)
        ret = k if any(g[0] == "swa" for g in groups) else 0
        base = next(x for x in out if x.name == f"{name}-ret{ret}-nochunk-async")
        out.append(replace(base, name=base.name + "-spec2-abort", num_spec=2, aborts=True))
    v4 = v4_settings()
    base = next(x for x in v4 if x.name == "dsv4-ret0-chunk-async")
    abort = replace(base, name=base.name + "-abort", aborts=True)
    return out + v4 + [abort] + llama4_settings() + mamba_settings()


#: The Mamba2-attention hybrid the Mamba settings run (granite-4.0-h's layout at small scale:
#: three Mamba2 mixers, which keep a prefill checkpoint block, and one attention layer;
#: 128-token blocks on vLLM's CPU platform).
MAMBA_CONFIG = "tiny-granite-h"
#: A Mamba1-attention hybrid (Jamba's layout: three Mamba1 mixers, no checkpoint block, and one
#: attention layer; 128-token blocks).
JAMBA_CONFIG = "tiny-jamba"
#: pools per (config, prefix caching): vLLM 0.32's smallest accepted pool for one request of
#: max_model_len (granite 20 and 14, jamba 17 and 14: bisected on `scheduler._build`), plus
#: 2 spare blocks with caching and 1 without
MAMBA_BLOCKS = {
    (MAMBA_CONFIG, True): 22,
    (MAMBA_CONFIG, False): 15,
    (JAMBA_CONFIG, True): 19,
    (JAMBA_CONFIG, False): 15,
}


def mamba_settings() -> list[Setting]:
    """Mamba hybrids with prefix caching on (vLLM's "align" mode; retention None, 0 and k;
    chunked prefill, which vLLM requires there) and off ("none": one state block per request;
    chunked or not), sync or async: granite-like ("mamba-...", also with drafts and aborts)
    and Jamba-like ("jamba-...")."""
    granite = _mamba_settings("mamba", MAMBA_CONFIG)
    extra = []
    for base in granite:
        if base.retention == 0 or not base.enable_prefix_caching:
            if base.enable_chunked_prefill:
                # n-gram drafts (2 per step): each Mamba group keeps 2 more state blocks
                extra.append(
                    replace(
                        base,
                        name=base.name + "-spec2",
                        num_spec=2,
                        num_blocks=base.num_blocks + 3 * 2,
                    )
                )
            if base.enable_prefix_caching:
                extra.append(replace(base, name=base.name + "-abort", aborts=True))
    return granite + extra + _mamba_settings("jamba", JAMBA_CONFIG)


def _mamba_settings(prefix: str, config: str) -> list[Setting]:
    out = []
    unit = 8
    mml = 160 * unit
    for caching, retentions in ((True, (None, 0, 4 * 128)), (False, (0,))):
        for retention in retentions:
            # vLLM requires chunked prefill for "align" (chunks end on block boundaries)
            for chunked in (True, False) if not caching else (True,):
                for asy in (False, True):
                    i = len(out)
                    mode = f"ret{retention}" if caching else "nocache"
                    out.append(
                        Setting(
                            name=f"{prefix}-{mode}-{'chunk' if chunked else 'nochunk'}-"
                            f"{'async' if asy else 'sync'}",
                            groups=(),
                            num_blocks=MAMBA_BLOCKS[(config, caching)],
                            max_model_len=mml,
                            max_num_seqs=8 if i % 5 in (1, 3) else 5,
                            max_num_batched_tokens=(64 * unit) if chunked else mml,
                            enable_chunked_prefill=chunked,
                            long_prefill_token_threshold=(24 * unit) if i % 3 == 0 else 0,
                            policy="priority" if i % 3 == 1 else "fcfs",
                            async_scheduling=asy,
                            retention=retention,
                            unit=unit,
                            model=config,
                            enable_prefix_caching=caching,
                        )
                    )
    return out


#: The smallest pool vLLM 0.32's planner accepts for one request of max_model_len on the
#: tiny DeepSeek V4 (5 packed groups), by (chunked, async) at unit 16; measured with
#: `python -m tools.crosscheck.scheduler --min-blocks` (its compressor-state groups keep 4- and
#: 8-token blocks, so a step's in-flight tokens decide most of it).
V4_MIN_BLOCKS = {
    (True, False): 453,
    (True, True): 869,
    (False, False): 1055,
    (False, True): 1055,
}
V4_CONFIG = "tiny-deepseek-v4"


def v4_settings() -> list[Setting]:
    """DeepSeek V4's real caches (the tiny config's 5 groups: two SWA groups of 64-token
    blocks, the compressed-attention group of 256, the compressor states of 4 and 8) at
    retention None, 0 and k, chunked or not, sync or async."""
    out = []
    unit = 16
    for retention in (None, 0, 512):
        for chunked in (True, False):
            for asy in (False, True):
                i = len(out)
                mml = 160 * unit
                out.append(
                    Setting(
                        name=f"dsv4-ret{retention}-{'chunk' if chunked else 'nochunk'}-"
                        f"{'async' if asy else 'sync'}",
                        groups=(),
                        num_blocks=V4_MIN_BLOCKS[(chunked, asy)],
                        max_model_len=mml,
                        # many sequences: a pool that fits one prefill chunk's compressor
                        # states runs out when many decodes hold their blocks
                        max_num_seqs=32 if i % 5 in (1, 3) else 16,
                        max_num_batched_tokens=(64 * unit) if chunked else mml,
                        enable_chunked_prefill=chunked,
                        long_prefill_token_threshold=(24 * unit) if i % 3 == 0 else 0,
                        policy="priority" if i % 3 == 1 else "fcfs",
                        async_scheduling=asy,
                        retention=retention,
                        unit=unit,
                        model=V4_CONFIG,
                    )
                )
    return out


LLAMA4_CONFIG = "tiny-llama4"
#: the caches vLLM's CPU platform builds for it: three chunked local layers of 256-token
#: chunks, then a full one, all in 128-token blocks (for the pool size only)
LLAMA4_GROUPS = (("chunked", 128, 256),) * 3 + (("full", 128),)


def llama4_settings() -> list[Setting]:
    """Llama 4's caches as vLLM's own `Llama4ForCausalLM` makes them for the tiny config
    (tests/data/configs/tiny-llama4; refimpl reads the same file): retention None and 0,
    chunked or not, sync or async, on the smallest pool plus 3 blocks."""
    out = []
    unit = 8
    mml = 160 * unit
    for retention in (None, 0):
        for chunked in (True, False):
            for asy in (False, True):
                i = len(out)
                batch = (64 * unit) if chunked else mml
                in_flight = batch * (2 if asy else 1)
                out.append(
                    Setting(
                        name=f"tiny-llama4-ret{retention}-"
                        f"{'chunk' if chunked else 'nochunk'}-{'async' if asy else 'sync'}",
                        groups=(),
                        num_blocks=3
                        + sum(
                            min_blocks_per_request(g, mml, in_flight) for g in LLAMA4_GROUPS
                        ),
                        max_model_len=mml,
                        max_num_seqs=8 if i % 3 == 1 else 5,
                        max_num_batched_tokens=batch,
                        enable_chunked_prefill=chunked,
                        long_prefill_token_threshold=(24 * unit) if i % 3 == 0 else 0,
                        policy="priority" if i % 3 == 2 else "fcfs",
                        async_scheduling=asy,
                        retention=retention,
                        unit=unit,
                        model=LLAMA4_CONFIG,
                    )
                )
    return out


def make_stream(seed: int, setting: Setting) -> list[list[dict]]:
    """Arrivals per step: [[{"id", "prompt", "max_tokens", "priority"}, ...], ...]."""
    rng = random.Random(seed)
    u = setting.unit
    prefixes = [
        [rng.randrange(1, VOCAB) for _ in range(rng.randrange(8, 40) * u)] for _ in range(3)
    ]
    steps: list[list[dict]] = []
    n = 0
    for _ in range(rng.randrange(4, 20)):
        arrivals = []
        for _ in range(rng.choice((0, 0, 1, 2, 3, 4))):
            prompt = list(rng.choice(prefixes)) if rng.random() < 0.7 else []
            prompt += [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 32) * u)]
            prompt = prompt[: setting.max_model_len - 8 * u]
            arrivals.append(
                {
                    "id": f"s{seed}r{n}",
                    "prompt": prompt,
                    "max_tokens": rng.randrange(1, 48) * u,
                    "priority": rng.randrange(3),
                }
            )
            n += 1
        steps.append(arrivals)
    if setting.aborts:
        # drawn apart from the arrivals, so a stream's traffic is the same with or without
        abort_rng = random.Random(f"abort-{seed}")
        for t, arrivals in enumerate(steps):
            for arrival in arrivals:
                if abort_rng.random() < 0.3:
                    arrival["abort_at"] = t + abort_rng.randrange(1, 16)
    return steps


def sampled_token(req_id: str, step: int) -> int:
    """The made-up model's token for a request at a step; about one in 12 is EOS."""
    h = int.from_bytes(hashlib.blake2b(f"{req_id}:{step}".encode(), digest_size=4).digest())
    return EOS if h % 12 == 0 else 1 + h % (VOCAB - 1)


class Side:
    """One scheduler behind the driver: build requests, step, and read a step's output in a
    common, JSON-friendly form."""

    def add(self, arrival: dict, step: int) -> None:
        raise NotImplementedError

    def schedule(self) -> Any:
        raise NotImplementedError

    def samples(self, req_id: str) -> bool:
        """Whether the request's scheduled chunk reaches its end (the runner samples)."""
        raise NotImplementedError

    def update(self, out: Any, sampled: dict[str, list[int]]) -> None:
        raise NotImplementedError

    def normalize(self, out: Any) -> dict:
        raise NotImplementedError

    def update_drafts(self, req_ids: list[str], drafts: list[list[int]]) -> None:
        """The drafter's proposals after a step (synchronous scheduling)."""
        raise NotImplementedError

    def finish(self, req_id: str) -> None:
        """Abort a request from outside (a client went away)."""
        raise NotImplementedError

    def has_requests(self) -> bool:
        raise NotImplementedError


def normalize_output(out: Any) -> dict:
    """A SchedulerOutput (vLLM's or refimpl's: same field names) as plain data."""
    cached = out.scheduled_cached_reqs
    return {
        "tokens": [[k, v] for k, v in out.num_scheduled_tokens.items()],
        "new": [
            [r.req_id, r.num_computed_tokens, [list(g) for g in r.block_ids]]
            for r in out.scheduled_new_reqs
        ],
        "cached": [
            [
                rid,
                rid in cached.resumed_req_ids,
                rid in cached.all_token_ids,
                None if nb is None else [list(g) for g in nb],
                nc,
                no,
            ]
            for rid, nb, nc, no in zip(
                cached.req_ids,
                cached.new_block_ids,
                cached.num_computed_tokens,
                cached.num_output_tokens,
                strict=True,
            )
        ],
        "spec": {k: list(v) for k, v in out.scheduled_spec_decode_tokens.items()},
        "preempted": sorted(out.preempted_req_ids),
        "finished": sorted(out.finished_req_ids),
    }


def accepted_drafts(req_id: str, step: int, num_drafts: int) -> int:
    """How many of a step's draft tokens the made-up model accepts (0 to all)."""
    h = int.from_bytes(hashlib.blake2b(f"{req_id}@{step}".encode(), digest_size=4).digest())
    return h % (num_drafts + 1)


def step_tokens(req_id: str, step: int, num_drafts: int) -> list[int]:
    """The sampled tokens of a request that samples: one, plus its accepted drafts."""
    n = 1 + accepted_drafts(req_id, step, num_drafts) if num_drafts else 1
    return [sampled_token(req_id, step if j == 0 else step * 100 + j) for j in range(n)]


def drive(
    side: Side,
    stream: list[list[dict]],
    asynchronous: bool,
    num_spec: int = 0,
    max_steps: int = 3000,
):
    """Play the stream; returns the step log (one normalized output per step). With
    `num_spec`, after each step every request of the step is offered `num_spec` draft
    tokens."""
    log = []
    pending: list[tuple[Any, set[str], int]] = []
    aborts: dict[int, list[str]] = {}
    for arrivals in stream:
        for arrival in arrivals:
            if arrival.get("abort_at") is not None:
                aborts.setdefault(arrival["abort_at"], []).append(arrival["id"])
    step = 0
    while step < len(stream) or side.has_requests() or pending:
        # one id per call: both schedulers iterate a set of the ids they are given
        for rid in aborts.get(step, ()):
            side.finish(rid)
        for arrival in stream[step] if step < len(stream) else ():
            side.add(arrival, step)
        out = side.schedule()
        rec = side.normalize(out)
        if out.total_num_scheduled_tokens:
            pending.append(
                (out, {r for r in out.num_scheduled_tokens if side.samples(r)}, step)
            )
        log.append(rec)
        depth = 2 if asynchronous else 1
        if pending and (len(pending) >= depth or not out.total_num_scheduled_tokens):
            o, samplers, s = pending.pop(0)
            spec = o.scheduled_spec_decode_tokens
            side.update(
                o,
                {
                    r: (step_tokens(r, s, len(spec.get(r, ()))) if r in samplers else [])
                    for r in o.num_scheduled_tokens
                },
            )
            if num_spec and not asynchronous:
                ids = list(o.num_scheduled_tokens)
                side.update_drafts(
                    ids, [[sampled_token(r, -s - j) for j in range(num_spec)] for r in ids]
                )
        step += 1
        if step > max_steps:
            raise RuntimeError(f"stream did not drain in {max_steps} steps")
    return log


def digest(log: list[dict]) -> str:
    return hashlib.sha256(json.dumps(log, sort_keys=True).encode()).hexdigest()[:16]


def summary(log: list[dict]) -> dict:
    """What a step log shows at a glance (stored beside its digest)."""
    return {
        "steps": len(log),
        "preemptions": sum(len(r["preempted"]) for r in log),
        "hit_tokens": sum(n[1] for r in log for n in r["new"]),
        "resumed": sum(1 for r in log for c in r["cached"] if c[1]),
    }


def refimpl_specs(setting: Setting) -> dict:
    """{layer name: refimpl spec} for a setting: its groups, or its model's caches."""
    from refimpl.hybrid import ChunkedLocalAttentionSpec, FullAttentionSpec, SlidingWindowSpec

    if setting.model and setting.model != V4_CONFIG:
        from refimpl.models import get_kv_cache_spec

        # what vLLM's CPU platform builds (its attention backend picks the block size)
        return dict(
            get_kv_cache_spec(
                CONFIGS / setting.model,
                backend="cpu_attn",
                max_model_len=setting.max_model_len,
                enable_prefix_caching=setting.enable_prefix_caching,
                num_speculative_tokens=setting.num_spec,
            ).specs
        )
    if setting.model:
        from refimpl.hybrid.deepseek_v4 import DeepseekV4Config, kv_cache_specs

        raw = json.loads((CONFIGS / setting.model / "config.json").read_text())
        # vLLM 0.32's CPU build runs V4 with DeepSeek's fp8_ds_mla rows and an fp8 indexer
        return kv_cache_specs(DeepseekV4Config.from_hf_config(raw), cache_dtype="fp8_ds_mla")
    specs = {}
    for i, g in enumerate(setting.groups):
        common = dict(block_size=g[1], num_kv_heads=1, head_size=8, dtype="float16")
        if g[0] == "chunked":
            specs[f"layer{i}"] = ChunkedLocalAttentionSpec(attention_chunk_size=g[2], **common)
            continue
        specs[f"layer{i}"] = (
            FullAttentionSpec(**common)
            if g[0] == "full"
            else SlidingWindowSpec(sliding_window=g[2], **common)
        )
    return specs


class RefimplSide(Side):
    """refimpl's scheduler on refimpl's planner output for the setting."""

    def __init__(self, setting: Setting, scheduler_cls: type | None = None) -> None:
        """`scheduler_cls` replaces the class `make_scheduler` picks (tests pass a scheduler
        with a rule undone)."""
        from refimpl.hybrid.kv_cache_planning import get_kv_cache_config, get_kv_cache_groups
        from refimpl.sched import SchedulerConfig, make_scheduler

        config = get_kv_cache_config(
            get_kv_cache_groups(refimpl_specs(setting), kv_cache_layout=LAYOUT),
            1 << 40,
            num_blocks_override=setting.num_blocks,
            kv_cache_layout=LAYOUT,
        )
        make = make_scheduler if scheduler_cls is None else scheduler_cls
        self.s = make(
            SchedulerConfig(
                max_num_batched_tokens=setting.max_num_batched_tokens,
                max_num_seqs=setting.max_num_seqs,
                max_model_len=setting.max_model_len,
                enable_chunked_prefill=setting.enable_chunked_prefill,
                long_prefill_token_threshold=setting.long_prefill_token_threshold,
                policy=setting.policy,
                async_scheduling=setting.async_scheduling,
                prefix_cache_retention_interval=setting.retention,
                num_speculative_tokens=setting.num_spec,
                enable_prefix_caching=setting.enable_prefix_caching,
            ),
            config,
        )

    def add(self, arrival: dict, step: int) -> None:
        self.s.add_request(
            self.s.make_request(
                arrival["id"],
                arrival["prompt"],
                max_tokens=arrival["max_tokens"],
                eos_token_id=EOS,
                priority=arrival["priority"],
                arrival_time=float(step),
            )
        )

    def schedule(self):
        return self.s.schedule()

    def samples(self, req_id: str) -> bool:
        return not self.s.requests[req_id].is_prefill_chunk

    def update(self, out, sampled: dict[str, list[int]]) -> None:
        from refimpl.sched import ModelRunnerOutput

        ids = list(sampled)
        self.s.update_from_output(
            out,
            ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, list(sampled.values())),
        )

    def normalize(self, out) -> dict:
        return normalize_output(out)

    def update_drafts(self, req_ids: list[str], drafts: list[list[int]]) -> None:
        self.s.update_draft_token_ids(req_ids, drafts)

    def finish(self, req_id: str) -> None:
        self.s.finish_requests(req_id)

    def has_requests(self) -> bool:
        return self.s.has_requests()
