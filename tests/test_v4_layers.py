"""One layer at a time against transformers: the cache rows, random chunkings, the tie trap.

The paged layer gets exactly the input transformers' layer received (captured by a hook), so
any difference is the cache logic's. In one chunk (and in 64-token chunks) the rows equal
transformers' cache fields bit for bit: the sliding-window keys, every compressed entry, the
unfinished window's buffer and the ratio-4 overlap state. Under arbitrary chunkings a float32
matmul over 3 rows may round differently from one over 270, so there the check is 1e-5.
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refimpl.course.v4_layer_checks import (
    capture_layer_inputs,
    paged_rows,
    run_layer_paged,
    transformers_rows,
)
from refimpl.v4.topk import stable_topk, stable_topk_in_transformers
from tests.v4_models import CONFIGS, hf_model, one_thread, prompts  # noqa: F401  (autouse fixture)

NUM_TOKENS = 270  # two HCA windows, 67 CSA entries, 2 tokens of an unfinished window


@functools.cache
def captured(name: str):
    return capture_layer_inputs(hf_model(name), prompts()["P1"][:NUM_TOKENS])


def layer_info(name: str, layer: int):
    model = hf_model(name)
    comp = model.model.layers[layer].self_attn.compressor
    ratio = CONFIGS[name]["compress_ratios"][layer]
    bias, dims = {}, {}
    if comp is not None:
        bias["compressor"], dims["compressor"] = comp.position_bias, comp.head_dim
        if ratio == 4:
            bias["indexer"], dims["indexer"] = (
                comp.indexer.position_bias,
                comp.indexer.head_dim,
            )
    return ratio, bias, dims


def compare(name: str, layer: int, chunks: list[int], exact: bool) -> None:
    model = hf_model(name)
    inputs, cache, outputs = captured(name)
    out, kv = run_layer_paged(model, layer, inputs[layer], chunks)
    ratio, bias, dims = layer_info(name, layer)
    theirs = transformers_rows(cache, layer, ratio, NUM_TOKENS, bias)
    mine = paged_rows(kv, layer, ratio, NUM_TOKENS, model.config.sliding_window, dims)
    assert set(theirs) == set(mine)
    if ratio == 4:
        assert {"compressor.overlap", "indexer.overlap", "indexer.entries"} <= set(theirs)
    for key in theirs:
        assert theirs[key].shape == mine[key].shape, key
        if exact:
            assert torch.equal(theirs[key], mine[key]), f"{name} layer {layer} {key}"
        else:
            torch.testing.assert_close(mine[key], theirs[key], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, outputs[layer], atol=1e-5, rtol=1e-5)


ALL_LAYERS = [
    (name, layer)
    for name in sorted(CONFIGS)
    for layer in range(len(CONFIGS[name]["compress_ratios"]))
]


@pytest.mark.parametrize("name,layer", ALL_LAYERS)
@pytest.mark.parametrize(
    "chunks", [[NUM_TOKENS], [64, 64, 64, 64, 14]], ids=["one-shot", "64-chunks"]
)
def test_cache_rows_equal_transformers_bit_for_bit(name, layer, chunks):
    compare(name, layer, chunks, exact=True)


@pytest.mark.parametrize("name,layer", [("A", 1), ("A", 2), ("B", 0), ("C", 0)])
@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_chunkings_and_decode(name, layer, data):
    """Any split of the 270 tokens into chunks, ending with single-token decode steps."""
    decode = data.draw(st.integers(0, 6), label="decode steps")
    cuts = data.draw(
        st.lists(st.integers(1, NUM_TOKENS - decode - 1), max_size=5, unique=True),
        label="cuts",
    )
    bounds = [0] + sorted(cuts) + [NUM_TOKENS - decode]
    chunks = [b - a for a, b in zip(bounds, bounds[1:]) if b > a] + [1] * decode
    compare(name, layer, chunks, exact=False)


def test_torch_topk_breaks_ties_by_row_length():
    """The trap: with all-equal scores torch.topk's picks depend on the row length (torch 2.x
    CPU).

    A query that sees 12 entries in a one-shot prefill sees 16 in a later cached step; the
    first 12 scores are the same, yet the picks differ. stable_topk always keeps 0, 1, 2.
    """
    short, long = torch.zeros(12), torch.zeros(16)
    picks_short = set(torch.topk(short, 3).indices.tolist())
    picks_long = set(torch.topk(long, 3).indices.tolist())
    assert picks_short != picks_long
    assert stable_topk(short, 3).tolist() == stable_topk(long, 3).tolist() == [0, 1, 2]
    scores = torch.tensor([[0.5, 0.0, 0.5, 0.0, 0.9]])
    assert stable_topk(scores, 3).tolist() == [[4, 0, 2]]
    with stable_topk_in_transformers():
        assert torch.zeros(16).topk(3).indices.tolist() == [0, 1, 2]
    assert set(torch.zeros(16).topk(3).indices.tolist()) == picks_long  # restored afterwards


def test_transformers_cached_generate_disagrees_with_itself_without_the_stable_rule(tmp_path):
    """One indexer head: many scores are exactly 0.0, and transformers' cached generate() and a
    full recompute of the same sequence pick different tied entries (logits off by ~0.7);
    with the stable top-k on both they agree to float rounding."""
    from refimpl.v4.loader import load_hf_model
    from refimpl.v4.oracle import cached_vs_recompute
    from refimpl.v4.tiny import make_tiny_v4

    make_tiny_v4(tmp_path, seed=0, index_n_heads=1, compress_ratios=(4,), index_topk=2)
    model = load_hf_model(str(tmp_path))
    prompt = torch.randint(0, 256, (30,), generator=torch.Generator().manual_seed(0)).tolist()
    assert cached_vs_recompute(model, prompt, 8, stable=False) > 0.1
    assert cached_vs_recompute(model, prompt, 8, stable=True) < 1e-4
