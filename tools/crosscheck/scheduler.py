"""Crosscheck refimpl's scheduler against vLLM 0.32's own `Scheduler`, step for step.

vLLM's side is built as vLLM's unit tests and `EngineCore` build it, minus the executor:
`EngineArgs(load_format="dummy", skip_tokenizer_init=True)` on a local config.json gives the
`VllmConfig`; vLLM's planner (`get_kv_cache_configs` with `num_gpu_blocks_override`) gives
the `KVCacheConfig`; `resolve_kv_cache_block_sizes` the scheduler and hash block sizes; the
class is the one `SchedulerConfig.get_scheduler_cls()` picks (`AsyncScheduler` under async
scheduling). Requests are vLLM `Request`s hashed with vLLM's default sha256 block hasher, and
each step's `ModelRunnerOutput` is made up by the shared driver (`sched_streams.drive`).

Run (vLLM's venv):
  PYTHONPATH=$PWD .venv-vllm/bin/python -m tools.crosscheck.scheduler --streams 300 \
      [--record tests/data/vllm_sched_oracle.json]
Every step's `SchedulerOutput` must be equal (requests, tokens, computed/cached tokens,
resumed and preempted ids, finished ids, block ids per group); the first difference stops
the run with both sides' step.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from tools.crosscheck.sched_streams import (
    CONFIGS,
    EOS,
    LAYOUT,
    RefimplSide,
    Setting,
    Side,
    digest,
    drive,
    make_stream,
    normalize_output,
    settings,
    summary,
    v4_settings,
)

CONFIG_DIR = Path(__file__).resolve().parents[2] / "tests/data/configs/tiny-llama"


_BUILT: dict = {}


def _build(setting: Setting):
    """VllmConfig, scheduler KVCacheConfig and block sizes for a setting (built once: the
    config parse is the slow part; each stream gets a fresh Scheduler on them)."""
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        get_kv_cache_configs,
        resolve_kv_cache_block_sizes,
    )
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        SlidingWindowSpec,
    )

    vc = EngineArgs(
        model=str(CONFIGS / setting.model) if setting.model else str(CONFIG_DIR),
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        max_model_len=setting.max_model_len,
        max_num_seqs=setting.max_num_seqs,
        max_num_batched_tokens=setting.max_num_batched_tokens,
        enable_chunked_prefill=setting.enable_chunked_prefill,
        long_prefill_token_threshold=setting.long_prefill_token_threshold,
        scheduling_policy=setting.policy,
        async_scheduling=setting.async_scheduling,
        enable_prefix_caching=setting.enable_prefix_caching,
        num_gpu_blocks_override=setting.num_blocks,
        # an n-gram drafter needs no draft model; it reserves no lookahead slots
        speculative_config=(
            {
                # vLLM accepts async scheduling with the GPU n-gram drafter only
                "method": "ngram_gpu" if setting.async_scheduling else "ngram",
                "num_speculative_tokens": setting.num_spec,
                "prompt_lookup_max": 3,
                "prompt_lookup_min": 1,
            }
            if setting.num_spec
            else None
        ),
    ).create_engine_config()
    # vLLM's CPU platform turns async scheduling off ("not required on CPU"); the scheduler
    # itself is platform-free, so the setting is restored as a GPU platform keeps it
    vc.scheduler_config.async_scheduling = setting.async_scheduling
    # and for MLA models (DeepSeek V4) it turns chunked prefill and prefix caching off and
    # raises the batch to max_model_len; the scheduler runs them as a GPU platform keeps them
    vc.scheduler_config.enable_chunked_prefill = setting.enable_chunked_prefill
    vc.scheduler_config.max_num_batched_tokens = setting.max_num_batched_tokens
    vc.cache_config.enable_prefix_caching = setting.enable_prefix_caching
    vc.cache_config.prefix_cache_retention_interval = setting.retention
    vc.cache_config.kv_cache_layout = LAYOUT
    specs = {}
    if setting.model:
        # the model's own layers on the meta device, their specs as the model runner asks
        from vllm.config import set_current_vllm_config

        from tools.crosscheck.vllm_models import build_layers, layer_spec_objects

        specs = layer_spec_objects(vc, build_layers(vc))
    for i, g in enumerate(setting.groups):
        common = dict(block_size=g[1], num_kv_heads=1, head_size=8, dtype=torch.float16)
        if g[0] == "chunked":
            specs[f"layer{i}"] = ChunkedLocalAttentionSpec(attention_chunk_size=g[2], **common)
            continue
        specs[f"layer{i}"] = (
            FullAttentionSpec(**common)
            if g[0] == "full"
            else SlidingWindowSpec(sliding_window=g[2], **common)
        )
    if setting.model:
        with set_current_vllm_config(vc):
            configs = get_kv_cache_configs(vc, [specs], [1 << 40])
    else:
        configs = get_kv_cache_configs(vc, [specs], [1 << 40])
    kcc = generate_scheduler_kv_cache_config(configs)
    vc.cache_config.num_gpu_blocks = kcc.num_blocks
    vc.cache_config.block_size = min(g.kv_cache_spec.block_size for g in kcc.kv_cache_groups)
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kcc, vc)
    kcc.hash_block_size = hash_block_size
    return vc, kcc, block_size, hash_block_size


class VllmSide(Side):
    def __init__(self, setting: Setting) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request
        from vllm.v1.structured_output import StructuredOutputManager

        self._Request, self._SamplingParams, self._MRO = (
            Request,
            SamplingParams,
            ModelRunnerOutput,
        )
        if setting not in _BUILT:
            _BUILT[setting] = _build(setting)
        vc, kcc, block_size, hash_block_size = _BUILT[setting]
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(hash_block_size, sha256)
        cls = vc.scheduler_config.get_scheduler_cls()
        self.s = cls(
            vllm_config=vc,
            kv_cache_config=kcc,
            structured_output_manager=StructuredOutputManager(vc),
            block_size=block_size,
            hash_block_size=hash_block_size,
        )
        self.num_blocks = kcc.num_blocks
        self.hash_block_size = hash_block_size

    def add(self, arrival: dict, step: int) -> None:
        sp = self._SamplingParams(max_tokens=arrival["max_tokens"])
        sp.update_from_generation_config({}, eos_token_id=EOS)
        self.s.add_request(
            self._Request(
                arrival["id"],
                list(arrival["prompt"]),
                sp,
                None,
                arrival_time=float(step),
                priority=arrival["priority"],
                block_hasher=self.hasher,
            )
        )

    def schedule(self):
        return self.s.schedule()

    def samples(self, req_id: str) -> bool:
        return not self.s.requests[req_id].is_prefill_chunk

    def update(self, out, sampled: dict[str, list[int]]) -> None:
        ids = list(sampled)
        mro = self._MRO(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=list(sampled.values()),
        )
        self.s.update_from_output(out, mro)

    def normalize(self, out) -> dict:
        return normalize_output(out)

    def update_drafts(self, req_ids: list[str], drafts: list[list[int]]) -> None:
        from vllm.v1.outputs import DraftTokenIds

        self.s.update_draft_token_ids(DraftTokenIds(req_ids, drafts))

    def finish(self, req_id: str) -> None:
        from vllm.v1.request import RequestStatus

        self.s.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)

    def has_requests(self) -> bool:
        return self.s.get_num_unfinished_requests() > 0 or bool(self.s.finished_req_ids)


def check_stream(setting: Setting, seed: int) -> list[dict]:
    stream = make_stream(seed, setting)
    ours = RefimplSide(setting)
    theirs = VllmSide(setting)
    if ours.s.hash_block_size != theirs.hash_block_size:
        raise AssertionError(
            f"hash block size {ours.s.hash_block_size} != {theirs.hash_block_size}"
        )
    if ours.s.kv_cache_manager.num_gpu_blocks != theirs.num_blocks:
        raise AssertionError("num_blocks differ")
    a = drive(theirs, stream, setting.async_scheduling, setting.num_spec)
    b = drive(ours, stream, setting.async_scheduling, setting.num_spec)
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            raise AssertionError(
                f"{setting.name} seed {seed} step {i}:\n vLLM    {x}\n refimpl {y}"
            )
    if len(a) != len(b):
        raise AssertionError(f"{setting.name} seed {seed}: {len(a)} vs {len(b)} steps")
    return a


def min_blocks() -> dict:
    """The smallest `num_gpu_blocks_override` vLLM's planner accepts for each V4 setting kind
    (it refuses a pool that cannot hold one request of max_model_len)."""
    found = {}
    for setting in v4_settings():
        key = (setting.enable_chunked_prefill, setting.async_scheduling)
        if key in found:
            continue
        lo, hi = 1, 1 << 14  # hi is accepted, lo is not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                _build(replace(setting, num_blocks=mid))
                hi = mid
            except ValueError:
                lo = mid
        found[key] = hi
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--streams", type=int, default=20)
    p.add_argument("--only", default="", help="substrings of setting names, comma-separated")
    p.add_argument("--record", default="")
    p.add_argument("--min-blocks", action="store_true", help="print V4_MIN_BLOCKS and stop")
    args = p.parse_args(argv)
    logging.getLogger("vllm").setLevel(logging.ERROR)
    if args.min_blocks:
        print(min_blocks())
        return 0
    oracle = {
        "generator": "tools/crosscheck/sched_streams.py (stream seed = index in digests)",
        "settings": [],
    }
    t0 = time.time()
    for setting in settings():
        if args.only and not any(o in setting.name for o in args.only.split(",")):
            continue
        t = time.time()
        entry = {"setting": setting.to_json(), "digests": [], "totals": {}}
        for seed in range(args.streams):
            log = check_stream(setting, seed)
            entry["digests"].append(digest(log))
            for k, v in summary(log).items():
                entry["totals"][k] = entry["totals"].get(k, 0) + v
        print(
            f"{setting.name}: {args.streams} streams equal {entry['totals']} "
            f"{time.time() - t:.1f}s",
            flush=True,
        )
        oracle["settings"].append(entry)
    print(f"all equal, {time.time() - t0:.0f}s")
    if args.record:
        # settings recorded by an earlier (partial) run are kept unless rerun now
        path = Path(args.record)
        if path.exists():
            done = {e["setting"]["name"] for e in oracle["settings"]}
            old = json.loads(path.read_text())["settings"]
            oracle["settings"] = [e for e in old if e["setting"]["name"] not in done] + oracle[
                "settings"
            ]
        order = [s.name for s in settings()]
        oracle["settings"].sort(key=lambda e: order.index(e["setting"]["name"]))
        path.write_text(json.dumps(oracle, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    sys.exit(main())
