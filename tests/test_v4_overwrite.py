"""Which rows a 256-token prefix hit reads: poison them with NaN and watch the output.

Config A: sliding window 16, layer 1 CSA (ratio 4), layer 2 HCA (ratio 128), head dim 32,
indexer head dim 16. P1 runs first; P3 shares its first 256 tokens and resumes at 256.
"""

from __future__ import annotations

import pytest
import torch

from refimpl.course.v4_overwrite import hit_block_tables, poison_rows
from refimpl.paged.sequence import SamplingParams
from tests.v4_models import hf_model, model_dir, one_thread, prompts  # noqa: F401  (autouse fixture)

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
D, DI = 32, 16
FIRST_HALF = [slice(0, D), slice(2 * D, 3 * D)]  # kv_a and score_a of a ratio-4 state row
SECOND_HALF = [slice(D, 2 * D), slice(3 * D, 4 * D)]
IDX_FIRST_HALF = [slice(0, DI), slice(2 * DI, 3 * DI)]


def run_p3(poison=None):
    from refimpl.v4.llm import V4LLM

    llm = V4LLM(
        model_dir("A"),
        hf_model=hf_model("A"),
        num_kvcache_blocks=160,
        max_num_batched_tokens=512,
    )
    llm.record_logits = True
    llm.generate([prompts()["P1"]], GREEDY)
    tables, hit = hit_block_tables(llm, prompts()["P3"])
    assert hit == 256
    if poison:
        poison_rows(llm, tables, *poison)
    out = llm.generate([prompts()["P3"]], GREEDY)
    assert llm.stats.cached_tokens == 256
    return out[0]["token_ids"], torch.stack(out[0]["logits"])


@pytest.fixture(scope="module")
def clean():
    return run_p3()


READ = {
    "c4 state, last 4 tokens, first series": (1, "attn_state", range(252, 256), FIRST_HALF),
    "indexer state, last 4 tokens, first series": (
        1,
        "idx_state",
        range(252, 256),
        IDX_FIRST_HALF,
    ),
    "window rows 241..255": (0, "swa", range(241, 256), None),
    "window row 241 only": (1, "swa", [241], None),
    "c128 entries 0 and 1": (2, "attn", [0, 1], None),
}
NOT_READ = {
    "c4 state, last 4 tokens, second series": (1, "attn_state", range(252, 256), SECOND_HALF),
    "c4 state, tokens 248..251": (1, "attn_state", range(248, 252), None),
    "indexer state, tokens 248..251": (3, "idx_state", range(248, 252), None),
    "c128 state, tokens 128..255": (2, "attn_state", range(128, 256), None),
    "window rows 192..240": (0, "swa", range(192, 241), None),
}


@pytest.mark.parametrize("case", sorted(READ))
def test_rows_the_hit_reads_change_the_output(clean, case):
    tokens, logits = run_p3(READ[case])
    assert not torch.equal(logits, clean[1])
    if "indexer" not in case:  # a NaN indexer key only changes which entries are picked
        assert torch.isnan(logits).any()


@pytest.mark.parametrize("case", sorted(NOT_READ))
def test_rows_the_hit_never_reads_change_nothing(clean, case):
    tokens, logits = run_p3(NOT_READ[case])
    assert tokens == clean[0]
    assert torch.equal(logits, clean[1])


def test_bad_poison_arguments():
    from refimpl.v4.llm import V4LLM

    llm = V4LLM(model_dir("A"), hf_model=hf_model("A"), num_kvcache_blocks=16)
    with pytest.raises(ValueError, match="kind"):
        poison_rows(llm, ((),), 0, "kv", [0])
    with pytest.raises(ValueError, match="no attn"):
        poison_rows(llm, ((),), 0, "attn", [0])


def test_reads_are_recorded_from_outside_the_engine():
    """`recording_reads` wraps the runner's public `prepare_inputs` for the block only: the
    sliding-window layer 0 of a 9-token prompt reads exactly the rows of positions 0..8 (a
    window of 16 covers them all), and afterwards the runner is the class's own again."""
    from refimpl.course.v4_overwrite import recording_reads
    from refimpl.v4.cache import row_slots
    from refimpl.v4.llm import V4LLM

    llm = V4LLM(model_dir("A"), hf_model=hf_model("A"), num_kvcache_blocks=32)
    runner = llm.model_runner
    req = llm.add_request(list(range(10, 19)), GREEDY)
    with recording_reads(runner) as log:
        with pytest.raises(ValueError, match="already being recorded"):
            with recording_reads(runner):
                pass
        llm.step()
    assert "prepare_inputs" not in vars(runner)
    swa = runner.kv_cache.layers[0].swa
    table = llm.scheduler.kv_cache_manager.get_block_ids(req.request_id)[swa.group]
    assert log.slots_read(swa.name) == set(row_slots(swa, table, range(9)).tolist())
    recorded = len(log.reads)
    llm.step()  # not recorded any more
    assert len(log.reads) == recorded > 0
