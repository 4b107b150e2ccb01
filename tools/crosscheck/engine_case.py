"""What retention costs the V4 engine, asked of vLLM: the calls `V4LLM`'s scheduler
(`refimpl.sched.Scheduler`) makes on its `KVCacheManager`, replayed on vLLM's.

The case (chapter 13's tiny V4, config "A" of tests/v4_models.py, 256-token scheduler blocks):
request A has a 512-token prefix followed by 300 tokens of its own; B is the 512-token prefix
alone; C is the prefix plus 12 tokens. They run one after another, one generated token each.

`trace_engine_case` runs `refimpl.sched.Scheduler`, as `V4LLM` builds it, without a model
(the sampled token is a fixed id: prefix hits only read prompt tokens) on a `KVCacheManager`
wrapped by `TracingManager`,
which writes each call as a harness operation (`streams.py`); `tools.crosscheck record` plays
those operations on vLLM's `KVCacheManager` at each retention setting and stores vLLM's answers
in tests/data/vllm_oracle.json ("engine"). tests/test_v4_retention.py replays them through
refimpl and runs the real `V4LLM`, whose prefix-cache hits must equal vLLM's.
"""

from __future__ import annotations

import random

from refimpl.hybrid.request import RequestStatus
from tools.crosscheck.streams import GroupSet

# The tiny V4's five groups (two window groups, MLA, the ratio-4 and ratio-128 compressor
# states), the pool size V4LLM gets in the test and its max_num_batched_tokens (the in-flight
# cap of the admission check).
ENGINE_GROUPS = GroupSet(
    "v4-tiny-A",
    (("swa", 64, 16), ("swa", 64, 16), ("full", 256), ("swa", 4, 8), ("swa", 8, 128)),
    1024,
    max_model_len=2048,
    max_in_flight_tokens=512,
)
NUM_KVCACHE_BLOCKS = 1024
MAX_NUM_BATCHED_TOKENS = 512
RETENTIONS = {"none": None, "0": 0, "2x": 512}


def engine_prompts() -> dict[str, list[int]]:
    """A = 512 shared tokens + 300 of its own; B = the 512 shared tokens; C = shared + 12."""
    rng = random.Random(30)
    shared = [rng.randrange(256) for _ in range(512)]
    return {
        "A": shared + [rng.randrange(256) for _ in range(300)],
        "B": list(shared),
        "C": shared + [rng.randrange(256) for _ in range(12)],
    }


class TracingManager:
    """Forwards every call to a refimpl `KVCacheManager` and writes the harness operation each
    call amounts to (only what V4's scheduler calls, with its arguments)."""

    def __init__(self, manager) -> None:
        self.m = manager
        self.ops: list[tuple] = []

    def __getattr__(self, name):
        return getattr(self.m, name)

    def make_request(self, request_id, prompt_token_ids):
        self.ops.append(("new", request_id, list(prompt_token_ids)))
        return self.m.make_request(request_id, prompt_token_ids)

    def allocate_slots(
        self,
        request,
        num_new_tokens,
        num_new_computed_tokens=0,
        new_computed_blocks=None,
        num_lookahead_tokens=0,
        full_sequence_must_fit=False,
        has_scheduled_reqs=True,
    ):
        rid = request.request_id
        lookahead, must_fit = num_lookahead_tokens, full_sequence_must_fit
        if request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            # the lookup just before it, junction pinned as the scheduler does
            op = ("schedule", rid, num_new_tokens, lookahead, must_fit, has_scheduled_reqs)
            op += (0, False, True)
        elif request.num_computed_tokens >= request.num_prompt_tokens:
            op = ("decode", rid, num_new_tokens, lookahead)
        else:
            op = ("schedule", rid, num_new_tokens, lookahead, must_fit, True, 0, False, True)
        self.ops.append(op)
        return self.m.allocate_slots(
            request,
            num_new_tokens,
            num_new_computed_tokens=num_new_computed_tokens,
            new_computed_blocks=new_computed_blocks,
            num_lookahead_tokens=num_lookahead_tokens,
            full_sequence_must_fit=full_sequence_must_fit,
            has_scheduled_reqs=has_scheduled_reqs,
        )

    def free(self, request):
        self.ops.append(("finish", request.request_id))
        return self.m.free(request)


def trace_engine_case(retention: int | None) -> list[tuple]:
    """The harness operations of A, B and C run one after another by the scheduler V4LLM
    builds (its `KVCacheManager` wrapped by `TracingManager`)."""
    from refimpl.hybrid.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )
    from refimpl.sched import ModelRunnerOutput, Scheduler, SchedulerConfig

    def spec(desc):
        common = dict(num_kv_heads=1, head_size=8, dtype="float16")
        if desc[0] == "full":
            return FullAttentionSpec(block_size=desc[1], **common)
        return SlidingWindowSpec(block_size=desc[1], sliding_window=desc[2], **common)

    groups = [
        KVCacheGroupSpec((f"layer{i}",), spec(d)) for i, d in enumerate(ENGINE_GROUPS.groups)
    ]
    config = SchedulerConfig(
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        max_num_seqs=16,
        max_model_len=ENGINE_GROUPS.max_model_len,
        prefix_cache_retention_interval=retention,
    )
    scheduler = Scheduler(config, KVCacheConfig(NUM_KVCACHE_BLOCKS, (), groups))
    manager = scheduler.kv_cache_manager = TracingManager(scheduler.kv_cache_manager)
    for i, prompt in enumerate(engine_prompts().values()):
        scheduler.add_request(scheduler.make_request(f"req-{i}", prompt, max_tokens=1))
        while scheduler.has_requests():
            out = scheduler.schedule()
            ids = list(out.num_scheduled_tokens)
            done = [scheduler.requests[r] for r in ids]
            sampled = [[7] if r.num_computed_tokens == r.num_tokens else [] for r in done]
            runner = ModelRunnerOutput(ids, {r: k for k, r in enumerate(ids)}, sampled)
            scheduler.update_from_output(out, runner)
    assert scheduler.num_preemptions == 0
    return manager.ops
