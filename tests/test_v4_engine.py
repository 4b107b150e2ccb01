"""End-to-end: the paged V4 engine's greedy output equals transformers' token for token.

Each of three tiny configurations runs in every mode: prefix caching on and off, one-shot and
uneven chunk budgets, three interleaved requests, and a request that resumes at a 256-token
prefix hit. The logits that chose every token must agree to 1e-4 (measured: about 1e-5).
"""

from __future__ import annotations

import pytest

from refimpl.paged.sequence import SamplingParams
from tests.v4_models import CONFIGS, hf_model, model_dir, one_thread, oracle, prompts  # noqa: F401  (autouse fixture)

MAX_TOKENS = 6
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


def make_llm(name: str, **kwargs):
    from refimpl.v4.llm import V4LLM

    llm = V4LLM(
        model_dir(name),
        hf_model=hf_model(name),
        num_kvcache_blocks=kwargs.pop("num_kvcache_blocks", 160),
        **kwargs,
    )
    llm.record_logits = True
    return llm


def assert_matches_oracle(name: str, names: list[str], outputs: list[dict]) -> float:
    worst = 0.0
    for prompt, out in zip(names, outputs):
        tokens, logits = oracle(name, prompt, MAX_TOKENS)
        assert out["token_ids"] == tokens, f"{name}/{prompt}"
        assert len(out["logits"]) == len(tokens)  # one row per token, none lost
        for mine, theirs in zip(out["logits"], logits):
            worst = max(worst, (mine - theirs).abs().max().item())
    assert worst < 1e-4
    return worst


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("caching", [False, True], ids=["no-prefix-cache", "prefix-cache"])
@pytest.mark.parametrize("budget", [7, 64, 512])
def test_interleaved_requests_equal_transformers(name, caching, budget):
    # vLLM's SchedulerConfig wants max_num_batched_tokens >= max_num_seqs
    llm = make_llm(
        name,
        enable_prefix_caching=caching,
        max_num_batched_tokens=budget,
        max_num_seqs=min(budget, 16),
    )
    names = ["P1", "P2", "P3"]
    outputs = llm.generate([prompts()[p] for p in names], GREEDY)
    assert_matches_oracle(name, names, outputs)
    assert llm.stats.prefill_tokens + llm.stats.cached_tokens == sum(
        len(prompts()[p]) for p in names
    )
    if not caching:
        assert llm.stats.cached_tokens == 0
    assert llm.scheduler.kv_cache_manager.usage == 0.0  # every block back in the pool


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("budget", [13, 512])
def test_resume_at_256_token_prefix_hit(name, budget):
    llm = make_llm(name, max_num_batched_tokens=budget, max_num_seqs=min(budget, 16))
    first = llm.generate([prompts()["P1"]], GREEDY)
    assert_matches_oracle(name, ["P1"], first)
    second = llm.generate([prompts()["P3"]], GREEDY)
    assert llm.stats.cached_tokens == 256  # one full 256-token block of every group came back
    assert llm.stats.prefill_tokens == len(prompts()["P3"]) - 256
    assert_matches_oracle(name, ["P3"], second)


def test_preemption_recomputes_and_still_matches():
    """A pool that holds three short requests' prompts but not their growth: vLLM's admission
    checks only that a whole prompt fits, so decoding (new blocks in both compressor-state
    groups at once) runs the pool dry, one request is preempted and recomputed, and every
    output still equals transformers'."""
    import torch

    from refimpl.v4.oracle import oracle_generate

    llm = make_llm(
        "A", num_kvcache_blocks=19, max_num_batched_tokens=32, enable_prefix_caching=False
    )
    g = torch.Generator().manual_seed(3)
    short = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (20, 12, 28)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outputs = llm.generate(short, params)
    assert llm.stats.preemptions == 1
    for prompt, out in zip(short, outputs):
        tokens, logits = oracle_generate(hf_model("A"), prompt, 12)
        assert out["token_ids"] == tokens
        assert max((a - b).abs().max().item() for a, b in zip(out["logits"], logits)) < 1e-4


