"""Part III holds its callers to Part I's contract (issue 29): the scheduler refuses a second
`add`, a repeated `postprocess` and a request that could never fit, with the whole state
unchanged; the engine's switches do what their names say; a cut-short checkpoint gets one
clear line. The scheduler runs here on a tiny hand-made cache (no model needed)."""

from __future__ import annotations

import pytest
import torch
from hybrid_helpers import full, swa

from refimpl.hybrid.kv_cache_manager import KVCacheManager
from refimpl.paged.sequence import SamplingParams
from refimpl.v4.scheduler import Scheduler, V4Request
from tests.v4_models import hf_model, model_dir, prompts


def scheduler(num_blocks: int = 20, budget: int = 8) -> Scheduler:
    manager = KVCacheManager(
        [full(4), swa(4, 8)], num_blocks, 64, max_num_batched_tokens=budget
    )
    return Scheduler(manager, max_num_seqs=4, max_num_batched_tokens=budget)


def request(s: Scheduler, rid: str, n: int, max_tokens: int = 4) -> V4Request:
    r = s.kv_cache_manager.make_request(rid, list(range(n)))
    return V4Request(r, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))


def state(s: Scheduler, reqs: list[V4Request]):
    """Everything a refusal must leave alone: the queues, every request, every block."""
    m = s.kv_cache_manager
    pool = m.block_pool
    return (
        [q.request_id for q in s.waiting],
        [q.request_id for q in s.running],
        s.num_preemptions,
        {
            q.request_id: (
                q.request.num_computed_tokens,
                list(q.request.output_token_ids),
                q.request.status,
                m.get_block_ids(q.request_id),
            )
            for q in reqs
        },
        [b.block_id for b in pool.free_block_queue],
        [b.ref_cnt for b in pool.blocks],
        [b.block_hash for b in pool.blocks],
    )


def refused(s, reqs, call, match, error=ValueError):
    before = state(s, reqs)
    with pytest.raises(error, match=match):
        call()
    assert state(s, reqs) == before


def test_a_request_is_added_once():
    s = scheduler()
    a = request(s, "a", 6)
    s.add(a)
    refused(s, [a], lambda: s.add(a), "request a is already scheduled")
    twin = request(s, "a", 6)  # another request under a queued id
    refused(s, [a], lambda: s.add(twin), "request a is already scheduled")
    chunks = s.schedule()
    refused(s, [a], lambda: s.add(a), "RUNNING .* cannot be added again")
    refused(s, [a], lambda: s.add(a.request), "req must be a V4Request", TypeError)
    assert [c.req for c in chunks] == [a]


def test_postprocess_takes_the_latest_step_once():
    s = scheduler()
    a, b = request(s, "a", 6), request(s, "b", 2)
    s.add(a)
    s.add(b)
    chunks = s.schedule()
    assert [(c.req.request_id, c.num_tokens) for c in chunks] == [("a", 6), ("b", 2)]
    refused(s, [a, b], lambda: s.postprocess(chunks, [7]), "got 1 sampled tokens for 2")
    refused(s, [a, b], lambda: s.postprocess(chunks, [7, -1]), r"token_ids\[1\] must be")
    refused(s, [a, b], lambda: s.postprocess(chunks[:1], [7]), "latest schedule")
    s.postprocess(chunks, [7, 8])
    assert a.request.num_computed_tokens == 6 and a.request.output_token_ids == [7]
    refused(s, [a, b], lambda: s.postprocess(chunks, [7, 8]), "latest schedule")
    # the next step goes on as if the misuse never happened
    nxt = s.schedule()
    assert [(c.req.request_id, c.first_position, c.num_tokens) for c in nxt] == [
        ("a", 6, 1),
        ("b", 2, 1),
    ]


def test_a_request_that_could_never_fit_is_refused_at_add():
    s = scheduler(num_blocks=6)
    small = request(s, "small", 3)
    s.add(small)
    big = request(s, "big", 20)  # more blocks than the pool's 5 usable ones, even with windows
    refused(
        s,
        [small],
        lambda: s.add(big),
        "request big can grow to .* blocks .* but the pool has only 5; it could never run",
    )
    while not s.is_finished():  # `small` runs to the end: schedule() never stalls on `big`
        chunks = s.schedule()
        assert chunks
        s.postprocess(chunks, [1] * sum(c.samples for c in chunks))
    assert small.request.output_token_ids == [1] * 4


def test_the_engine_refuses_a_request_it_cannot_hold_before_queueing():
    from refimpl.v4.llm import V4LLM

    llm = V4LLM(model_dir("A"), hf_model=hf_model("A"), num_kvcache_blocks=12)
    with pytest.raises(ValueError, match="but the pool has only 11; it could never run"):
        llm.add_request(prompts()["P1"], SamplingParams(max_tokens=2))
    assert llm.is_finished() and llm._next_id == 0


# --- names and switches


def test_the_index_kernel_switch_is_named_for_what_it_switches():
    from refimpl.v4.llm import V4LLM

    with pytest.raises(TypeError, match="attention_backend"):
        V4LLM(model_dir("A"), hf_model=hf_model("A"), attention_backend="torch")
    llm = V4LLM(model_dir("A"), hf_model=hf_model("A"), index_kernel_backend="torch")
    assert llm.index_kernel_backend == "torch"
    assert not hasattr(llm, "attention_backend")


def test_the_cache_lives_where_it_is_asked_to():
    from refimpl.v4.cache import build_kv_cache

    kv = build_kv_cache(hf_model("A").config, 4, device="meta")
    assert kv.device == torch.device("meta")
    assert {v.device.type for v in kv.views.values()} == {"meta"}


def test_use_tqdm_shows_a_bar_or_is_refused(capsys):
    from refimpl.v4.llm import V4LLM

    llm = V4LLM(model_dir("A"), hf_model=hf_model("A"), num_kvcache_blocks=32)
    sp = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    quiet = llm.generate([[5, 6, 7]], sp)
    assert "Generating" not in capsys.readouterr().err
    shown = llm.generate([[5, 6, 7]], sp, use_tqdm=True)
    assert "Generating" in capsys.readouterr().err and shown == quiet
    with pytest.raises(TypeError, match="use_tqdm must be True or False"):
        llm.generate([[5, 6, 7]], sp, use_tqdm="yes")
    assert llm.is_finished()


# --- checkpoints


def test_a_truncated_checkpoint_gets_one_clear_line(tmp_path):
    import shutil
    from pathlib import Path

    from refimpl.v4.llm import V4LLM

    for f in Path(model_dir("A")).iterdir():
        shutil.copy(f, tmp_path / f.name)
    (weights,) = tmp_path.glob("*.safetensors")
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 100])
    with pytest.raises(ValueError, match=f"{weights.name} is truncated: it holds"):
        V4LLM(tmp_path)
    weights.write_bytes(data[:5])
    with pytest.raises(ValueError, match="too short for its header"):
        V4LLM(tmp_path)