def test_a_waiting_prompt_is_admitted_only_when_it_fits_whole():
    """vLLM's admission check (`scheduler_reserve_full_isl`): P3 waits until its whole
    268-token prompt fits the free blocks, so the 60-block pool that Part III's former
    scheduler ran dry (it admitted P3 chunk by chunk, then preempted) never preempts here."""
    llm = make_llm(
        "A", num_kvcache_blocks=60, max_num_batched_tokens=64, enable_prefix_caching=False
    )
    names = ["P1", "P3", "P2"]
    outputs = llm.generate([prompts()[p] for p in names], GREEDY)
    assert llm.stats.preemptions == 0
    assert_matches_oracle("A", names, outputs)


def test_the_runner_forgets_a_finished_request_one_step_later():
    """V1 model runner semantics: a request's state stays with the runner until its id comes
    back in the next step's `finished_req_ids`."""
    llm = make_llm("A", max_num_batched_tokens=64)
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    a = llm.add_request([5, 6, 7], one)
    b = llm.add_request(prompts()["P2"], GREEDY)
    assert llm.step() == [a]  # a samples its only token in the first step
    assert a.request_id in llm.model_runner.requests
    llm.step()
    assert a.request_id not in llm.model_runner.requests
    assert b.request_id in llm.model_runner.requests
    while not llm.is_finished():
        llm.step()
    assert llm.model_runner.requests == {}  # the last flush reached the runner too


def test_preempted_request_gives_back_every_block_keeps_its_tokens_and_is_recomputed():
    """Chapter 13's run: two 12-token requests in 16 usable blocks. At position 16 both cross a
    block boundary in both compressor-state groups; the first takes the last two free blocks
    and the second, the last running request, is preempted in the middle of its decode."""
    import torch

    from refimpl.hybrid.request import RequestStatus
    from refimpl.v4.oracle import oracle_generate

    llm = make_llm("A", num_kvcache_blocks=17, max_num_batched_tokens=32)
    g = torch.Generator().manual_seed(7)
    short = [torch.randint(0, 256, (12,), generator=g).tolist() for _ in range(2)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    x, y = [llm.add_request(prompt, params) for prompt in short]
    manager, pool = llm.scheduler.kv_cache_manager, llm.scheduler.kv_cache_manager.block_pool
    for _ in range(5):
        llm.step()
    assert llm.scheduler.num_preemptions == 0 and pool.get_num_free_blocks() == 2
    held = [b for table in manager.get_block_ids(y.request_id) for b in table if b != 0]
    assert len(held) == 7

    llm.step()
    assert llm.scheduler.num_preemptions == 1
    assert y.request.status is RequestStatus.PREEMPTED and y.request.num_computed_tokens == 0
    assert len(y.request.output_token_ids) == 5  # the generated tokens survive
    assert list(llm.scheduler.waiting) == [y.request] and llm.scheduler.running == [x.request]
    assert manager.get_block_ids(y.request_id) == ([], [], [], [], [])
    assert all(pool.blocks[b].ref_cnt == 0 for b in held)
    assert pool.get_num_free_blocks() == 7  # x took the two free blocks, y gave back its 7

    while y.request.status is not RequestStatus.RUNNING:
        llm.step()
    # 11 blocks for y's 17 tokens: only after x
    assert x.request.status is RequestStatus.FINISHED
    assert y.request.num_computed_tokens == 17 and len(y.request.output_token_ids) == 6
    while not llm.is_finished():
        llm.step()
    assert llm.scheduler.num_preemptions == 1 and llm.stats.cached_tokens == 0
    for req, prompt in ((x, short[0]), (y, short[1])):
        tokens, logits = oracle_generate(hf_model("A"), prompt, 12)
        assert list(req.request.output_token_ids) == tokens
        assert max((a - b).abs().max().item() for a, b in zip(req.logits, logits)) < 1e-4
    assert pool.get_num_free_blocks() == 16


def test_generate_shape_and_text():
    llm = make_llm("A")
    llm.record_logits = False  # the default: no logits kept anywhere
    req = llm.add_request("hi", SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    out = llm.generate(["hello"], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert req.logits == [] and len(req.request.output_token_ids) == 2
    assert set(out[0]) == {"text", "token_ids"}
    assert len(out[0]["token_ids"]) == 3
    assert out[0]["text"] == llm.tokenizer.decode(out[0]["token_ids"])
